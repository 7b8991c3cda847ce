"""A job's report as one self-contained HTML file (``sluice report OUTPUT --html FILE``).

Why these tools:

* **uPlot** (MIT, ~50 KB, no dependencies; vendored in ``assets/`` with its licence)
  draws the charts in the browser, from the report's data inlined as JSON. It is made
  for time series (zoom, a cursor with values, thousands of points on a canvas at once)
  and is actively kept. Rendering SVG on the Python side instead (matplotlib, pygal)
  would weigh every ``sluice`` install with a plotting stack, give static pictures, and
  make a bigger file; a bigger JS library (Plotly, ~3.5 MB) would make every report
  megabytes.
* **Jinja2** renders the page with autoescaping on: every text that came from a user or
  a provider (custom ids, error messages, model names, paths) is escaped by default, and
  the data goes in through ``tojson`` (which escapes ``<``, ``>``, ``&`` and ``'``), so
  nothing in a prompt or an error can open a tag or end the script. The page's own
  script builds the charts with ``textContent`` only, never ``innerHTML``.

Nothing is fetched: the scripts and styles are inline, and the page's Content Security
Policy allows no URL at all and only the page's own scripts (by their hashes), so even a
tag that got in could not load or run anything. Both are imported only here, when a
report is made: ``import sluice`` stays light.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import importlib.metadata
import math
from importlib import resources
from typing import Any

__all__ = ["render_html"]

#: The vendored uPlot (``assets/uPlot.iife.min.js``, ``uPlot.min.css``, ``uPlot.LICENSE``).
UPLOT_VERSION = "1.6.32"
#: Colours of the deployments, in the table and on the charts (as ``report.js`` has them).
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")


def _asset(name: str) -> str:
    return (resources.files(__package__) / "assets" / name).read_text(encoding="utf-8")


def render_html(report: dict[str, Any]) -> str:
    """The report as a complete HTML document."""
    import jinja2

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = environment.from_string(_asset("report.html.j2"))
    scripts = {name: _asset(name) for name in ("uPlot.iife.min.js", "report.js")}
    for name, text in scripts.items():  # inlined as they are: they must not end their element
        if "</script" in text.lower():
            raise RuntimeError(f"the report's asset {name} holds '</script': it cannot be inlined")
    failures = _failure_rows(report)
    page = template.render(
        version=_version(),
        made_at=_when(dt.datetime.now(dt.UTC).timestamp()),
        status_class=str(report["job"]["status"]).split(" ")[0],
        bucket=_duration(report["time"]["bucket_seconds"]) if report.get("time") else "",
        failure_rows=failures,
        failure_max=max([max(r[1] or 0, r[2] or 0) for r in failures] or [1]),
        cost_rows=_cost_rows(report),
        cache_rows=_cache_rows(report.get("prompt_cache")),
        uplot_version=UPLOT_VERSION,
        uplot_css=_asset("uPlot.min.css"),
        css=_asset("report.css"),
        uplot_js=scripts["uPlot.iife.min.js"],
        js=scripts["report.js"],
        uplot_licence=_asset("uPlot.LICENSE"),
        data={**report, "palette": PALETTE},
        num=_num,
        usd=_usd,
        secs=_secs,
        pct=_pct,
        duration=_duration,
        when=_when,
        bar=_bar,
        color=lambda i: PALETTE[i % len(PALETTE)],
        limits=_limits,
        **{key: report.get(key) for key in _TOP_LEVEL},
    )
    return _with_script_hashes(page, scripts.values())


_TOP_LEVEL = (
    "job",
    "records",
    "attempts",
    "latency",
    "ttft",
    "time",
    "source",
    "deployments",
    "cooldowns",
    "lines",
    "runs",
    "prompt_cache",
)


def _with_script_hashes(page: str, scripts: Any) -> str:
    """Only these scripts may run (CSP by hash): not even an injected inline one."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()}'" for text in scripts
    )
    return page.replace("script-src 'unsafe-inline'", f"script-src {hashes}", 1)


def _version() -> str:
    try:
        return importlib.metadata.version("llm-sluice")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _failure_rows(report: dict[str, Any]) -> list[tuple[str, int | None, int | None]]:
    records = report["records"]["errors"]
    attempts = report["attempts"]["by_kind"]
    kinds = list(dict.fromkeys([*records, *attempts]))
    return [(kind, records.get(kind), attempts.get(kind)) for kind in kinds]


def _cost_rows(report: dict[str, Any]) -> list[tuple[str, list[tuple[str, float, float]]]]:
    out = []
    for name, values in (report.get("cost_by") or {}).items():
        total = max(values.values(), default=0.0) or 1.0
        out.append((name, [(key, value, _bar(value, total)) for key, value in values.items()]))
    return out


def _cache_rows(cache: dict[str, Any] | None, groups: int = 10) -> list[dict[str, Any]]:
    """The prompt cache's rows: the whole job, each deployment, the largest groups; each
    with its prompt tokens split into uncached, written and read, as shares of a bar."""
    if not cache:
        return []
    rows = [("all requests", cache)]
    rows += [(f"deployment {label}", figures) for label, figures in sorted(cache["by_deployment"].items())]
    largest = sorted(cache["by_group"].items(), key=lambda kv: -int(kv[1].get("requests") or 0))[:groups]
    rows += [(f"group {label} ({figures.get('tokens', 0):,} tokens)", figures) for label, figures in largest]
    out = []
    for label, figures in rows:
        parts = [int(figures.get(key) or 0) for key in ("uncached_tokens", "written_tokens", "read_tokens")]
        total = sum(parts)
        out.append(
            {
                "label": label,
                "requests": figures.get("requests"),
                "tokens": parts,
                "shares": [_bar(part, total) for part in parts],
                "hit_rate": figures.get("hit_rate"),
                "duplicate_writes": figures.get("duplicate_writes"),
                "saved_usd": figures.get("saved_usd"),
            }
        )
    return out


def _bar(value: float | None, top: float | None) -> float:
    if not value or not top:
        return 0.0
    return round(min(100.0, 100.0 * value / top), 1)


def _num(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() else f"{value:,.2f}"
    return str(value)


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if value < 100 else f"${value:,.2f}"


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{seconds:g} s" if seconds in (0.1, 0.2, 0.5) else f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def _when(timestamp: object) -> str:
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        return "-"
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _limits(limits: dict[str, Any] | None) -> str:
    if not limits:
        return "none known"
    parts = []
    for key, unit in (("rpm", "requests"), ("tpm", "tokens")):
        value, configured = limits.get(key), limits["configured"].get(key)
        if value is not None:
            text = f"{value:,.0f} {unit}"
            if configured != value:
                text += " (learnt" + (f"; {configured:,.0f} configured)" if configured is not None else ")")
            parts.append(text)
    if limits.get("max_in_flight") is not None:
        learnt = limits["max_in_flight"] != limits["configured"].get("max_in_flight")
        parts.append(f"{limits['max_in_flight']} in flight" + (" (learnt)" if learnt else ""))
    return ", ".join(parts) or "none known"
