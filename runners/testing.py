"""Prefect worker processes (and verimail's warm worker) for tests and benchmarks (here so
the deployment-mode tests and ``bench.greylisting --one-worker`` share one recipe, as
``store/testing.py`` does for throw-away databases).

A worker is ``prefect worker start --pool …`` from this interpreter's environment, on the
Prefect server this process uses (``PREFECT_API_URL``), polling every second; whatever is
left of it (the flow-run processes it started included) is killed at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

PREFECT = str(Path(sys.executable).parent / "prefect")
VERIMAIL = str(Path(sys.executable).parent / "verimail")


def worker_env(
    base: Mapping[str, str], *, database_url: str, data_dir: Path, **extra: str
) -> dict[str, str]:
    """A worker's environment: this process's without any ``VERIMAIL_*`` setting, then
    ``base`` (the testbed's settings, say), the shared store and results directory, this
    process's Prefect server, and ``extra``."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIMAIL_")}
    env.update(
        {
            **base,
            "VERIMAIL_DATABASE_URL": database_url,
            "VERIMAIL_DATA_DIR": str(data_dir),
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
    )
    return env


@contextlib.contextmanager
def prefect_worker(
    pool: str, env: Mapping[str, str], log: Path, *, limit: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``prefect worker`` process on ``pool`` (at most ``limit`` flow runs at once), its
    output appended to ``log`` (whose folder is its working directory); whatever is left of
    it is killed at the end."""
    command = [PREFECT, "worker", "start", "--pool", pool]
    if limit is not None:
        command += ["--limit", str(limit)]
    with log.open("ab") as out:
        worker = subprocess.Popen(
            command, env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=log.parent
        )
    try:
        yield worker
    finally:
        kill_tree(worker.pid)
        worker.wait(timeout=30)


@contextlib.contextmanager
def warm_worker(
    pool: str, env: Mapping[str, str], log: Path, *, limit: int = 2, poll: float = 0.2
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``verimail worker`` process (the warm worker) on ``pool``, as :func:`prefect_worker`
    starts Prefect's; whatever is left of it is killed at the end (a test that wants to see
    it stop on SIGTERM sends it and waits first)."""
    command = [VERIMAIL, "worker", "--pool", pool, "--limit", str(limit), "--poll", f"{poll:g}"]
    with log.open("ab") as out:
        worker = subprocess.Popen(
            command, env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=log.parent
        )
    try:
        yield worker
    finally:
        kill_tree(worker.pid)
        worker.wait(timeout=30)


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc: the flow-run processes a worker starts are
    in sessions of their own, so killing the worker's process group would miss them)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant of it, at once (as when its machine goes away)."""
    for target in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)
