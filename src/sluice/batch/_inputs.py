"""Input files as a stream of requests, one bad record never stopping the rest.

Three shapes, one per line (or row):

* a chat-completion body: ``{"messages": [...], "model": ..., "max_tokens": ...}`` (a
  ``custom_id`` in it, or in a bare body of another API, is the line's id, as a Batch
  API line's is, and is not sent);
* an OpenAI Batch API line: ``{"custom_id", "method": "POST", "url": "/v1/chat/completions",
  "body": {...}}``, so existing batch files run unchanged;
* a row of fields (CSV, or JSONL objects) turned into a prompt by ``--template``;
* embeddings: a Batch API line with ``"url": "/v1/embeddings"``, or a row whose
  ``--embed FIELD`` is embedded (an :class:`~._embed_inputs.EmbeddingInput`).

Every record becomes an :class:`InputItem` holding a Request, an EmbeddingInput, or an
:class:`~sluice.InvalidInputError` that names the line and says what is wrong. The file
is read in binary a line at a time with a length cap, so a huge or endless line cannot
exhaust memory and a stray non-UTF-8 byte spoils only its own line. A UTF-8 byte order
mark (as Excel and Windows editors write) is skipped.

``--model`` fills in the model of records that name none; a record's own model is kept
(and reported in :attr:`InputItem.own_model` when it differs from ``--model``, so the
runner can say so) unless ``--force-model`` sends every record to ``--model``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import string
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from .. import _json
from .._errors import InvalidInputError, InvalidRequestError, SluiceError
from .._models import Request, seal
from ..structured import Schema, schema_from_response_format
from ._embed_inputs import EMBEDDING_URLS, EmbeddingInput, embedding_from_body, embedding_from_row
from ._native_inputs import NATIVE_URLS, native_api_of, native_view, with_native
from ._offsets import LineOffsets

__all__ = [
    "EMBEDDING_IN_CHAT_JOB",
    "InputItem",
    "InputOptions",
    "Template",
    "count_records",
    "detect_format",
    "embeds",
    "jsonl_item",
    "jsonl_offsets",
    "read_inputs",
    "read_jsonl_at",
    "record_item",
    "request_of",
]

EMBEDDING_IN_CHAT_JOB = (
    "an embeddings request in a job of chat requests (its first request is one); "
    "run embeddings from a file of their own"
)

Format = Literal["auto", "jsonl", "csv"]

#: Fields of a chat body that sluice reads itself; everything else passes through.
_OWN_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "id", "metadata")
_BATCH_URLS = ("/v1/chat/completions", "/chat/completions")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class InputItem:
    """One record of the input: a request, or why it could not be one."""

    line: int
    request: Request | None = None
    error: InvalidInputError | None = None
    custom_id: str | None = None
    #: The model the record named when that differs from ``--model`` and was kept (not
    #: forced): the runner counts these to warn that ``--model`` did not apply to them.
    own_model: str | None = None
    #: Texts to embed (a ``/v1/embeddings`` line, or a row under ``--embed``), instead of
    #: a chat request.
    embedding: EmbeddingInput | None = None


class Template:
    """A prompt built from a row's fields: ``"Summarise {name}: {description}"``.

    Only plain field names are allowed (no ``{x.attr}`` or ``{x[0]}``), so a template
    cannot reach into Python objects.
    """

    def __init__(self, text: str) -> None:
        if not text.strip():
            raise InvalidInputError("--template is empty")
        fields: list[str] = []
        try:
            for _, name, spec, conversion in string.Formatter().parse(text):
                if name is None:
                    continue
                if not name or any(c in name for c in ".[]") or name.isdigit():
                    raise InvalidInputError(
                        f"--template field {{{name}}} must be a column name (no positions, dots or brackets)"
                    )
                if spec or conversion:
                    raise InvalidInputError(f"--template field {{{name}}} takes no format spec or conversion")
                fields.append(name)
        except ValueError as exc:
            raise InvalidInputError(f"--template is not a valid template: {exc}") from None
        if not fields:
            raise InvalidInputError("--template has no {column} fields; every row would ask the same thing")
        self.text = text
        self.fields = tuple(dict.fromkeys(fields))

    def render(self, row: Mapping[str, Any], where: str) -> str:
        missing = [f for f in self.fields if f not in row or row[f] is None]
        if missing:
            have = ", ".join(str(k) for k in row if k is not None) or "none"
            raise InvalidInputError(f"{where}: no value for {{{missing[0]}}} (fields: {have})")
        return self.text.format_map({f: _text(row[f]) for f in self.fields})


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class InputOptions:
    """How to turn records into requests."""

    model: str | None = None  # --model: for records that name none
    default_model: str | None = None  # the config's model: the same, at lower precedence
    force_model: bool = False  # --force-model: every record goes to ``model``, whatever it names
    template: Template | None = None
    system: str | None = None
    id_field: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    format: Format = "auto"
    max_line_bytes: int = 8 * 1024 * 1024
    embed_field: str | None = None  # --embed: embed this field of each row
    schema: Schema | None = None  # --schema: the answer's shape, for lines that give none
    #: A line's ``response_format`` with a schema is its schema (validated, re-asked); off,
    #: it goes to the provider untouched (``sluice serve`` without ``validate_json``).
    line_schemas: bool = True


def detect_format(path: Path, requested: Format) -> Literal["jsonl", "csv"]:
    if requested != "auto":
        return requested
    return "csv" if path.suffix.lower() in (".csv", ".tsv") else "jsonl"


def read_inputs(
    path: Path, options: InputOptions, only: Container[int] | None = None, offsets: LineOffsets | None = None
) -> Iterator[InputItem]:
    """Every record of ``path`` in order (``only``: the records of those numbers, the rest
    skipped unparsed); the file is streamed, never loaded whole. ``offsets``: a whole
    reading notes where lines start, and a reading of ``only`` (a set) seeks by them to
    its first line and stops after its last (JSONL)."""
    if detect_format(path, options.format) == "csv":
        yield from _read_csv(path, options, only)
    else:
        yield from _read_jsonl(path, options, only, offsets)


def embeds(path: Path, options: InputOptions) -> bool:
    """Whether a job over ``path`` embeds texts (``--embed``, or its first request is an
    embeddings line); its other kind of line is then refused, one endpoint per file as in
    OpenAI's Batch API."""
    if options.embed_field is not None:
        return True
    for item in read_inputs(path, options):
        if item.request is not None or item.embedding is not None:
            return item.embedding is not None
    return False


