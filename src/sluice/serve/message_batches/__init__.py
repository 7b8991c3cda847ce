"""Anthropic's ``/v1/messages/batches``: a Message Batch is read (``_check``, ``_json_items``)
into a file of requests and run as an internal batch of ``batches``. Imports ``core``,
``files``, ``batches`` and ``messages``."""
