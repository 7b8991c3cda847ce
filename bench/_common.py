"""What the benchmarks share: the fake server in its own process, worker processes,
the offline guard, CPU pinning, import timing and markdown tables.

Every client runs in a worker process of its own (the benchmark script re-run with
``--worker``), pinned to one core while the fake server is pinned to the other, so a
client is measured on a core it does not share, a stuck peer is ended by a timeout
(its process is killed by PID), and one library's import-time side effects cannot
touch another's numbers. A worker prints one line ``RESULT_MARK + json`` at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = [
    "BENCH_DIR",
    "RESULT_MARK",
    "FakeServerProcess",
    "WorkerOutcome",
    "cpu_plan",
    "emit_result",
    "forbid_network",
    "import_seconds",
    "machine_line",
    "markdown_table",
    "median",
    "module_available",
    "pin_self",
    "run_worker",
    "save_results",
    "versions_line",
    "worker_env",
]

BENCH_DIR = Path(__file__).resolve().parent
RESULT_MARK = "@@bench-result "

#: Environment for worker processes: nothing may reach beyond loopback. LiteLLM fetches
#: its price map, Anthropic beta-header list and blog feed from the internet unless told
#: not to (``litellm/litellm_core_utils/offline_mode.py``, ``get_model_cost_map.py``);
#: its tiktoken vocabularies are bundled (``default_encoding.py`` points
#: ``TIKTOKEN_CACHE_DIR`` at them). The audit hook in :func:`forbid_network` backs this up.
OFFLINE_ENV: dict[str, str] = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOG": "ERROR",
    "OPENAI_API_KEY": "x",
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # never used: every client is given its URL
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def worker_env() -> dict[str, str]:
    """This process's environment, offline, without proxies."""
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
    env.update(OFFLINE_ENV)
    return env


# -- the offline guard -----------------------------------------------------------------


