"""No process outlives the suite: every process a test starts carries a mark in its
environment, and the session ends by looking for marked processes still running.

Why the environment and not the process tree: a server whose parent was killed (``verimail
serve`` ended by SIGKILL while its Prefect server was starting, issue 36) is re-parented to
init, so it is no longer anyone's child — but it keeps the environment it was started with.
Each pytest process (the controller and every xdist worker) writes its own mark into
``os.environ`` when it starts, so whatever it starts inherits that mark (a process started
with a hand-made ``env`` that drops it is not seen), and a worker only ever looks for its
own: another worker's servers, still running its tests, are not its business.

Linux only (``/proc``); elsewhere the check says it cannot look and passes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARK_NAME = "VERIMAIL_SUITE_PROCESS_MARK"
"""The environment variable of the mark. (``clean_env`` in api_helpers drops ``VERIMAIL_*``
settings for the servers it starts; it keeps this one, see there.)"""
PROC = Path("/proc")
SETTLE_SECONDS = float(os.environ.get("SUITE_LEAK_SETTLE_SECONDS", "60"))
"""How long a marked process may take to exit after the last test (a server told to stop
just before may still be closing); the check polls, it does not sleep that long. The
check's own test shortens it."""


def mark_this_process() -> str:
    """Give this pytest process (and so everything it starts from now on) a mark of its own."""
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    os.environ[MARK_NAME] = mark
    return mark


@dataclass(frozen=True)
class Survivor:
    """A marked process still running."""

    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command}"


def _environ_has(pid_dir: Path, needle: bytes) -> bool:
    try:
        return needle in (pid_dir / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, a zombie, or not ours to read
        return False


def _command(pid_dir: Path) -> str:
    try:
        raw = (pid_dir / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300] or "?"


def marked_processes(mark: str) -> list[Survivor]:
    """Running processes (zombies excluded: their environment reads empty) carrying ``mark``,
    this process left out."""
    needle = f"{MARK_NAME}={mark}".encode()
    me = os.getpid()
    found = []
    for pid_dir in PROC.iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == me:
            continue
        if _environ_has(pid_dir, needle):
            found.append(Survivor(int(pid_dir.name), _command(pid_dir)))
    return found


def survivors(mark: str, settle: float = SETTLE_SECONDS) -> list[Survivor]:
    """The marked processes still running once ``settle`` seconds have passed (polled: an
    empty answer returns at once)."""
    deadline = time.monotonic() + settle
    while True:
        left = marked_processes(mark)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def kill(processes: list[Survivor]) -> None:
    """Stop what the check found, so that one leak does not stay behind the failing run."""
    for process in processes:
        with contextlib.suppress(OSError):  # (gone by itself meanwhile)
            os.kill(process.pid, signal.SIGKILL)


def can_look() -> bool:
    return (PROC / str(os.getpid()) / "environ").is_file()


def children_of(pid: int) -> set[int]:
    """The processes ``pid`` started (every thread's children, from /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        listed = task / "children"
        if listed.exists():
            found |= {int(c) for c in listed.read_text().split()}
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
