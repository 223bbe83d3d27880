"""The demo (by default) and ``verimail serve --prefect-ui-port`` serve the Prefect UI on the
port they print, analytics off, and stop it when they stop."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
from api_helpers import PATIENCE, TIMEOUTS_ENV, VERIMAIL_BIN, clean_env, free_port, serve_processes


def test_demo_prints_the_prefect_ui_and_it_answers(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    command = [
        str(VERIMAIL_BIN),
        "demo",
        "--no-bulk",
        "--port",
        str(port),
        "--prefect-ui-port",
        str(ui_port),
    ]
    demo = subprocess.Popen(
        command, cwd=tmp_path, env=clean_env(TIMEOUTS_ENV), stdout=subprocess.PIPE, text=True
    )
    seen: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("Serving on"):
                break
        else:
            raise AssertionError("the demo ended before it served:\n" + "".join(seen))
        printed = re.search(r"^Prefect UI (http://\S+)$", "".join(seen), re.MULTILINE)
        assert printed, "".join(seen)
        url = printed.group(1)
        assert url == f"http://127.0.0.1:{ui_port}"
        with httpx.Client(timeout=60) as client:
            page = client.get(url, headers={"Accept": "text/html"}, follow_redirects=True)
            assert page.status_code == 200
            assert "<html" in page.text.lower() and "prefect" in page.text.lower()
            settings = client.get(f"{url}/api/admin/settings").json()
            assert settings["server"]["analytics_enabled"] is False
            # The deployments the demo promises, and a worker on their pool (issue 36.2):
            # not "Not Ready", so a run started from a form runs.
            deadline = time.monotonic() + PATIENCE  # (ready once the worker polls their queue)
            while True:
                deployments = client.post(f"{url}/api/deployments/filter", json={}).json()
                if {d["status"] for d in deployments} == {"READY"} or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert {d["name"] for d in deployments} >= {
                "bulk-verify",
                "find-emails",
                "verify-shard",
                "reverify-stored",
            }, deployments
            assert {d["work_pool_name"] for d in deployments} == {"verimail"}
            assert {d["status"] for d in deployments} == {"READY"}, deployments
            workers = client.post(f"{url}/api/work_pools/verimail/workers/filter", json={})
            assert [w["status"] for w in workers.json()] == ["ONLINE"], workers.text
            # A run made from bulk-verify's form (what Run → Custom run posts) is run.
            inbox = tmp_path / ".verimail" / "demo" / "inbox"
            inbox.mkdir(parents=True, exist_ok=True)
            (inbox / "leads.csv").write_text("email\nalice@acme.test\nnobody@acme.test\n")
            bulk = next(d for d in deployments if d["name"] == "bulk-verify")
            form = {"verify": {"account": "demo@verimail.localhost", "file": "inbox/leads.csv"}}
            run = client.post(
                f"{url}/api/deployments/{bulk['id']}/create_flow_run", json={"parameters": form}
            ).json()
            deadline = time.monotonic() + PATIENCE  # (the worker polls every 10 s, then starts it)
            while True:
                state = client.get(f"{url}/api/flow_runs/{run['id']}").json()["state"]
                if state["type"] in ("COMPLETED", "FAILED", "CRASHED"):
                    break
                assert time.monotonic() < deadline, state
                time.sleep(0.5)
            assert state["type"] == "COMPLETED", state
        demo.send_signal(signal.SIGTERM)
        rest = demo.stdout.read()
        assert demo.wait(timeout=PATIENCE) == 0, rest
    finally:
        if demo.poll() is None:
            demo.kill()
    _assert_gone(url)  # (no server left running per demo started)
    assert not _processes_naming(f"verimail-{demo.pid}"), "the demo's worker outlived it"


def _processes_naming(word: str) -> list[int]:
    """Processes whose command line holds ``word`` (a worker's ``--name``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if word in command.split():
                found.append(int(entry.name))
    return found


def _assert_gone(url: str) -> None:
    with httpx.Client(timeout=2) as client:
        try:
            client.get(f"{url}/api/health")
        except httpx.TransportError:
            return
    raise AssertionError(f"the Prefect server at {url} outlived the process that started it")


def test_serve_with_a_prefect_ui_port_serves_it_and_its_jobs_report_there(tmp_path: Path) -> None:
    ui_port = free_port()
    env = {"VERIMAIL_DATA_DIR": str(tmp_path / "data")}
    args = ["--prefect-ui-port", str(ui_port)]
    with serve_processes(1, env, tmp_path, args=args) as (server,):
        printed = re.search(r"^Prefect UI: (http://\S+)$", server.log(), re.MULTILINE)
        assert printed, server.log()
        url = printed.group(1)
        assert url == f"http://127.0.0.1:{ui_port}"
        with httpx.Client(timeout=60) as client:
            page = client.get(url, headers={"Accept": "text/html"}, follow_redirects=True)
            assert page.status_code == 200 and "prefect" in page.text.lower()
        assert (tmp_path / "data" / "prefect.db").exists()  # (its state in the data dir)
    assert server.process.returncode == 0, server.log()
    _assert_gone(url)


def test_serve_refuses_a_ui_port_when_prefect_is_elsewhere(tmp_path: Path) -> None:
    """With PREFECT_API_URL the runs report to that server: its UI is the one to use."""
    env = clean_env({"PREFECT_API_URL": "http://127.0.0.1:9/api"})
    run = subprocess.run(
        [str(VERIMAIL_BIN), "serve", "--port", str(free_port()), "--prefect-ui-port", "4999"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "PREFECT_API_URL" in run.stderr and "Traceback" not in run.stderr


def test_building_the_api_imports_no_prefect() -> None:
    """``serve --prefect-ui-port`` must point Prefect's client at its UI server before the
    first Prefect import, and it builds the app first: a module of the app that imports
    Prefect at its top (the finder route did, through the finder flow) stops the UI."""
    import sys

    probe = (
        "import sys, verimail.api.app, verimail.cli.serve, verimail.cli.demo\n"
        "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout[:2000]


def _time_wait_on(port: int) -> None:
    """Leave a connection of a server on ``127.0.0.1:port`` in TIME_WAIT (the server closes
    first, as a stopped server does) and its listener closed."""
    import socket

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # (the side that closes first keeps the TIME_WAIT)
    assert client.recv(1) == b""  # its FIN arrived
    client.close()
    listener.close()


def test_port_check_ignores_time_wait_but_not_a_listener() -> None:
    """Issue 36: a demo restarted within a minute was told "port 4200 is in use" while only
    TIME_WAIT sockets of the stopped server were left."""
    import errno
    import socket

    from verimail.runners.prefect_ui import port_free

    port = free_port()
    _time_wait_on(port)
    with socket.socket() as plain:  # the old check: a bind without SO_REUSEADDR fails here
        try:
            plain.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
        else:
            raise AssertionError("no TIME_WAIT socket was left to test with")
    assert port_free(port)
    with socket.socket() as listening:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(("127.0.0.1", port))
        listening.listen()
        assert not port_free(port)
