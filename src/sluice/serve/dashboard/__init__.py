"""``/dashboard``: the operator's live page (``_live``: the server's state now, its last ten
minutes, its last errors), behind the admin key and a login that slows a guesser
(``_backoff``); its HTML is package data beside it. Imports only ``core``."""
