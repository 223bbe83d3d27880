"""One way for tests to run the ``verimail`` command and read what it printed.

Rich draws errors in boxes and wraps them at the terminal width, so text a test looks for
can be split by a line end and a box border, depending on how wide the terminal is and how
long pytest's temporary paths are. Every test that reads CLI output goes through here: the
command runs at one fixed, wide width, and :func:`folded` drops box characters and folds
white space before matching, so neither width nor path length changes what a test sees.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from verimail.testbed.server import PATIENCE

#: The ``verimail`` command of the virtual environment running the suite.
VERIMAIL_BIN = Path(sys.executable).parent / "verimail"

#: The width every Rich console of the suite draws at (set for this process in conftest).
TEST_COLUMNS = "200"

WIDTH_ENV = {"COLUMNS": TEST_COLUMNS, "TERMINAL_WIDTH": TEST_COLUMNS}

_BOX = re.compile(r"[\u2500-\u257f]")  # Unicode box drawing: ─ │ ╭ ╮ ╰ ╯ ...
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor moves, in a terminal


def folded(text: str) -> str:
    """``text`` as one line: terminal escapes and box-drawing characters removed, runs of
    white space as one space."""
    return " ".join(_BOX.sub(" ", _ESCAPES.sub("", text)).split())


def run_verimail(
    args: Sequence[str],
    env: Mapping[str, str],
    timeout: float = PATIENCE,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``verimail`` with ``args`` at the suite's fixed terminal width."""
    return subprocess.run(
        [str(VERIMAIL_BIN), *args],
        env={**env, **WIDTH_ENV},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_in_terminal(
    args: Sequence[str], env: Mapping[str, str], timeout: float = PATIENCE
) -> tuple[int, str]:
    """Run ``verimail`` with a pseudo-terminal as its stdin, stdout and stderr, as a person
    at a shell runs it (some output is only printed to a terminal); exit status and output."""
    status, _, said = _in_terminal(args, env, timeout)
    return status, said


def stop_in_terminal(
    args: Sequence[str],
    env: Mapping[str, str],
    when: str,
    stop: int,
    timeout: float = 180,
    before_stop: Callable[[int], None] | None = None,
) -> tuple[int, str, str]:
    """Run ``verimail`` on a pseudo-terminal (its progress is the live bar a person sees)
    and send it signal ``stop`` as soon as its output, folded, holds ``when`` — read from
    the output, never waited for with a sleep. ``before_stop(pid)`` runs just before the
    signal. (exit status, output before the signal, all output), both folded."""
    status, before, said = _in_terminal(args, env, timeout, (when, stop, before_stop))
    assert before, f"never saw {when!r}: {folded(said)}"
    return status, before, folded(said)


def _in_terminal(
    args: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    stop: tuple[str, int, Callable[[int], None] | None] | None = None,
) -> tuple[int, str, str]:
    """(exit status, folded output up to the stop, all output) of ``verimail *args`` on a
    pseudo-terminal; ``stop``: (what to wait for in the output, the signal, a hook)."""
    controller, terminal = os.openpty()
    chunks: list[bytes] = []
    before = ""
    try:
        with subprocess.Popen(
            [str(VERIMAIL_BIN), *args],
            env={**env, **WIDTH_ENV},
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
        ) as proc:
            os.close(terminal)
            terminal = -1
            deadline = time.monotonic() + timeout
            while True:
                ready, _, _ = select.select([controller], [], [], 1.0)
                said = b"".join(chunks).decode(errors="replace")
                assert time.monotonic() < deadline, folded(said)
                if not ready:
                    continue
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the command ended and the terminal closed
                    break
                if not chunk:
                    break
                chunks.append(chunk)
                if stop is not None and not before:
                    seen = folded(b"".join(chunks).decode(errors="replace"))
                    if stop[0] in seen:
                        before = seen
                        if stop[2] is not None:
                            stop[2](proc.pid)
                        proc.send_signal(stop[1])
            status = proc.wait(timeout=timeout)
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    return status, before, b"".join(chunks).decode(errors="replace")
