"""The peer verifier, ``py3-validate-email`` from PyPI, in a virtual environment of its own.

``ensure_peer_venv()`` makes ``bench/.peer-venv`` once (``python -m venv`` + ``pip install``);
``run_peer`` runs ``bench/peer_runner.py`` with that environment's Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, RESULT_PREFIX

PEER_PACKAGE = "py3-validate-email"
PEER_VERSION = "1.0.5.post2"  # the release measured; change it here to measure another
PEER_VENV = REPO / "bench" / ".peer-venv"
PEER_RUNNER = REPO / "bench" / "peer_runner.py"


def _env() -> dict[str, str]:
    """This environment minus anything that would leak ours into the peer's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PY3VE_IGNORE_UPDATER"] = "1"  # the peer's switch for its download-at-import
    return env


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def ensure_peer_venv() -> Path:
    """The peer environment's Python, creating the environment on first use."""
    python = peer_python()
    check = [str(python), "-c", "import validate_email, dns.resolver"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_VENV)], check=True)
    subprocess.run(
        [
            str(PEER_VENV / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"{PEER_PACKAGE}=={PEER_VERSION}",
        ],
        check=True,
        env=_env(),
    )
    subprocess.run(check, check=True)
    return python


def run_peer(
    addresses: list[str], nameserver: str, smtp_port: int, threads: int, timeout: float
) -> tuple[dict[str, Any], list[bool | None]]:
    """Figures of one peer run and its per-address answers (True, False or None)."""
    python = ensure_peer_venv()
    with tempfile.TemporaryDirectory(prefix="verimail-peer-") as tmp:
        src, out = Path(tmp, "in.txt"), Path(tmp, "out.txt")
        src.write_text("\n".join(addresses) + "\n", encoding="utf-8")
        started = time.perf_counter()
        proc = subprocess.run(
            [
                str(python),
                str(PEER_RUNNER),
                "--nameserver",
                nameserver,
                "--smtp-port",
                str(smtp_port),
                "--threads",
                str(threads),
                "--input",
                str(src),
                "--output",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
            check=False,
        )
        for line in reversed(proc.stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                summary = json.loads(line[len(RESULT_PREFIX) :])
                summary["process_wall_s"] = time.perf_counter() - started
                answers = [json.loads(x) for x in out.read_text().splitlines()]
                return summary, answers
        raise RuntimeError(
            f"the peer exited {proc.returncode} without a result:\n{proc.stderr[-3000:]}"
        )
