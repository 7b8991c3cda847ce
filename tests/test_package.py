"""The package as it would be published: ``python -m build`` makes a wheel and an sdist that
``twine check`` passes, with the vendored assets; the wheel installed in a fresh venv runs
the first command of the README and prints its version.

Built once per module (~15 s; the build backend comes from PyPI, as ``python -m build``
fetches it). The fresh venv gets the wheel with ``--no-deps`` and sees the dependencies of
this environment through a ``.pth`` file (no download of them per run); the test checks
that ``sluice`` is imported from the wheel, not from this checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import sluice

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.xdist_group("package"), pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip(
        "build", reason="the release extra is not installed (the test extra takes it: pip install -e '.[test]')"
    )
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], capture_output=True, text=True, timeout=500
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_distributions_pass_twine_check_and_hold_the_assets(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    names = set(zipfile.ZipFile(wheel).namelist())
    for asset in (
        "sluice/report/assets/uPlot.iife.min.js",
        "sluice/report/assets/uPlot.LICENSE",
        "sluice/report/assets/report.html.j2",
        "sluice/serve/dashboard/dashboard.html",
        "sluice/py.typed",
    ):
        assert asset in names
    meta = zipfile.ZipFile(wheel).read(f"llm_sluice-{sluice.__version__}.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in meta
    assert "Classifier: Programming Language :: Python :: 3.11" in meta
    assert "Description-Content-Type: text/markdown" in meta


def test_the_wheel_in_a_fresh_venv_runs_the_first_command(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # the dependencies of this environment, after the venv's own site-packages (the wheel's sluice)
    (purelib / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    where = subprocess.run(
        [python, "-c", "import sluice; print(sluice.__file__)"], capture_output=True, text=True, cwd=tmp_path
    )
    assert where.stdout.strip().startswith(str(purelib)), where.stdout + where.stderr
    command = venv / "bin" / "sluice"
    version = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"sluice, version {sluice.__version__}", version.stderr
    assert command.read_text().startswith(f"#!{python}")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    run = subprocess.run(
        [command, "run", "examples/questions.jsonl", "-o", "r.jsonl", "--model", "simulate/demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == len((ROOT / "examples" / "questions.jsonl").read_text().splitlines())
