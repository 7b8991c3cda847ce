"""OpenAI's Responses API as pure functions: :mod:`._api` is the whole of it in one place
(a body in: :mod:`._request`, with its items, tools and fields; an answer and its stream
out: :mod:`._answer`, :mod:`._stream`). Of ``shapes``, it imports only
:mod:`sluice.shapes._common`; never the Messages API's shapes."""
