"""Other APIs' request and answer shapes, as pure functions.

sluice's common request is OpenAI's Chat Completions shape (``Request.messages`` and
``Request.params``). ``sluice serve`` also speaks Anthropic's Messages API and OpenAI's
Responses API: a body in either shape is read into a :class:`~._common.ChatView` (the
common shape, and what of the body it cannot carry), and answers and streams are written
back in the client's shape. Nothing here does I/O.
"""
