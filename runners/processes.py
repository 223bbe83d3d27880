"""Stopping a child process the runners started (the Prefect server, the demo's worker):
terminate, then kill what has not ended in time, and reap it. (``bench/common.py`` keeps
its own three lines: importing ``verimail.runners`` loads Prefect, which a measuring process
must not.)"""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(process: subprocess.Popen[Any], timeout: float) -> None:
    """Terminate ``process`` and wait for it; killed if it has not ended within ``timeout``
    (a process that has ended already is only reaped)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
