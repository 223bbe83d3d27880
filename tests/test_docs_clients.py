"""docs/clients.md as a user runs it: its Python (httpx) and JavaScript (Node's fetch)
programs, taken out of the page, upload a CSV to a real ``verimail serve`` process on
loopback, poll the job and download its results; a refused request stops them with the
API's ``detail``. The page cannot drift from the API without failing here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from api_helpers import api_world, clean_env, make_customer, serve_processes
from hardening_helpers import serve_env

from verimail.config import Settings
from verimail.store.db import init_store

pytestmark = pytest.mark.usefixtures("prefect_harness")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "clients.md"
UPLOAD = "name,email\nAlice,alice@acme.test\nNobody,nobody@acme.test\nAny,anyone@catchall.test\n"
NODE = shutil.which("node")


def code_block(language: str) -> str:
    """The page's one code block in ``language``."""
    [block] = re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), re.M | re.S)
    return block


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, env=clean_env(env), cwd=cwd, capture_output=True, text=True, timeout=180
    )


def test_the_python_and_javascript_clients_upload_poll_and_download(
    testbed_factory, tmp_path: Path
) -> None:
    tb = testbed_factory(api_world())
    data = tmp_path / "data"
    store = init_store(Settings(data_dir=data))
    try:
        customer = make_customer(store, credits=100)
    finally:
        store.close()
    env = serve_env(tb, str(Settings(data_dir=data).database_url), data)
    (tmp_path / "list.csv").write_text(UPLOAD)
    (tmp_path / "verify_list.py").write_text(code_block("python"))
    (tmp_path / "verify_list.mjs").write_text(code_block("js"))
    programs = {"python": [sys.executable, "verify_list.py"]}
    if NODE is not None:
        programs["js"] = [NODE, "verify_list.mjs"]
    with serve_processes(1, env, tmp_path) as [server]:
        client_env = {"VERIMAIL_URL": server.base_url, "VERIMAIL_KEY": customer.key}
        for language, program in programs.items():
            target = tmp_path / f"results-{language}.csv"
            done = _run([*program, "list.csv", target.name], client_env, tmp_path)
            assert done.returncode == 0, (language, done.stdout, done.stderr)
            job_id = int(re.search(r"job (\d+):", done.stdout)[1])
            assert "1 valid, 1 invalid" in done.stdout, done.stdout
            served = httpx.get(
                f"{server.base_url}/api/bulk/{job_id}/download", headers=customer.headers
            )
            assert target.read_bytes() == served.content, language
            assert target.read_text().splitlines() == [
                "name,email,Safe to Send",
                "Alice,alice@acme.test,Yes",
                "Nobody,nobody@acme.test,No",
                "Any,anyone@catchall.test,No",
            ]
            refused = _run(
                [*program, "list.csv", "never.csv"],
                {**client_env, "VERIMAIL_KEY": "vm_not-a-key"},
                tmp_path,
            )
            assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr
            assert "Invalid API key" in refused.stderr, refused.stderr
            assert not (tmp_path / "never.csv").exists()
    assert NODE is not None, "node is not installed: the JavaScript client was not run"
