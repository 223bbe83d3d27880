"""The demo serves the Prefect UI on the port it prints, analytics off, and stops it on exit."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import httpx
from api_helpers import VERIMAIL_BIN, clean_env, free_port


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
        command, cwd=tmp_path, env=clean_env({}), stdout=subprocess.PIPE, text=True
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
        with httpx.Client(timeout=10) as client:
            page = client.get(url, headers={"Accept": "text/html"}, follow_redirects=True)
            assert page.status_code == 200
            assert "<html" in page.text.lower() and "prefect" in page.text.lower()
            settings = client.get(f"{url}/api/admin/settings").json()
            assert settings["server"]["analytics_enabled"] is False
        demo.send_signal(signal.SIGTERM)
        rest = demo.stdout.read()
        assert demo.wait(timeout=60) == 0, rest
    finally:
        if demo.poll() is None:
            demo.kill()
    # The Prefect server went with the demo (no server left running per demo started).
    with httpx.Client(timeout=2) as client:
        try:
            client.get(f"{url}/api/health")
        except httpx.TransportError:
            pass
        else:
            raise AssertionError(f"the Prefect server at {url} outlived the demo")