def _is_local(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def forbid_network() -> list[str]:
    """Refuse every socket connection and name lookup that is not loopback.

    Installs a :func:`sys.addaudithook` hook (it cannot be removed: call it in a worker).
    Returns the list the refused attempts are appended to, for the worker's report.
    """
    blocked: list[str] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.getaddrinfo":
            host = args[0]
        elif event in ("socket.connect", "socket.sendto"):
            address = args[1]
            if not isinstance(address, tuple):  # AF_UNIX paths and the like
                return
            host = address[0]
        else:
            return
        if not _is_local(host):
            blocked.append(f"{event} {host!r}")
            raise PermissionError(f"bench: network access to {host!r} is not allowed")

    sys.addaudithook(hook)
    return blocked


# -- CPUs --------------------------------------------------------------------------------


@functools.cache
def cpu_plan() -> tuple[set[int] | None, set[int] | None]:
    """(server CPUs, client CPUs): one core each when there are two or more, else no pinning.

    Decided once, from the CPUs this process may use before it pins itself.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[1]}


def pin_self(cpus: set[int] | None) -> None:
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    if cpus is None:
        return None
    return lambda: pin_self(cpus)


# -- the fake server in its own process ----------------------------------------------------


class FakeServerProcess:
    """``python -m sluice.testing --port 0 ARGS`` in a subprocess, stopped by its PID.

    Use as a context manager (or call :meth:`stop` in a ``finally``)::

        with FakeServerProcess(["--rpm", "300"], cpus={0}) as server:
            ...  # server.openai_url, server.stats()
    """

    def __init__(self, args: Sequence[str] = (), *, cpus: set[int] | None = None, start_timeout: float = 30.0):
        self.args = list(args)
        self.cpus = cpus
        self.start_timeout = start_timeout
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    @property
    def openai_url(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Self:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        command = [sys.executable, "-m", "sluice.testing", "--port", "0", *self.args]
        self._proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            env=worker_env(),
            preexec_fn=_pinned(self.cpus),
        )
        try:
            self.url = self._read_url()
        except BaseException:
            self.stop()
            raise
        return self

    def _read_url(self) -> str:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the fake server did not start within {self.start_timeout:g} s")
            with selectors.DefaultSelector() as waiting:  # not select(): fds past 1024 in a busy bench
                waiting.register(proc.stdout, selectors.EVENT_READ)
                if not waiting.select(timeout=left):
                    continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the fake server exited at start: {self._stderr_text()}")
            line += chunk
        text = line.decode().strip()
        prefix = "listening on "
        if not text.startswith(prefix):
            raise RuntimeError(f"unexpected first line from the fake server: {text!r}")
        return text[len(prefix) :].rstrip("/")

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return str(self._stderr.read().decode("utf-8", "replace")[-2000:])

    def stats(self) -> dict[str, Any]:
        """``GET /_fake/stats``: the server's counters since it started."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.url}/_fake/stats", timeout=10) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL if it has not exited within 5 s."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- worker processes --------------------------------------------------------------------


@dataclass
class WorkerOutcome:
    """What came back from a worker: its result, or why there is none."""

    result: dict[str, Any] | None
    error: str | None = None
    timed_out: bool = False
    elapsed: float = 0.0
    stderr_tail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def run_worker(script: Path, args: Sequence[str], *, timeout: float, cpus: set[int] | None = None) -> WorkerOutcome:
    """Run ``python SCRIPT --worker ARGS`` pinned to ``cpus``; kill it (by PID) after ``timeout`` s."""
    command = [sys.executable, str(script), "--worker", *args]
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=worker_env(),
        preexec_fn=_pinned(cpus),
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    elapsed = time.monotonic() - started
    tail = err.decode("utf-8", "replace")[-1500:]
    if timed_out:
        return WorkerOutcome(None, f"timed out after {timeout:g} s", True, elapsed, tail)
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        if line.startswith(RESULT_MARK):
            return WorkerOutcome(json.loads(line[len(RESULT_MARK) :]), None, False, elapsed, tail)
    last = tail.strip().splitlines()[-1] if tail.strip() else f"exit code {proc.returncode}"
    return WorkerOutcome(None, f"worker failed: {last}", False, elapsed, tail)


def emit_result(payload: Mapping[str, Any]) -> None:
    """The worker's one result line (library noise on stdout is ignored)."""
    sys.stdout.write(RESULT_MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def worker_main(measure: Callable[[Any], Awaitable[dict[str, Any]]], args: Any) -> int:
    """A worker process's whole life: no network but loopback, one measurement, one JSON line."""
    blocked = forbid_network()
    result = asyncio.run(measure(args))
    result["client"] = args.client
    result["blocked_network"] = blocked
    emit_result(result)
    return 0


def module_available(name: str) -> bool:
    """Whether ``name`` can be found (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# -- import time ---------------------------------------------------------------------------

_IMPORT_TIMER = (
    "import sys, time\nt = time.perf_counter()\nexec(sys.argv[1])\nprint(f'{time.perf_counter() - t:.6f}')\n"
)


def import_seconds(statement: str, *, repeats: int = 5, cpus: set[int] | None = None) -> float | None:
    """Median seconds to run ``statement`` (an import) in a fresh interpreter; None if it fails.

    Measured inside the child around the statement, so interpreter start-up is excluded.
    """
    times: list[float] = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_TIMER, statement],
            capture_output=True,
            env=worker_env(),
            timeout=120,
            preexec_fn=_pinned(cpus),
        )
        if done.returncode != 0:
            return None
        times.append(float(done.stdout.decode().strip().splitlines()[-1]))
    return statistics.median(times)


# -- tables and numbers ------------------------------------------------------------------


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = ()) -> str:
    """A GitHub markdown table; columns whose index is in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w for i, w in enumerate(widths)) + " |"
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def save_results(name: str, payload: Mapping[str, Any]) -> Path:
    """Write the raw figures to ``bench/results/NAME.json`` (git-ignored)."""
    folder = BENCH_DIR / "results"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def versions_line() -> str:
    """The sluice commit measured (``+dirty`` when src/ has changes) and the peers' versions."""
    from importlib import metadata

    root = BENCH_DIR.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    parts = [f"sluice {commit or 'unknown commit'}{'+dirty' if dirty else ''}"]
    for name in ("aiohttp", "openai", "litellm"):
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)


def machine_line() -> str:
    """Python version, CPU count and the pinning used, for the report header."""
    server, client = cpu_plan()
    pinning = f"server on CPU {sorted(server)}, client on CPU {sorted(client)}" if server and client else "no pinning"
    return f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {pinning}"


class ServeProcess:
    """``sluice serve --config CONFIG_TEXT`` in a subprocess (state under ``state``), its
    upstream key in ``BENCH_UPSTREAM_KEY``; ``url`` is its OpenAI base URL once it listens."""

    def __init__(self, config_text: str, state: Path) -> None:
        config = state / "sluice.toml"
        config.write_text(config_text)
        env = {**worker_env(), "BENCH_UPSTREAM_KEY": "sk-bench"}
        command = [sys.executable, "-m", "sluice", "serve", "--config", str(config), "--port", "0"]
        command += ["--state", str(state / "state")]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env
        )
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as waiting:  # not select(): a busy bench holds fds past 1024
            waiting.register(self.process.stdout, selectors.EVENT_READ)
            ready = waiting.select(timeout=60)
        line = self.process.stdout.readline().decode() if ready else ""
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(f"sluice serve did not start: {line!r}")
        self.url = line.split("listening on ")[1].split()[0] + "/v1"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
