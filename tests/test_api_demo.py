"""``verimail demo --once`` as a user runs it: testbed, API, three verifications and a bulk
job on Prefect's embedded server (nothing else started), exit 0."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from api_helpers import VERIMAIL_BIN, clean_env, free_port


def test_demo_once_shows_valid_invalid_and_catch_all(tmp_path: Path) -> None:
    port = free_port()
    command = [str(VERIMAIL_BIN), "demo", "--once", "--port", str(port)]
    run = subprocess.run(
        command, cwd=tmp_path, env=clean_env({}), capture_output=True, text=True, timeout=240
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    statuses = dict(re.findall(r"^RESULT (\S+) status=(\S+)$", run.stdout, re.MULTILINE))
    assert statuses["alice@acme.test"] == "valid", output
    assert statuses["nobody@acme.test"] == "invalid", output
    assert statuses["anyone@catchall.test"] in ("catchall", "likely_valid"), output
    key = re.search(r"\bvm_[A-Za-z0-9_-]{43}\b", run.stdout)
    assert key, output
    assert f"curl -s -X POST http://127.0.0.1:{port}/api/verify/single" in run.stdout
    assert (tmp_path / ".verimail" / "demo" / "verimail.db").exists()
    assert re.search(r"^BULK job=\d+ status=completed ", run.stdout, re.MULTILINE), output
    assert "alice,alice@acme.test,Yes" in run.stdout
    assert "nobody,nobody@acme.test,No" in run.stdout

    # A second run reuses the account and prints the same key.
    again = subprocess.run(
        [*command, "--no-bulk"],
        cwd=tmp_path,
        env=clean_env({}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert key.group(0) in again.stdout


def test_demo_stopped_by_sigterm_ends_as_on_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM (a service manager, `kill`) ends the demo cleanly: "demo stopped" and exit 0.
    uvicorn raised the signal again after its shutdown, which killed the process there."""
    import signal

    port = free_port()
    command = [str(VERIMAIL_BIN), "demo", "--no-bulk", "--port", str(port)]
    demo = subprocess.Popen(
        command, cwd=tmp_path, env=clean_env({}), stdout=subprocess.PIPE, text=True
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if line.startswith("Serving on"):
                break
        else:
            raise AssertionError("the demo ended before it served")
        demo.send_signal(signal.SIGTERM)
        rest = demo.stdout.read()
        assert demo.wait(timeout=60) == 0, rest
        assert "demo stopped" in rest, rest
    finally:
        if demo.poll() is None:
            demo.kill()
