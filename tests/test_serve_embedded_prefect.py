"""``verimail serve`` on the local runner starts Prefect's embedded server as a child
process; stopping ``serve`` the way a service manager does (SIGTERM) must stop it too."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from api_helpers import PATIENCE, serve_processes
from process_leaks import alive as _alive
from process_leaks import children_of as _children


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_sigterm_stops_the_embedded_prefect_server_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefect stops its embedded server from an atexit hook, which never runs when the
    process ends on SIGTERM (uvicorn re-raises the signal after its shutdown): every
    restart of ``verimail serve`` left one more Prefect server running."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # (the embedded server, not a harness)
    env = {
        "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "VERIMAIL_PREFECT_WARM_UP": "true",
    }
    with serve_processes(1, env, tmp_path) as [server]:
        pid = server.process.pid
        _wait(lambda: bool(_children(pid)), PATIENCE, "the warm-up to start Prefect's server")
        children = _children(pid)
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=PATIENCE)
    _wait(
        lambda: not any(_alive(child) for child in children), PATIENCE, "Prefect's server to stop"
    )