def request_of(item: InputItem, cache: bool) -> Request:
    """The request a chat line makes, sealed (its key is needed twice: by the engine and for
    ``request_hash``). With ``--no-cache`` it is keyed by its line, so identical lines are
    not shared."""
    assert item.request is not None
    if cache or item.request.id is not None:
        return seal(item.request)
    return dataclasses.replace(item.request, id=f"line-{item.line}")


def count_records(path: Path, options: InputOptions) -> int:
    """How many records the file holds, for progress and ETA (a quick pass, bounded memory)."""
    if detect_format(path, options.format) == "csv":
        csv.field_size_limit(options.max_line_bytes)
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as f:
            try:
                rows = sum(1 for row in csv.reader(f) if any(v.strip() for v in row))
            except csv.Error:  # a broken row: the job reports it; count lines instead
                f.seek(0)
                rows = sum(1 for line in f if line.strip())
        return max(0, rows - 1)
    with path.open("rb") as f:
        return sum(1 for _, raw in _lines(f, options.max_line_bytes) if raw is None or raw.strip())


# -- JSONL ---------------------------------------------------------------------------------


def _lines(
    f: BinaryIO, limit: int, number: int = 0, offsets: LineOffsets | None = None
) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) per line (from line ``number + 1``, where ``f`` is); None for a
    line over ``limit`` bytes (skipped whole). ``offsets``: told where lines start."""
    while True:
        if offsets is not None:
            offsets.passing(number, f.tell())
        raw = f.readline(limit + 1)
        if not raw:
            return
        number += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # drain the rest of the huge line
                raw = f.readline(1 << 20)
            yield number, None
            continue
        yield number, raw[len(_BOM) :] if number == 1 and raw.startswith(_BOM) else raw


def _read_jsonl(
    path: Path, options: InputOptions, only: Container[int] | None, offsets: LineOffsets | None = None
) -> Iterator[InputItem]:
    with path.open("rb") as f:
        start, last = 0, None
        if offsets is not None and isinstance(only, (set, frozenset)) and only:
            start, at = offsets.before(min(only))
            last = max(only)
            f.seek(at)
        for number, raw in _lines(f, options.max_line_bytes, start, offsets if only is None else None):
            if last is not None and number > last:
                return
            if only is not None and number not in only:
                continue
            item = _jsonl_item(number, raw, options)
            if item is not None:
                yield item


def _jsonl_item(number: int, raw: bytes | None, options: InputOptions) -> InputItem | None:
    """One JSONL line's item (None: a blank line, which is no record)."""
    where = f"line {number}"
    if raw is None:
        return _bad(number, f"{where} is longer than {options.max_line_bytes:,} bytes")
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _bad(number, f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")
    try:
        record = _json.loads(text)
    except ValueError as exc:
        return _bad(number, f"{where}: not valid JSON ({exc})")
    return _item(record, number, where, options)


def jsonl_offsets(path: Path, options: InputOptions) -> Iterator[tuple[int, int, bytes | None]]:
    """(line number, byte offset, bytes) of each line of a JSONL input, for reading lines
    again out of order (:func:`read_jsonl_at`); None for a line over the length cap."""
    with path.open("rb") as f:
        offset = 0
        for number, raw in _lines(f, options.max_line_bytes):
            yield number, offset, raw
            offset = f.tell()


def jsonl_item(number: int, raw: bytes | None, options: InputOptions) -> InputItem | None:
    """The item of one JSONL line read by :func:`jsonl_offsets` (None: a blank line)."""
    return _jsonl_item(number, raw, options)


def read_jsonl_at(path: Path, options: InputOptions, lines: Iterable[tuple[int, int]]) -> Iterator[InputItem]:
    """The items of ``lines`` ((line number, byte offset) pairs from :func:`jsonl_offsets`),
    in the order given: each read where it starts."""
    with path.open("rb") as f:
        for number, offset in lines:
            f.seek(offset)
            raw = f.readline(options.max_line_bytes + 1)
            if len(raw) > options.max_line_bytes and not raw.endswith(b"\n"):
                item = _jsonl_item(number, None, options)
            else:
                item = _jsonl_item(number, raw[len(_BOM) :] if number == 1 and raw.startswith(_BOM) else raw, options)
            if item is not None:
                yield item


def record_item(record: Any, number: int, where: str, options: InputOptions) -> InputItem:
    """One record not read from a file (a dataframe's row, made a JSON object) as a line is."""
    return _item(record, number, where, options)


def _item(record: Any, number: int, where: str, options: InputOptions, *, row: bool = False) -> InputItem:
    if not isinstance(record, dict):
        return _bad(number, f"{where}: expected a JSON object, got {type(record).__name__}")
    custom_id = record.get("custom_id") if "body" in record and not row else None
    own_model = None
    try:
        asked: Request | EmbeddingInput
        if _bare_with_id(record, options, row=row):  # a body with the id a Batch API line would wrap it with
            custom_id = _line_id(record, where)
            record = {k: v for k, v in record.items() if k != "custom_id"}  # not a field of any API
        if options.embed_field is not None:
            asked = embedding_from_row(record, where, options)
        elif row:
            asked = _from_row(record, where, options)
        elif "body" in record and "custom_id" in record:
            asked = _from_batch_line(record, where, options)
        elif "params" in record and "custom_id" in record and isinstance(record["params"], dict):
            asked = _from_native(record["params"], "anthropic", where, options, request_id=_line_id(record, where))
        elif options.template is None and native_api_of(record) is not None:
            asked = _from_native(record, native_api_of(record) or "", where, options, request_id=custom_id)
        elif options.template is not None:
            asked = _from_row(record, where, options)
        elif "messages" in record:
            asked = _from_chat_body(record, where, options, request_id=custom_id)
        else:
            raise InvalidInputError(
                f"{where}: expected a chat request ('messages'), an OpenAI Batch API line "
                "('custom_id' and 'body'), a Responses body ('input'), an Anthropic Message Batches "
                "request ('custom_id' and 'params'), or give --template to build prompts from its fields"
            )
    except Exception as exc:  # whatever is wrong with one record stays with that record
        text = exc.message if isinstance(exc, SluiceError) else f"{type(exc).__name__}: {exc}"
        message = text if text.startswith(where) else f"{where}: {text}"
        return InputItem(number, error=InvalidInputError(message, line=number), custom_id=_str_or_none(custom_id))
    if not row and options.embed_field is None and options.model is not None and not options.force_model:
        own_model = _differs(asked.model, options.model)
    if isinstance(asked, EmbeddingInput):
        return InputItem(number, embedding=asked, custom_id=_str_or_none(custom_id), own_model=own_model)
    return InputItem(number, request=asked, custom_id=_str_or_none(custom_id), own_model=own_model)


def _differs(kept: str, given: str) -> str | None:
    """``kept`` when it names another model than ``given`` (a bare name is openai's)."""

    def norm(model: str) -> str:
        return model if "/" in model else f"openai/{model}"

    return kept if norm(kept) != norm(given) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _bad(number: int, message: str) -> InputItem:
    return InputItem(number, error=InvalidInputError(message, line=number))


def _bare_with_id(record: Mapping[str, Any], options: InputOptions, *, row: bool) -> bool:
    """A bare request body (no Batch API ``body`` or ``params`` around it) carrying a
    ``custom_id``: the line's id, as in a Batch API line (not a field data rows use)."""
    if row or options.template is not None or options.embed_field is not None:
        return False
    return "custom_id" in record and "body" not in record and "params" not in record


def _line_id(record: Mapping[str, Any], where: str) -> str:
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise InvalidInputError(f"{where}: custom_id must be a non-empty string")
    return custom_id


def _from_batch_line(record: Mapping[str, Any], where: str, options: InputOptions) -> Request | EmbeddingInput:
    custom_id = _line_id(record, where)
    method = record.get("method", "POST")
    if method != "POST":
        raise InvalidInputError(f"{where}: method must be POST, got {method!r}")
    url = record.get("url", "/v1/chat/completions")
    if url not in _BATCH_URLS and url not in EMBEDDING_URLS and url not in NATIVE_URLS:
        raise InvalidInputError(
            f"{where}: only /v1/chat/completions, /v1/responses, /v1/messages and /v1/embeddings are supported, "
            f"got url {url!r}"
        )
    body = record.get("body")
    if not isinstance(body, dict):
        raise InvalidInputError(f"{where}: body must be a JSON object")
    if url in EMBEDDING_URLS:
        return embedding_from_body(body, where, options, request_id=custom_id)
    if url in NATIVE_URLS:
        return _from_native(body, NATIVE_URLS[url], where, options, request_id=custom_id)
    return _from_chat_body(body, where, options, request_id=custom_id)


def _from_native(
    body: Mapping[str, Any], api: str, where: str, options: InputOptions, *, request_id: str | None
) -> Request:
    """A line written for Anthropic's Messages or OpenAI's Responses (see ``_native_inputs``)."""
    view = native_view(body, api, where, schema=options.schema is not None, max_tokens=options.max_tokens)
    chat = {**view.body, "model": body.get("model")}
    if "metadata" in body and isinstance(body["metadata"], dict) and api == "responses":
        chat["metadata"] = body["metadata"]
    request = _from_chat_body(chat, where, dataclasses.replace(options, line_schemas=False), request_id=request_id)
    return with_native(
        request, body, api, view, max_tokens=options.max_tokens, temperature=options.temperature, system=options.system
    )


def _from_chat_body(body: Mapping[str, Any], where: str, options: InputOptions, *, request_id: str | None) -> Request:
    if body.get("stream"):
        raise InvalidInputError(f"{where}: 'stream' is not supported in a batch job; remove it")
    own = body.get("model") or None  # "" or null: the record names no model
    if options.force_model:
        own = None
    elif own is not None and not isinstance(own, str):
        raise InvalidInputError(f"{where}: model must be a string, got {own!r}")
    model = own or options.model or options.default_model
    if not model:
        raise InvalidInputError(f"{where}: no model; give --model or a 'model' field")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if options.max_tokens is not None:
        max_tokens = options.max_tokens
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InvalidInputError(f"{where}: metadata must be a JSON object")
    own_id = body.get("id") if request_id is None else request_id
    if own_id is not None and not isinstance(own_id, str):
        own_id = str(own_id)
    params = {k: v for k, v in body.items() if k not in _OWN_FIELDS and k != "stream"}
    schema = _schema_of(params, where) if options.line_schemas else None
    if schema is None and "response_format" not in params:  # a line's own "text" format stays its own
        schema = options.schema
    temperature = body.get("temperature") if options.temperature is None else options.temperature
    return Request(
        model=model,
        messages=_with_system(body.get("messages"), options.system),
        max_tokens=max_tokens,
        temperature=temperature,
        params=params,
        id=own_id,
        metadata=metadata,
        schema=schema,
    )


def _schema_of(params: dict[str, Any], where: str) -> Schema | None:
    """A line's own ``response_format`` (as OpenAI writes it) as its schema, taken out of
    the params: sluice asks each provider for it in its own way, and validates the answer."""
    if "response_format" not in params or "tools" in params or "functions" in params:
        return None  # with tools the answer may be a call: the format goes to the provider as given
    try:
        schema = schema_from_response_format(params["response_format"], "response_format")
    except InvalidRequestError as exc:
        raise InvalidInputError(f"{where}: {exc.message}") from None
    if schema is not None:
        del params["response_format"]
    return schema


def _with_system(messages: Any, system: str | None) -> Any:
    if system is None or not isinstance(messages, list):
        return messages
    return [{"role": "system", "content": system}, *messages]


def _from_row(row: Mapping[str, Any], where: str, options: InputOptions) -> Request:
    assert options.template is not None
    prompt = options.template.render(row, where)
    model = options.model or options.default_model
    if not model:
        raise InvalidInputError(f"{where}: no model; give --model")
    row_id = None
    if options.id_field is not None:
        value = row.get(options.id_field)
        if value is None or value == "":
            raise InvalidInputError(f"{where}: no value in id field {options.id_field!r}")
        row_id = _text(value)
    return Request(
        model=model,
        messages=_with_system([{"role": "user", "content": prompt}], options.system),
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        id=row_id,
        metadata={k: v for k, v in row.items() if k is not None},
        schema=options.schema,
    )


# -- CSV -----------------------------------------------------------------------------------


def _read_csv(path: Path, options: InputOptions, only: Container[int] | None) -> Iterator[InputItem]:
    if options.template is None and options.embed_field is None:
        raise InvalidInputError(
            f"{path}: a CSV input needs --template to build a prompt from its columns (or --embed FIELD)"
        )
    csv.field_size_limit(options.max_line_bytes)
    dialect: type[csv.Dialect] = csv.excel_tab if path.suffix.lower() == ".tsv" else csv.excel
    with path.open("rb") as binary:
        text = io.TextIOWrapper(binary, encoding="utf-8-sig", errors="surrogateescape", newline="")
        reader = csv.reader(text, dialect)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InvalidInputError(f"{path}: cannot read the CSV header: {exc}") from None
        if _has_surrogates(header):
            raise InvalidInputError(f"{path}: the CSV header is not valid UTF-8")
        columns = [c.strip() for c in header]
        if not any(columns) or len(set(columns)) != len(columns):
            raise InvalidInputError(f"{path}: the CSV header must name each column once, got {header!r}")
        row_number = 0
        while True:
            row_number += 1
            where = f"row {row_number} (line {reader.line_num + 1})"
            try:
                values = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield _bad(row_number, f"{where}: {exc}")
                continue
            if not any(v.strip() for v in values):
                row_number -= 1  # a blank row is not a record
                continue
            if only is not None and row_number not in only:
                continue
            if _has_surrogates(values):
                yield _bad(row_number, f"{where}: not valid UTF-8")
            elif len(values) != len(columns):
                yield _bad(row_number, f"{where}: has {len(values)} fields, the header has {len(columns)}")
            else:
                yield _item(dict(zip(columns, values, strict=True)), row_number, where, options, row=True)


def _has_surrogates(values: list[str]) -> bool:
    return any(any("\udc80" <= ch <= "\udcff" for ch in v) for v in values)
