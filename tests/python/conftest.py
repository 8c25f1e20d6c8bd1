"""Shared setup of the Python API tests: the build tree's package and tandem command.

TANDEM_BUILD names the build directory (default: build/ of the repository). The tests run
on one thread, as the C++ suite does, so that CPU results are reproducible bit for bit.
"""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("TANDEM_BUILD", ROOT / "build")).resolve()
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(BUILD / "python"))
os.environ["PYTHONPATH"] = str(BUILD / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")

# numpy first, as most programs import it: the module must load after it (it once did not,
# docs/python.md).
import numpy  # noqa: E402,F401
FIXTURES = ROOT / "tests" / "fixtures"


def run_cli(*args, check=True, cwd=None):
    """Runs the tandem command; returns the CompletedProcess (text)."""
    r = subprocess.run([str(BUILD / "tandem"), *map(str, args)], capture_output=True,
                       text=True, cwd=cwd)
    if check and r.returncode != 0:
        raise AssertionError(f"tandem {' '.join(map(str, args))} failed:\n{r.stderr}")
    return r


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A byte-level token file of a few KiB of text."""
    d = tmp_path_factory.mktemp("corpus")
    text = d / "c.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                            for i in range(300)))
    run_cli("data", "prepare", "--text", text, "--out", d / "c.tok")
    return d / "c.tok"
