"""``verimail demo --once`` as a user runs it: testbed, API, three verifications and a bulk
job on Prefect's embedded server (nothing else started), exit 0."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from api_helpers import PATIENCE, TIMEOUTS_ENV, VERIMAIL_BIN, clean_env, free_port


def test_demo_once_shows_valid_invalid_and_catch_all(tmp_path: Path) -> None:
    port = free_port()
    command = [str(VERIMAIL_BIN), "demo", "--once", "--port", str(port)]
    run = subprocess.run(
        command,
        cwd=tmp_path,
        env=clean_env(TIMEOUTS_ENV),
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    statuses = dict(re.findall(r"^RESULT (\S+) status=(\S+)$", run.stdout, re.MULTILINE))
    assert statuses["alice@acme.test"] == "valid", output
    assert statuses["nobody@acme.test"] == "invalid", output
    assert statuses["anyone@catchall.test"] in ("catchall", "likely_valid"), output
    key = re.search(r"\bvm_[A-Za-z0-9_-]{43}\b", run.stdout)
    assert key, output
    # Before each request, the curl line that repeats it: the three single verifications,
    # the upload (of a CSV saved where the line says), the polling and the download.
    curls = [shlex.split(line[2:]) for line in run.stdout.splitlines() if line.startswith("$ ")]
    base = f"http://127.0.0.1:{port}"
    assert [words[-1] for words in curls[:3]] == [
        json.dumps({"email": email})
        for email in ("alice@acme.test", "nobody@acme.test", "anyone@catchall.test")
    ], output
    assert all(f"{base}/api/verify/single" in words for words in curls[:3])
    upload, poll, download = curls[3:]
    assert f"{base}/api/bulk" in upload and f"Authorization: Bearer {key.group(0)}" in upload
    saved = Path(upload[upload.index("-F") + 1].removeprefix("file=@"))
    assert saved.read_text().splitlines()[1] == "alice,alice@acme.test"
    job = re.search(r"^BULK job=(\d+) ", run.stdout, re.MULTILINE)
    assert job and f"{base}/api/bulk/{job.group(1)}" in poll, output
    assert f"{base}/api/bulk/{job.group(1)}/download" in download
    assert (tmp_path / ".verimail" / "demo" / "verimail.db").exists()
    assert re.search(r"^BULK job=\d+ status=completed ", run.stdout, re.MULTILINE), output
    assert "alice,alice@acme.test,Yes" in run.stdout
    assert "nobody,nobody@acme.test,No" in run.stdout
    # /metrics is off without a token, and the demo says how to switch it on (issue 36).
    assert "Metrics: off" in run.stdout and "VERIMAIL_METRICS_TOKEN=" in run.stdout, output

    # A second run reuses the account and prints the same key; with a metrics token it says
    # where the metrics are, never printing the token.
    again = subprocess.run(
        [*command, "--no-bulk"],
        cwd=tmp_path,
        env=clean_env({**TIMEOUTS_ENV, "VERIMAIL_METRICS_TOKEN": "token-the-demo-must-not-print"}),
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert key.group(0) in again.stdout
    assert f"{base}/metrics" in again.stdout and "Metrics: off" not in again.stdout
    assert "token-the-demo-must-not-print" not in again.stdout + again.stderr


def test_demo_stopped_by_sigterm_ends_as_on_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM (a service manager, `kill`) ends the demo cleanly: "demo stopped" and exit 0.
    uvicorn raised the signal again after its shutdown, which killed the process there."""
    import signal

    port = free_port()
    command = [str(VERIMAIL_BIN), "demo", "--no-bulk", "--port", str(port)]
    demo = subprocess.Popen(
        command, cwd=tmp_path, env=clean_env(TIMEOUTS_ENV), stdout=subprocess.PIPE, text=True
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
        assert demo.wait(timeout=PATIENCE) == 0, rest
        assert "demo stopped" in rest, rest
    finally:
        if demo.poll() is None:
            demo.kill()


def test_the_readmes_cli_commands_on_the_demo_never_wait_silently(
    tmp_path: Path, prefect_harness: None
) -> None:
    """Issue 44 points 3 and 6: with `make demo` serving, the README's CLI commands, in
    another shell pointed at the demo by the line the demo prints: `verimail bulk` on the
    demo's CSV writes its results after the first pass (its greylisted address put off,
    with the line that retries it, no 15-minute wait), in the demo's store, where `history
    job` finds it."""
    import signal

    from cli_helpers import folded, run_verimail
    from prefect.settings import PREFECT_API_URL

    prefect = {"PREFECT_API_URL": str(PREFECT_API_URL.value())}  # (the session's: no start-up)
    port = free_port()
    command = [str(VERIMAIL_BIN), "demo", "--no-prefect-ui", "--port", str(port)]
    demo = subprocess.Popen(
        command, cwd=tmp_path, env=clean_env(prefect), stdout=subprocess.PIPE, text=True
    )
    try:
        assert demo.stdout is not None
        said = []
        for line in demo.stdout:
            said.append(line)
            if line.startswith("Serving on"):
                break
        else:
            raise AssertionError("".join(said))
        (export,) = [line for line in said if line.startswith("export VERIMAIL_DATA_DIR=")]
        env = clean_env({**prefect, **dict(w.split("=", 1) for w in shlex.split(export)[1:])})
        bulk = run_verimail(["bulk", ".verimail/demo/demo.csv"], env, timeout=240, cwd=tmp_path)
        assert bulk.returncode == 0, bulk.stderr
        text = folded(bulk.stderr)
        assert f"store: {tmp_path / '.verimail' / 'demo'}" in text, text
        assert "put off by their servers" in text and "verimail retry" in text, text
        job = re.search(r"^job (\d+):", bulk.stderr, re.MULTILINE)
        assert job is not None, bulk.stderr
        # (the README's `history job 1`: the demo's own job, in the one store)
        history = run_verimail(["history", "job", "1", "--format", "csv"], env, cwd=tmp_path)
        assert history.returncode == 0, history.stderr
        assert "alice@acme.test" in history.stdout, history.stdout
        demo.send_signal(signal.SIGTERM)
        demo.stdout.read()
        assert demo.wait(timeout=60) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
