"""The suite's end-of-session check (conftest ``no_process_left_behind``) fails a run whose
tests leave a process running — under xdist too — names it, and stops it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import process_leaks
import pytest

TESTS = Path(__file__).resolve().parent

LEAKY_TESTS = """
import subprocess, sys

def test_stops_its_server():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # stopped"])
    process.terminate()
    process.wait()

def test_leaves_its_server_running():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # leaked"])
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_process_left_running_fails_the_session(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "SUITE_LEAK_SETTLE_SECONDS": "1",
    }
    # The suite's own conftest, loaded as a plugin, so its check runs on these tests.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
         "-q", "-rE", *workers, str(tmp_path / "test_leaky.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "started by the suite outlived it" in out, out
    assert "# leaked" in out and "# stopped" not in out, out
    # ... and it was stopped: no process of that run carries a mark any more.
    assert not [p for p in _all_marked() if "# leaked" in p.command]


def _all_marked() -> list[process_leaks.Survivor]:
    """Every process carrying any suite mark (the check's test run's ones among them)."""
    found = []
    for pid_dir in process_leaks.PROC.iterdir():
        if pid_dir.name.isdigit():
            try:
                environ = (pid_dir / "environ").read_bytes()
            except OSError:
                continue
            if process_leaks.MARK_NAME.encode() + b"=" in environ:
                found.append(
                    process_leaks.Survivor(int(pid_dir.name), process_leaks._command(pid_dir))
                )
    return found
