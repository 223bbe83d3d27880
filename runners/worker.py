"""One Prefect worker of a process's own, for the demo: a run started from a deployment's
form in the Prefect UI is taken and run.

The demo printed "deployments" beside its Prefect UI, but none were registered and, once
registered (``verimail deploy``), they showed "Not Ready": no worker polled their pool. The
demo now registers them (``runners/deploy.py``) and starts this worker on their pool, with
the demo's settings in its environment (so the flow runs it starts use the demo's data dir,
database and mail world), and stops it with the demo. Elsewhere a worker is started as
docs/prefect-ui.md says ("Deployments and a worker").
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from verimail.runners.processes import stop_process

START_TIMEOUT = 120.0  # seconds: the worker imports Prefect and registers with the server
STOP_TIMEOUT = 10.0


class WorkerError(RuntimeError):
    """The worker could not be started; the message says why in one sentence."""


def worker_online(api_url: str, pool: str) -> bool:
    """Whether a worker of ``pool`` has reported to the server at ``api_url`` lately."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        answer = httpx.post(f"{api_url}/work_pools/{pool}/workers/filter", json={}, timeout=5)
        if answer.status_code == 200:
            return any(worker.get("status") == "ONLINE" for worker in answer.json())
    return False


@contextlib.contextmanager
def process_worker(
    api_url: str, pool: str, environment: Mapping[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``prefect worker start`` process on ``pool`` (``environment`` added to ours),
    yielded once it is online; terminated (then killed) after."""
    env = {**os.environ, **environment, "PREFECT_API_URL": api_url}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool]
    command += ["--type", "process", "--name", f"verimail-{os.getpid()}"]
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not worker_online(api_url, pool):
            if process.poll() is not None:
                raise WorkerError(f"the Prefect worker exited at start-up (its log: {log_path})")
            if time.monotonic() > deadline:
                raise WorkerError(f"the Prefect worker did not report within {START_TIMEOUT:.0f} s")
            time.sleep(0.2)  # (a subprocess starting: nothing to await but its heartbeat)
        yield process
    finally:
        stop_process(process, STOP_TIMEOUT)
