"""Ctrl-C and SIGTERM at any moment of a command's life: a clean exit status, never a crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sluice._entry

#: A child that installs the command's early handler, then delivers SIGINT while orjson's
#: C init is importing ``uuid``: the moment an early Ctrl-C used to segfault (exit 139).
_SIGINT_INSIDE_A_NATIVE_IMPORT = """
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("early_entry", sys.argv[1])
entry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entry)

class SigintWhileOrjsonInitialises:
    def find_spec(self, name, path=None, target=None):
        if name == "uuid" and "orjson.orjson" in sys.modules:  # orjson's C init imports it
            os.kill(os.getpid(), signal.SIGINT)
        return None

entry.quiet_interrupts()
sys.meta_path.insert(0, SigintWhileOrjsonInitialises())
import orjson
print("the import finished: no SIGINT was delivered inside it")
"""


def test_a_ctrl_c_inside_a_native_import_exits_130_not_a_segfault() -> None:
    entry = Path(sluice._entry.__file__)
    done = subprocess.run(
        [sys.executable, "-c", _SIGINT_INSIDE_A_NATIVE_IMPORT, str(entry)], capture_output=True, text=True, timeout=30
    )
    assert "the import finished" not in done.stdout  # the hook did fire inside orjson's init
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr == "sluice: interrupted\n"


def test_a_program_run_with_python_m_that_imports_sluice_keeps_its_own_ctrl_c(tmp_path: Path) -> None:
    """``sys.argv[0]`` is ``"-m"`` for any ``python -m app.main`` while ``app`` loads: only
    the ``sluice`` command itself takes the early handler, which skips clean-up."""
    package = tmp_path / "hostapp"
    package.mkdir()
    (package / "__init__.py").write_text("import sluice\n")
    (package / "main.py").write_text(
        "import signal\nprint(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "hostapp.main"], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr


def test_the_command_is_told_from_programs_that_import_sluice() -> None:
    command = [
        ["/venv/bin/python", "/venv/bin/sluice", "run", "in.jsonl"],
        ["python", "-m", "sluice", "run"],
        ["python", "-msluice"],
        ["python", "-X", "importtime", "-B", "-m", "sluice"],
    ]
    not_command = [
        ["python", "-m", "sluice.testing"],
        ["python", "-m", "hostapp.main"],
        ["python", "-c", "import sluice"],
        ["python", "-X", "dev", "app.py"],
        ["python"],
        [],
    ]
    assert [sluice._entry.is_the_command(argv) for argv in command] == [True] * len(command)
    assert [sluice._entry.is_the_command(argv) for argv in not_command] == [False] * len(not_command)
