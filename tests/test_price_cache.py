"""The price cache: a new process prices a model from the cache without importing
genai-prices, gets exactly what genai-prices says, and never trusts an entry that may no
longer be true (other data, another day, a tiered price, a custom snapshot, a damaged file).

Each lookup runs in a fresh interpreter: whether genai-prices is imported is the point,
and this test process has imported it already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sluice._price_cache import PriceCache

pytestmark = pytest.mark.timeout(120)

_LOOKUP = """
import json, sys
import sluice
from sluice._models import Usage
from sluice._pricing import Pricing

pricing = Pricing()
out = []
for model, base_url in json.loads(sys.argv[1]):
    deployment = sluice.Deployment(model, base_url=base_url, api_key="x")
    cost = pricing.cost(deployment, Usage(input_tokens=1_000, output_tokens=500, cached_input_tokens=200))
    worst = pricing.worst_case(deployment, 1_000, 500)
    out.append({"cost": cost, "worst": worst, "describe": pricing.describe(deployment)})
print(json.dumps({"imported": "genai_prices" in sys.modules, "prices": out}))
"""

MINI = ("openai/gpt-4o-mini", None)
#: An OpenAI-compatible server on loopback: priced by the provider prefix, once the URL
#: is known not to be a listed provider's (the patterns come from the cache too).
MINI_ON_LOOPBACK = ("openai/gpt-4o-mini", "http://127.0.0.1:8765/v1")
#: The provider's own URL: priced by URL.
MINI_BY_URL = ("openai/gpt-4o-mini", "https://api.openai.com/v1")
UNKNOWN = ("openai/no-such-model-anywhere", None)
TIERED = ("anthropic/claude-sonnet-4-5", None)


def _lookup(cache: Path, *deployments: tuple[str, str | None], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", _LOOKUP, json.dumps(deployments)],
        env={**_base_env(), "SLUICE_CACHE_DIR": str(cache), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "AZURE_"))}


def _cache_file(cache: Path) -> Path:
    return PriceCache(cache).path


def test_a_second_process_prices_from_the_cache_without_importing_genai_prices(tmp_path: Path) -> None:
    first = _lookup(tmp_path, MINI, MINI_ON_LOOPBACK, MINI_BY_URL, UNKNOWN)
    assert first["imported"] is True
    assert _cache_file(tmp_path).exists()

    second = _lookup(tmp_path, MINI, MINI_ON_LOOPBACK, MINI_BY_URL, UNKNOWN)
    assert second["imported"] is False
    assert second["prices"] == first["prices"]
    mini = second["prices"][0]
    # genai-prices' own figure for the same usage, computed here, in this process
    from genai_prices import Usage, calc_price

    expected = calc_price(
        Usage(input_tokens=1_000, output_tokens=500, cache_read_tokens=200), "gpt-4o-mini", provider_id="openai"
    )
    assert mini["cost"] == pytest.approx(float(expected.total_price), rel=1e-9)
    assert "genai-prices: openai/gpt-4o-mini" in mini["describe"]
    assert second["prices"][3]["cost"] is None
    assert "genai-prices has no 'no-such-model-anywhere'" in second["prices"][3]["describe"]


def test_a_tiered_price_is_never_served_from_the_cache(tmp_path: Path) -> None:
    first = _lookup(tmp_path, TIERED)
    second = _lookup(tmp_path, TIERED)
    assert first["prices"] == second["prices"]
    assert second["imported"] is True  # the library's exact calculation, every time
    assert second["prices"][0]["describe"].startswith("tiered")


@pytest.mark.parametrize(
    "damage",
    [
        "not json at all {",
        "[]",
        '{"source": 5, "entries": []}',
        "wrong rates",
        "negative rates",
        "patterns not a list",
    ],
)
def test_a_damaged_cache_file_is_looked_up_again_and_rewritten(tmp_path: Path, damage: str) -> None:
    good = _lookup(tmp_path, MINI, MINI_ON_LOOPBACK)
    path = _cache_file(tmp_path)
    contents = json.loads(path.read_text())
    key = next(iter(contents["entries"]))
    if damage == "wrong rates":
        contents["entries"][key] = {"rates": ["a", 1, None, None], "source": "x"}
        path.write_text(json.dumps(contents))
    elif damage == "negative rates":
        contents["entries"][key] = {"rates": [-1.0, 0.6, None, None], "source": "x"}
        path.write_text(json.dumps(contents))
    elif damage == "patterns not a list":
        contents["api_patterns"] = {"a": 1}
        path.write_text(json.dumps(contents))
    else:
        path.write_text(damage)

    again = _lookup(tmp_path, MINI, MINI_ON_LOOPBACK)
    assert again["prices"] == good["prices"]
    assert again["imported"] is True
    assert _lookup(tmp_path, MINI, MINI_ON_LOOPBACK)["imported"] is False  # mended


def test_an_entry_for_other_data_or_another_day_is_not_used(tmp_path: Path) -> None:
    good = _lookup(tmp_path, MINI)
    path = _cache_file(tmp_path)
    contents = json.loads(path.read_text())
    key = next(iter(contents["entries"]))
    contents["entries"][key] = {"rates": [99.0, 99.0, None, None], "source": "genai-prices: openai/gpt-4o-mini"}
    data, size, mtime, day = contents["source"].rsplit(":", 3)
    for stale in (f"{data}:{size}:{int(mtime) - 1}:{day}", f"{data}:{size}:{mtime}:2001-01-01"):
        path.write_text(json.dumps({**contents, "source": stale}))
        again = _lookup(tmp_path, MINI)
        assert again["imported"] is True
        assert again["prices"] == good["prices"]
    # and the same doctored entry under today's own source is used: the test can fail
    path.write_text(json.dumps({**contents, "source": f"{data}:{size}:{mtime}:{day}"}))
    assert _lookup(tmp_path, MINI)["prices"][0]["cost"] == pytest.approx((1_000 * 99 + 500 * 99) / 1e6)


def test_a_cache_that_cannot_be_written_only_means_the_live_lookup(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    first = _lookup(blocked / "cache", MINI)
    second = _lookup(blocked / "cache", MINI)
    assert first["prices"] == second["prices"]
    assert second["imported"] is True
    assert first["prices"][0]["cost"] is not None


_CUSTOM = """
import copy, json, sys
from decimal import Decimal
from genai_prices import data_snapshot
from genai_prices.data import providers
import sluice
from sluice._models import Usage
from sluice._pricing import Pricing

