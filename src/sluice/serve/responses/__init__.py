"""OpenAI's ``/v1/responses``: a Responses body answered as chat (``chat``), and the stored
responses a later ``previous_response_id`` continues (``_db``). Imports ``core`` and ``chat``."""
