"""A batch's input file checked as OpenAI checks it while the batch is ``validating``.

OpenAI accepts any JSONL upload (of chat, embeddings or Responses requests), then fails
the *batch* (``status: failed``, nothing sent, nothing billed) when a line is not a
request it can run: not JSON, no
``custom_id``, a ``custom_id`` used twice, a ``url`` other than the batch's endpoint, no
``body`` or no ``body.model``. ``errors.data`` lists each such line with ``code``,
``line``, ``message`` and ``param`` (its documented codes: ``invalid_json_line``,
``duplicate_custom_id``, ``url_mismatch``, ``empty_file``, ``too_many_tasks``). What is
wrong *inside* a body (empty messages, a bad ``max_tokens``) is left to the request: that
line fails alone in the error file, as a request the provider refused would.

Runs in a thread: a 200 MB file takes seconds to parse.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import _json

__all__ = ["FileCheck", "check_batch_lines"]

#: Lines listed in ``errors.data`` at most; the last entry says how many more there were.
MAX_LISTED = 100
_URLS = {
    "/v1/chat/completions": ("/v1/chat/completions", "/chat/completions"),
    "/v1/embeddings": ("/v1/embeddings", "/embeddings"),
    "/v1/responses": ("/v1/responses", "/responses"),
    "/v1/messages": ("/v1/messages",),  # a Message Batch's own file (see ``message_batches._message_batches``)
}


@dataclass(slots=True)
class FileCheck:
    """What validation found: the errors (``errors.data`` entries), the requests counted,
    and the model the first line names (the batch's ``model``, as OpenAI reports it)."""

    errors: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    model: str | None = None
    more: int = 0

    def add(self, code: str, line: int | None, message: str, param: str | None = None) -> None:
        if len(self.errors) < MAX_LISTED:
            self.errors.append({"code": code, "line": line, "message": message, "param": param})
        else:
            self.more += 1

    def data(self) -> list[dict[str, Any]]:
        """``errors.data``, with a last entry counting the lines not listed."""
        if not self.more:
            return self.errors
        return [
            *self.errors,
            {
                "code": "too_many_errors",
                "line": None,
                "message": f"and {self.more:,} more lines with errors",
                "param": None,
            },
        ]


def _lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    with path.open("rb") as f:
        number = 0
        while raw := f.readline(max_line_bytes + 1):
            number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(1 << 20)
                yield number, None
                continue
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if raw.strip():
                yield number, raw


def check_batch_lines(
    path: Path, endpoint: str, *, max_requests: int, max_line_bytes: int, max_values: int = 1_000_000
) -> FileCheck:
    """Every line of ``path`` checked as a request of a batch for ``endpoint``; a line of
    more than ``max_values`` JSON values is not parsed (8 MB of ``{},`` would be 200 MB of objects)."""
    check = FileCheck()
    seen: set[str] = set()
    urls = _URLS.get(endpoint, (endpoint,))
    for number, raw in _lines(path, max_line_bytes):
        check.requests += 1
        if raw is None:
            check.add("invalid_json_line", number, f"This line is longer than {max_line_bytes:,} bytes.")
            continue
        if _json.most_values(raw) > max_values:
            check.add("invalid_json_line", number, f"This line holds more than {max_values:,} JSON values and keys.")
            continue
        try:
            record = _json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            check.add("invalid_json_line", number, "This line is not parseable as valid JSON.")
            continue
        if not isinstance(record, dict):
            check.add("invalid_json_line", number, "This line is not a JSON object: each line is one request.")
            continue
        _check_request(check, number, record, urls, endpoint, seen)
    if check.requests == 0:
        check.add("empty_file", None, "The input file holds no requests.")
    elif check.requests > max_requests:
        check.add(
            "too_many_tasks",
            None,
            f"The input file holds {check.requests:,} requests; a batch takes at most {max_requests:,}: split it.",
        )
    return check


def _check_request(
    check: FileCheck, number: int, record: dict[str, Any], urls: tuple[str, ...], endpoint: str, seen: set[str]
) -> None:
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        what = "Missing required parameter" if custom_id is None else "Invalid type for"
        check.add("missing_required_parameter", number, f"{what}: 'custom_id' (a non-empty string).", "custom_id")
    elif custom_id in seen:
        check.add(
            "duplicate_custom_id",
            number,
            f"The custom_id {custom_id[:100]!r} is used by an earlier line; each request needs its own.",
            "custom_id",
        )
    else:
        seen.add(custom_id)
    method = record.get("method")
    if method != "POST":
        what = "Missing required parameter: 'method'" if method is None else f"Invalid method {str(method)[:20]!r}"
        check.add("invalid_request", number, f"{what}; a batch request's method is 'POST'.", "method")
    url = record.get("url")
    if url not in urls:
        check.add(
            "url_mismatch",
            number,
            f"The url {str(url)[:100]!r} does not match the batch's endpoint {endpoint!r}.",
            "url",
        )
    body = record.get("body")
    if not isinstance(body, dict):
        what = "Missing required parameter" if body is None else "Invalid type for"
        check.add("missing_required_parameter", number, f"{what}: 'body' (the request, a JSON object).", "body")
        return
    model = body.get("model")
    if not isinstance(model, str) or not model:
        check.add("missing_required_parameter", number, "Missing required parameter: 'body.model'.", "body.model")
    elif check.model is None:
        check.model = model
