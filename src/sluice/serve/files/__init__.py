"""``/v1/files``, and the state the batch APIs keep beside the files: the database of files and
batches (``_db``), the context the handlers share (``_ctx``), uploads within quotas
(``_uploads``) and expiry (``_expiry``). Imports only ``core``."""
