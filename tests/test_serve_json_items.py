"""The piecewise JSON scan behind Message Batches: the items it hands over are the items
orjson finds in the whole document, wherever the chunks happen to split it."""

from __future__ import annotations

import io
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.serve.message_batches._json_items import ItemTooLarge, JsonScan, NotJson

_TEXT = st.text(alphabet=st.sampled_from('ab"\\,[]{}: \n\té\u2028'), max_size=12)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _scan(document: bytes, chunk: int, max_bytes: int = 1 << 20) -> tuple[list[str], list[Any]]:
    scan = JsonScan(io.BytesIO(document), chunk)
    scan.take(b"{")
    keys, items = [], []
    while scan.peek() != b"}":
        if keys:
            scan.take(b",")
        keys.append(scan.key())
        items.append([orjson.loads(raw) for raw in scan.items(max_bytes)])
    scan.take(b"}")
    assert scan.peek() == b""
    return keys, items


@settings(max_examples=200, deadline=None)
@given(items=st.lists(_VALUES, max_size=6), chunk=st.integers(1, 9), indent=st.sampled_from([None, 1]))
def test_the_items_are_those_of_the_whole_document_however_it_is_chunked(
    items: list[Any], chunk: int, indent: int | None
) -> None:
    document = json.dumps({"requests": items, "more": []}, indent=indent, ensure_ascii=False).encode()
    keys, found = _scan(document, chunk)
    assert keys == ["requests", "more"]
    assert found == [orjson.loads(orjson.dumps(items)), []]


def test_an_item_longer_than_allowed_is_not_read_further_and_broken_json_is_said() -> None:
    long = b'{"requests": [{"a": "' + b"x" * 5000 + b'"}]}'
    with pytest.raises(ItemTooLarge):
        _scan(long, 512, max_bytes=1000)
    for broken in (b'{"requests": [1, 2', b'{"requests": [1 2]}', b'{"requests": ["open]}', b'{"requests" [1]}'):
        with pytest.raises((NotJson, orjson.JSONDecodeError)):
            _scan(broken, 4)
