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
import subprocess
import sys
from collections.abc import Mapping, Sequence
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
    controller, terminal = os.openpty()
    chunks: list[bytes] = []
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
            while True:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the command ended and the terminal closed
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            status = proc.wait(timeout=timeout)
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    return status, b"".join(chunks).decode(errors="replace")