# a custom snapshot (as UpdatePrices sets one): gpt-4o-mini at $7 / $9 per Mtok
openai = next(p for p in providers if p.id == "openai")
mini = next(m for m in openai.models if m.id == "gpt-4o-mini")
price = copy.copy(mini.prices)
price.input_mtok, price.output_mtok, price.cache_read_mtok = Decimal(7), Decimal(9), None
custom_mini = copy.copy(mini)
custom_mini.prices = price
custom_openai = copy.copy(openai)
custom_openai.models = [custom_mini]
data_snapshot.set_custom_snapshot(data_snapshot.DataSnapshot(providers=[custom_openai], from_auto_update=True))
deployment = sluice.Deployment("openai/gpt-4o-mini", api_key="x")
print(json.dumps(Pricing().cost(deployment, Usage(input_tokens=1_000_000, output_tokens=1_000_000))))
"""


def test_a_custom_snapshot_is_obeyed_and_never_written_to_the_cache(tmp_path: Path) -> None:
    good = _lookup(tmp_path, MINI)  # today's bundled price is in the cache
    before = _cache_file(tmp_path).read_text()
    result = subprocess.run(
        [sys.executable, "-c", _CUSTOM],
        env={**_base_env(), "SLUICE_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == pytest.approx(16.0)  # the custom price, not the cached one
    assert _cache_file(tmp_path).read_text() == before
    assert _lookup(tmp_path, MINI)["prices"] == good["prices"]


@pytest.mark.parametrize(
    "base_url",
    [
        "https://user:sk-secret-in-url@myres.openai.azure.com",
        "https://myres.openai.azure.com/openai?api-key=sk-secret-in-url",
    ],
)
def test_a_url_holding_a_key_is_priced_but_never_kept_on_disk_nor_shown(tmp_path: Path, base_url: str) -> None:
    first = _lookup(tmp_path, ("azure/gpt-4o-mini", base_url), ("azure/no-such-model-anywhere", base_url))
    assert first["prices"][0]["cost"] is not None  # priced by the URL, as without the key
    assert "sk-secret-in-url" not in json.dumps(first)  # not in what describe() says
    assert "myres.openai.azure.com" in first["prices"][1]["describe"]
    cached = list(tmp_path.rglob("*"))
    assert all("sk-secret-in-url" not in path.read_text() for path in cached if path.is_file())
    # the same deployment without the key in its URL is kept: the test can see a write
    _lookup(tmp_path, ("azure/gpt-4o-mini", "https://myres.openai.azure.com"))
    assert _cache_file(tmp_path).exists()
