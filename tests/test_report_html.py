"""Issue 23: ``sluice report OUTPUT --html FILE`` and ``--json``, after real jobs over
loopback, checked in headless Chromium: one self-contained file that fetches nothing,
draws its charts with no script error and shows the job's figures, which equal its
records; older state files, running and interrupted jobs, and hostile text."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import Seen, needs_chromium, open_page
from clitools import MODEL, env_for, questions, read_output, run_cli, start_cli, wait_until, write_jsonl

from sluice.testing import FakeServer

LINES = 400
BUDGET = 0.05
INJECTED_429S = 6


@dataclass
class Job:
    dir: Path
    output: Path
    state: Path
    records: list[dict[str, Any]]
    requests_received: int
    rate_limited: int


@pytest.fixture(scope="module")
def faulty_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """A 400-line job with faults (429s with Retry-After, 503s, 500s, 400s) and a budget
    that runs out before the end, run for real by ``sluice run`` against the fake."""
    folder = tmp_path_factory.mktemp("faulty")
    fake = FakeServer(api_key="sk-test", seed=7, latency=0.01, latency_jitter=0.08)
    fake.prices = {"gpt-test": (2.0, 8.0)}
    with fake.running_in_thread():
        fake.inject("429", times=INJECTED_429S, retry_after=0.3)
        fake.fault_rates = {"503": 0.04, "500": 0.02, "400": 0.01}
        source = write_jsonl(folder / "in.jsonl", questions(LINES))
        output = folder / "out.jsonl"
        done = run_cli(
            fake,
            *["run", source, "-o", output, "--model", MODEL, "--price", "2,8", "--budget", str(BUDGET)],
            *["--concurrency", "16", "--rpm", "6000"],
            timeout=120,
        )
        assert done.returncode in (1, 4), done.stderr  # some lines failed, some were not run for money
        stats = fake.stats
        received, limited = stats.received, stats.by_status.get(429, 0)
    return Job(folder, output, folder / "out.sluice.db", read_output(output), received, limited)


def _report_json(job: Job) -> dict[str, Any]:
    return _json_of(job.output)


@contextlib.asynccontextmanager
async def _rendered(report_of: Path, target: Path) -> AsyncIterator[Seen]:
    """``sluice report REPORT_OF --html TARGET``, loaded in Chromium: drawn, with no error."""
    done = _write_html(target, report_of)
    assert done.returncode == 0, done.stderr
    async with open_page(target, wait_for="body[data-charts]") as seen:
        assert seen.console_errors == []
        assert seen.page_errors == []
        assert seen.foreign_requests == []
        assert int(await seen.page.evaluate("document.body.dataset.charts")) >= 4
        yield seen


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _run_sluice(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_sluice(), *map(str, args)], capture_output=True, text=True, timeout=60)


def _without_timeline(job: Job, folder: Path) -> Path:
    """A copy of the job's output and state as a sluice from before the timeline wrote it."""
    old = folder / "old.jsonl"
    old.write_bytes(job.output.read_bytes())
    source = sqlite3.connect(job.state)
    copy = sqlite3.connect(folder / "old.sluice.db")
    source.backup(copy)
    source.close()
    tables = copy.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'timeline_%'").fetchall()
    for (table,) in tables:
        copy.execute(f"DROP TABLE {table}")
    copy.commit()
    copy.close()
    return old


def _sluice() -> list[str]:
    import sys

    return [sys.executable, "-m", "sluice"]


def _write_html(target: Path, report_of: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_sluice(), "report", str(report_of), "--html", str(target)], capture_output=True, text=True, timeout=60
    )


#: Anything in a page that would load from elsewhere: a URL in src/href/action, CSS url() or @import.
_LOADS = re.compile(
    r"""(?:src|href|action|srcset)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import""", re.I
)


# -- the done criterion --------------------------------------------------------------------


