"""Anthropic's Messages API as pure functions: a body in (:mod:`._in`, with its content and
tools), an answer and its stream out (:mod:`._out`, :mod:`._events`), its errors
(:mod:`._errors`). Of ``shapes``, it imports only :mod:`sluice.shapes._common` and
:mod:`sluice.shapes._fields`; never the Responses API's shapes."""