@needs_chromium
async def test_the_report_of_a_faulty_budgeted_job_renders_in_chromium(faulty_job: Job, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    done = _write_html(target, faulty_job.output)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stderr
    assert "self-contained" in done.stderr
    assert _names(tmp_path) == ["report.html"]  # one file, nothing beside it
    page = _read(target)
    assert _LOADS.search(page) is None
    assert "default-src 'none'" in page  # and the page's own policy forbids any load
    async with open_page(target, wait_for="body[data-charts]") as seen:
        assert seen.console_errors == []
        assert seen.page_errors == []
        assert seen.requests == [target.as_uri()]  # the file itself, nothing else
        assert seen.refused == []
        charts = int(await seen.page.evaluate("document.body.dataset.charts"))
        assert charts >= 4
        assert await seen.page.locator("figure.chart[data-drawn] canvas").count() >= 4
        assert await seen.painted_canvases("figure.chart canvas") >= 4
        assert (await seen.text("#records-total")).strip() == f"{LINES:,}"
        assert (await seen.text("#records-written")).strip() == f"{len(faulty_job.records):,}"
        succeeded = sum(1 for r in faulty_job.records if r["ok"])
        assert (await seen.text("#records-succeeded")).strip() == f"{succeeded:,}"
        failed_text = await seen.text("#failed")
        assert "bad_request" in failed_text or "budget_exhausted" in failed_text
        assert "429" in await seen.text("#chart-outcomes")  # the legend names the series
        assert await seen.page.locator("#deployments tbody tr").count() == 1


def test_json_figures_equal_the_records_and_the_servers_count(faulty_job: Job) -> None:
    report = _report_json(faulty_job)
    records = faulty_job.records
    assert report["source"] == "timeline"
    assert report["records"]["in_input"] == LINES
    assert report["records"]["written"] == len(records) == LINES
    assert report["records"]["succeeded"] == sum(1 for r in records if r["ok"])
    assert report["records"]["failed"] == sum(1 for r in records if not r["ok"])
    kinds = Counter(r["error"]["type"] for r in records if not r["ok"])
    assert report["records"]["errors"] == dict(kinds)
    assert kinds["budget_exhausted"] > 0  # the budget did bind
    attempts = report["attempts"]
    assert attempts["total"] == faulty_job.requests_received  # every attempt the provider saw
    assert attempts["rate_limited"] == faulty_job.rate_limited >= INJECTED_429S
    assert attempts["answered"] == sum(1 for r in records if r["ok"] and not r["cached"])
    assert attempts["retries"] == attempts["total"] - sum(1 for r in records if r["attempts"])
    # the series add up to the totals
    width = report["time"]["bucket_seconds"]
    (sent,) = report["series"]["requests_per_s"].values()
    assert round(sum(sent) * width) == attempts["total"]
    assert sum(report["series"]["answered"]) == attempts["answered"]
    assert sum(report["series"]["rate_limited"]) == attempts["rate_limited"]
    assert sum(report["series"]["retries"]) == attempts["retries"]
    assert len(report["time"]["t"]) == len(sent) <= 240
    # money: what the records were charged, against the budget
    spent = sum(r["cost_usd"] or 0 for r in records)
    assert report["series"]["cost_cumulative_usd"][-1] == pytest.approx(spent, rel=0.02)
    assert report["job"]["budget_usd"] == BUDGET
    assert report["job"]["cost_usd"] <= BUDGET
    assert report["cost_by"]["model"] == {MODEL: pytest.approx(spent, rel=0.02)}
    # the deployment: its share, its limit, its 429 pauses as cooldown bands
    (deployment,) = report["deployments"]
    assert deployment["share"] == 1.0
    assert deployment["limits"]["rpm"] == 6000
    (limit,) = report["series"]["limit_requests_per_s"].values()
    assert set(limit) == {100.0}
    assert report["cooldowns"]
    assert all(c["why"].startswith("429") for c in report["cooldowns"])
    assert sum(c["count"] for c in report["cooldowns"]) == attempts["rate_limited"]
    # the lines it names
    slowest = report["lines"]["slowest"]
    assert [s["latency_s"] for s in slowest] == sorted((r["latency_s"] for r in records), reverse=True)[:20]
    assert report["lines"]["failed_total"] == report["records"]["failed"]
    assert all(line["error"] and line["message"] for line in report["lines"]["failed"])


@needs_chromium
async def test_the_page_holds_the_same_figures_as_the_json(faulty_job: Job, tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    assert _write_html(target, faulty_job.state).returncode == 0  # the state file named instead of the output
    async with open_page(target) as seen:
        inlined = json.loads(await seen.page.evaluate("document.getElementById('report-data').textContent"))
    inlined.pop("palette")
    as_json = _report_json(faulty_job)
    assert {k: v for k, v in inlined.items() if k != "job"} == {k: v for k, v in as_json.items() if k != "job"}


# -- flags -------------------------------------------------------------------------------------


def test_the_plain_report_stays_a_table(faulty_job: Job) -> None:
    done = subprocess.run([*_sluice(), "report", str(faulty_job.output)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "records in input" in done.stdout
    assert "<html" not in done.stdout


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("missing-dir/report.html", "the directory"),
        ("/proc/sluice-report.html", "cannot write"),  # as root: at the write; else: at the check
        (".", "is a directory"),
    ],
)
def test_an_unwritable_html_target_is_a_clear_error(faulty_job: Job, tmp_path: Path, target: str, said: str) -> None:
    done = subprocess.run(
        [*_sluice(), "report", str(faulty_job.output), "--html", target],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert said in done.stderr
    assert "Traceback" not in done.stderr
    assert _names(tmp_path) == []  # nothing half-written


def test_html_to_stdout_and_json_at_once_is_refused(faulty_job: Job) -> None:
    done = subprocess.run(
        [*_sluice(), "report", str(faulty_job.output), "--html", "-", "--json"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "both write to standard output" in done.stderr


def test_html_to_stdout(faulty_job: Job) -> None:
    done = subprocess.run([*_sluice(), "report", str(faulty_job.output), "--html", "-"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>")
    assert done.stdout.rstrip().endswith("</html>")


# -- an older state file ------------------------------------------------------------------------


@needs_chromium
async def test_a_state_file_from_before_the_timeline_still_reports(faulty_job: Job, tmp_path: Path) -> None:
    """A state written before the timeline tables existed: plotted from its results."""
    old = _without_timeline(faulty_job, tmp_path)
    done = _run_sluice("report", old, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["source"] == "results"
    assert report["records"]["written"] == LINES  # from the output, as before
    stored = report["records"]["stored"]
    assert report["attempts"]["total"] == stored  # one per stored result
    assert report["attempts"]["answered"] == sum(1 for r in faulty_job.records if r["ok"])
    assert report["cooldowns"] == []
    async with _rendered(old, tmp_path / "old.html") as seen:
        assert "no timeline" in await seen.text("p.note")


# -- a running job, then an interrupted one --------------------------------------------------------


@needs_chromium
async def test_a_running_then_interrupted_job_reports_what_it_has(tmp_path: Path) -> None:
    fake = FakeServer(api_key="sk-test", latency=0.25)
    with fake.running_in_thread():
        source = write_jsonl(tmp_path / "in.jsonl", questions(300))
        output = tmp_path / "out.jsonl"
        job = start_cli(
            *(fake, "run", source, "-o", output, "--model", MODEL, "--concurrency", "4"),
            env=env_for(fake),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: output.exists() and len(output.read_bytes().splitlines()) >= 12, timeout=60)
            running = _json_of(output)
            assert running["job"]["status"].startswith("running")
            assert 0 < running["records"]["written"] < 300
            wait_until(
                lambda: _json_of(output)["attempts"]["total"] >= 12, timeout=30
            )  # the timeline is written as it goes
            job.send_signal(signal.SIGKILL)
            job.wait(timeout=10)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait(timeout=10)
    after = _json_of(output)
    assert after["job"]["status"].startswith("interrupted")
    assert after["attempts"]["total"] >= 12
    async with _rendered(output, tmp_path / "r.html") as seen:
        assert "interrupted" in await seen.text(".status")
    _resume(source, output)
    resumed = _json_of(output)
    assert resumed["job"]["status"] == "finished"
    assert resumed["records"]["written"] == resumed["records"]["succeeded"] == 300
    assert len(resumed["runs"]) == 2  # each run's start is marked on the time axis
    assert resumed["attempts"]["answered"] >= 300 - after["records"]["written"]
    async with _rendered(output, tmp_path / "resumed.html") as seen:
        assert "2 runs" in await seen.text("#runs summary")


def _resume(source: Path, output: Path) -> None:
    fake = FakeServer(api_key="sk-test", latency=0.01)
    with fake.running_in_thread():
        done = run_cli(fake, "run", source, "-o", output, "--model", MODEL, "--concurrency", "16")
    assert done.returncode == 0, done.stderr


def _json_of(output: Path) -> dict[str, Any]:
    done = subprocess.run([*_sluice(), "report", str(output), "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


# -- hostile text --------------------------------------------------------------------------------------

_HOSTILE = [
    "<script>window.pwned = 1; alert(1)</script>",
    "</script><script>window.pwned = 2</script>",
    '"><img src=x onerror="window.pwned = 3">',
    "<!--",
    "\u2028'); window.pwned = 4; //",
]


def _hostile_job(folder: Path) -> Path:
    lines = [{"custom_id": text, "body": {"messages": [{"role": "user", "content": text}]}} for text in _HOSTILE]
    lines += [  # failures whose messages quote what the line said
        {"custom_id": f"bad {text}", "method": text, "body": {"messages": [{"role": "user", "content": "x"}]}}
        for text in _HOSTILE
    ]
    fake = FakeServer(api_key="sk-test")
    with fake.running_in_thread():
        fake.inject("400", times=2)
        source = write_jsonl(folder / "in.jsonl", lines)
        output = folder / "out.jsonl"
        done = run_cli(fake, "run", source, "-o", output, "--model", MODEL, "--concurrency", "1")
    assert done.returncode == 1, done.stderr
    return output


@needs_chromium
async def test_hostile_ids_and_errors_are_shown_as_text_and_never_run(tmp_path: Path) -> None:
    output = _hostile_job(tmp_path)
    target = tmp_path / "r.html"
    assert _write_html(target, output).returncode == 0
    page = _read(target)
    assert page.count("<script") == 3  # the data, uPlot, the page's own: nothing else opens a script
    assert "<img" not in page
    assert page.count("</script>") == 3  # and nothing in the data ends its element early
    async with open_page(target, wait_for="body[data-charts]") as seen:
        assert seen.console_errors == []
        assert seen.page_errors == []
        assert seen.dialogs == []
        assert await seen.page.evaluate("window.pwned") is None
        assert await seen.page.locator("img").count() == 0
        assert await seen.page.locator("script").count() == 3
        shown = await seen.text("#failed") + await seen.text("#slowest")
        assert '"><img src=x onerror="window.pwned = 3">' in shown  # as text, visible
        assert "method must be POST" in shown


def _unsent_job(folder: Path) -> Path:
    """A job whose every line was refused for money before it was sent (and one invalid)."""
    source = write_jsonl(folder / "in.jsonl", questions(3))
    with source.open("a") as f:
        f.write("not json\n")
    fake = FakeServer(api_key="sk-test")
    with fake.running_in_thread():
        output = folder / "out.jsonl"
        done = run_cli(fake, "run", source, "-o", output, "--model", MODEL, "--price", "2,8", "--budget", "0.0000001")
        assert fake.stats.received == 0
    assert done.returncode in (1, 4), done.stderr
    return output


@needs_chromium
async def test_a_job_that_sent_nothing_reports_its_lines_and_no_charts(tmp_path: Path) -> None:
    output = _unsent_job(tmp_path)
    report = _json_of(output)
    assert report["attempts"]["total"] == 0
    assert report["time"] is None
    assert report["records"]["errors"] == {"budget_exhausted": 3, "invalid_input": 1}
    target = tmp_path / "r.html"
    assert _write_html(target, output).returncode == 0
    async with open_page(target, wait_for="body[data-charts]") as seen:
        assert seen.console_errors == []
        assert seen.page_errors == []
        assert await seen.page.evaluate("document.body.dataset.charts") == "0"
        assert "No attempt is recorded yet" in await seen.text("p.note")
        assert "not valid JSON" in await seen.text("#failed")


# -- what --html may overwrite -------------------------------------------------------------------


def _simulated_job(folder: Path, lines: int = 20, *extra: str) -> Path:
    """A small job run by ``sluice run`` on the built-in simulated model; its output."""
    source = write_jsonl(folder / "in.jsonl", questions(lines))
    output = folder / "out.jsonl"
    done = _run_sluice("run", source, "-o", output, "--model", "simulate/demo", "--price", "1,1", *extra)
    assert done.returncode == 0, done.stderr
    return output


def _files_of(folder: Path) -> dict[str, bytes]:
    """The folder's files (but those SQLite itself keeps beside a state it opens)."""
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    return {name: data for name, data in files.items() if not name.endswith(("-wal", "-shm")) or b"<html" in data}


@pytest.mark.parametrize(
    "target", ["out.sluice.db", "out.sluice.db-wal", "out.sluice.db-journal", "out.jsonl", "in.jsonl", "link.html"]
)
def test_html_never_overwrites_the_jobs_own_files(tmp_path: Path, target: str) -> None:
    output = _simulated_job(tmp_path)
    (tmp_path / "link.html").symlink_to(tmp_path / "out.sluice.db")
    before = _files_of(tmp_path)
    for report_of, force in [(output, []), (tmp_path / "out.sluice.db", []), (output, ["--force"])]:
        done = subprocess.run(
            [*_sluice(), "report", report_of.name, "--html", target, *force],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 2, done.stderr
        assert "give another file for the report" in done.stderr
        assert "Traceback" not in done.stderr
        assert _files_of(tmp_path) == before  # nothing written, nothing beside
    assert _run_sluice("report", output, "--json").returncode == 0


def test_html_overwrites_an_earlier_report_but_another_file_only_with_force(tmp_path: Path) -> None:
    output = _simulated_job(tmp_path)
    report = tmp_path / "report.html"
    assert _write_html(report, output).returncode == 0
    assert _write_html(report, output).returncode == 0  # an earlier report: rewritten
    notes = tmp_path / "notes.html"
    notes.write_text("<!DOCTYPE html><p>my notes</p>\n")
    done = _write_html(notes, output)
    assert done.returncode == 2
    assert "is not a sluice report" in done.stderr
    assert "--force" in done.stderr
    assert notes.read_text() == "<!DOCTYPE html><p>my notes</p>\n"
    done = _run_sluice("report", output, "--html", notes, "--force")
    assert done.returncode == 0, done.stderr
    assert notes.read_bytes().startswith(b"<!DOCTYPE html>")


def test_html_refuses_a_fifo(tmp_path: Path) -> None:
    output = _simulated_job(tmp_path)
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    for force in ([], ["--force"]):
        done = _run_sluice("report", output, "--html", fifo, *force)
        assert done.returncode == 2, done.stderr
        assert "not a regular file" in done.stderr
        assert stat.S_ISFIFO(fifo.lstat().st_mode)  # still the pipe


def test_write_html_refuses_a_fifo_made_after_the_check(tmp_path: Path) -> None:
    from sluice.cli._report import write_html
    from sluice.report import build_report

    output = _simulated_job(tmp_path)
    report = build_report(tmp_path / "out.sluice.db", output)
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        write_html(report, fifo)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not [name for name in _names(tmp_path) if name.endswith(".tmp")]  # nothing left beside


# -- the charts' drawing -------------------------------------------------------------------------


@needs_chromium
async def test_y_axis_labels_are_the_ticks_values(faulty_job: Job, tmp_path: Path) -> None:
    """uPlot's axis ``values`` gets the ticks; each label is its tick's value, not one
    rounded to as many digits as the tick's index (25 -> "30")."""
    async with _rendered(faulty_job.output, tmp_path / "axis.html") as seen:
        labels = await seen.page.evaluate(
            """() => {
                const u = window.sluiceCharts.find((c) => c.el.id === "chart-requests").u;
                return u.axes[1].values(u, [0, 25, 50, 75, 100, 0.15, 1250], 1, 25, 0);
            }"""
        )
    assert labels == ["0", "25", "50", "75", "100", "0.15", "1,250"]


#: How many pixels of the latency chart are drawn in its series' colours (p50, p90, p99:
#: one answer in a bucket is all three, the last drawn on top).
_SERIES_PIXELS = """() => {
    const canvas = document.querySelector("#chart-latency canvas");
    const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const colours = [[22, 163, 74], [202, 138, 4], [220, 38, 38]];
    let n = 0;
    for (let i = 0; i < pixels.length; i += 4) {
        if (colours.some(([r, g, b]) => Math.abs(pixels[i] - r) + Math.abs(pixels[i + 1] - g) + Math.abs(pixels[i + 2] - b) < 30)) n++;
    }
    return n;
}"""


@needs_chromium
async def test_a_slow_jobs_isolated_latency_points_are_drawn(tmp_path: Path) -> None:
    """Answers seconds apart: each latency bucket has no neighbour, so no line joins it;
    its point is drawn."""
    output = _simulated_job(tmp_path, 4, "--rpm", "20", "--burst", "0")
    report = _json_of(output)
    p50 = report["series"]["latency_p50"]
    assert sum(v is not None for v in p50) >= 2
    assert not any(a is not None and b is not None for a, b in itertools.pairwise(p50))  # no two side by side
    async with _rendered(output, tmp_path / "slow.html") as seen:
        assert await seen.page.evaluate(_SERIES_PIXELS) > 0


def test_a_state_from_before_charges_still_reports(tmp_path: Path) -> None:
    """A state file written before the ``charges`` table (nor ``intents``): every form
    of the report is made from what it has, its cost from its results."""
    output = _simulated_job(tmp_path)
    cost = _json_of(output)["job"]["cost_usd"]
    assert cost
    db = sqlite3.connect(tmp_path / "out.sluice.db")
    db.execute("DROP TABLE charges")
    db.execute("DROP TABLE intents")
    db.commit()
    db.close()
    for form in ([], ["--json"], ["--html", tmp_path / "old.html"]):
        done = _run_sluice("report", output, *form)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
    assert _json_of(output)["job"]["cost_usd"] == pytest.approx(cost)


def test_an_infinite_budget_reports_as_none(tmp_path: Path) -> None:
    output = _simulated_job(tmp_path, 10, "--budget", "inf")
    done = _run_sluice("report", output, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["job"]["budget_usd"] is None
    assert all(run["budget_usd"] is None for run in report["runs"])
    page = tmp_path / "inf.html"
    assert _run_sluice("report", output, "--html", page).returncode == 0
    data = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', _read(page), re.S)
    assert data is not None
    strict = json.loads(data.group(1), parse_constant=lambda name: pytest.fail(f"the page's data holds {name}"))
    assert strict["job"]["budget_usd"] is None


# -- the scales, axes and limits (issue 34, point 28) ----------------------------------------------

#: Each chart as drawn: its series' names, its y scale's top, the highest value each series
#: holds, and the labels uPlot drew on each axis (uPlot keeps them in ``axis._values``).
_DRAWN = """() => Object.fromEntries(window.sluiceCharts.map(({ el, u }) => [el.id, {
    series: u.series.slice(1).map((s) => s.label),
    yMax: u.scales.y.max,
    highest: Object.fromEntries(u.series.slice(1).map((s, i) => [s.label,
        Math.max(0, ...u.data[i + 1].filter((v) => v !== null))])),
    axes: u.axes.map((a) => (a._values || []).filter((v) => v !== null && v !== "")),
    note: el.querySelector(".off-scale")?.textContent ?? null,
}]))"""


async def _drawn(seen: Seen) -> dict[str, Any]:
    drawn: dict[str, Any] = await seen.page.evaluate(_DRAWN)
    return drawn


def _money_format(labels: list[str]) -> set[int]:
    """The decimals of each money label (every one must be "$" and digits, with a point)."""
    assert labels
    assert all(re.fullmatch(r"\$\d[\d,]*\.\d+", label) for label in labels), labels
    return {len(label.split(".")[1]) for label in labels}


@needs_chromium
async def test_every_chart_is_scaled_to_its_data_with_several_labels_on_each_axis(tmp_path: Path) -> None:
    """20 lines at once under --concurrency 256 and a $1 budget that spends a cent or so:
    in flight peaks near 20, so the concurrency is no line (it would flatten the data to
    the axis) and the y scale ends near the peak; the same for the budget; each axis,
    the latency histogram's too, has several labels; the money labels share one format."""
    output = _simulated_job(tmp_path, 20, "--concurrency", "256", "--budget", "1")
    async with _rendered(output, tmp_path / "r.html") as seen:
        drawn = await _drawn(seen)
    inflight = drawn["chart-inflight"]
    peak = inflight["highest"]["peak"]
    assert 1 <= peak <= 20
    assert "concurrency" not in inflight["series"]
    assert peak <= inflight["yMax"] <= 2 * peak  # drawn to its own height, not to 256's
    assert inflight["note"] is not None
    assert "concurrency 256" in inflight["note"]
    cost = drawn["chart-cost"]
    spent = cost["highest"]["spent"]
    assert 0 < spent < 0.05
    assert cost["series"] == ["spent"]  # the $1 budget is far: named, not drawn
    assert spent <= cost["yMax"] <= 2 * spent
    assert "$1.0000" in cost["note"]
    assert len(_money_format(cost["axes"][1])) == 1, cost["axes"][1]  # one format: "$0.000" .. "$0.015"
    for name, chart in drawn.items():
        x, y = chart["axes"]
        assert len(x) >= 3, (name, x)
        assert len(y) >= 3, (name, y)
    assert all(label.endswith(" ms") or label.endswith(" s") for label in drawn["chart-histogram"]["axes"][0])


@needs_chromium
async def test_a_budget_the_job_reached_is_drawn_as_a_line(faulty_job: Job, tmp_path: Path) -> None:
    """The faulty job spends its $0.05 budget: the budget is near the data, so drawn, and
    the scale holds it; its money labels share one format."""
    async with _rendered(faulty_job.output, tmp_path / "r.html") as seen:
        drawn = await _drawn(seen)
    cost = drawn["chart-cost"]
    assert cost["highest"]["spent"] >= BUDGET / 2
    assert cost["series"] == ["spent", "budget"]
    assert cost["note"] is None
    assert BUDGET <= cost["yMax"] <= 1.5 * BUDGET
    assert len(_money_format(cost["axes"][1])) == 1, cost["axes"][1]
