"""docs/webhooks.md against real deliveries: a bulk job and a finder job post their final
state to a real HTTP receiver on loopback; the page's Python signature check (taken out of
the page and run) accepts each delivery as received and refuses it altered, signed with
another secret or replayed late; its JavaScript check, run by Node, does the same; and the
page's sample payloads have exactly the fields of the real ones."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from api_helpers import poll_job, running_app
from test_webhooks import Receiver

from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "webhooks.md"
NODE = shutil.which("node")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


@pytest.fixture
def tb(testbed_factory):
    host = HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice", "john.smith"}))
    return testbed_factory(World.of([host], [DomainSpec("acme.test", mx=[(10, "mx.acme.test")])]))


async def _deliveries(settings, receiver: Receiver) -> list[tuple[str, dict, bytes]]:
    """(secret, headers, body) of a bulk job's and a finder job's real deliveries."""
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        bulk = await app.client.post(
            "/api/verify/bulk",
            headers=customer.headers,
            json={"emails": ["alice@acme.test", "nobody@acme.test"], "webhook_url": receiver.url},
        )
        finder = await app.client.post(
            "/api/find-email/csv",
            headers=customer.headers,
            files={"file": ("people.csv", b"first_name,last_name,domain\nJohn,Smith,acme.test\n")},
            data={"webhook_url": receiver.url},
        )
        assert bulk.status_code == finder.status_code == 200, (bulk.text, finder.text)
        await poll_job(app.client, f"/api/verify/bulk/{bulk.json()['job_id']}", customer.headers)
        await poll_job(
            app.client, f"/api/find-email/csv/{finder.json()['job_id']}", customer.headers
        )
        deadline = time.monotonic() + 60
        while len(receiver.requests) < 2:
            assert time.monotonic() < deadline, receiver.requests
            await asyncio.sleep(0.05)
    by_id = {json.loads(body)["job_id"]: (headers, body) for headers, body in receiver.requests}
    return [(job.json()["webhook_secret"], *by_id[job.json()["job_id"]]) for job in (bulk, finder)]


def _node_check(secret: str, headers: dict[str, str], body: bytes, tmp_path: Path) -> str:
    """The page's JavaScript check, run by Node on a delivery as a Node server gets it
    (header names in lower case, the raw body)."""
    assert NODE is not None, "node is not installed: the JavaScript check was not run"
    [code] = _blocks("js")
    (tmp_path / "check.mjs").write_text(
        code
        + "\nimport { readFileSync } from 'node:fs';\n"
        + "const [secret, headers, body] = JSON.parse(readFileSync(0, 'utf8'));\n"
        + "console.log(verifySignature(secret, headers, Buffer.from(body, 'base64')));\n"
    )
    lower = {name.lower(): value for name, value in headers.items()}
    stdin = json.dumps([secret, lower, base64.b64encode(body).decode()])
    done = subprocess.run(
        [NODE, str(tmp_path / "check.mjs")], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _shape(payload: Any) -> Any:
    """The fields of a payload and the JSON type of each value."""
    return {key: type(value).__name__ for key, value in payload.items()}


async def test_the_documented_checks_accept_real_deliveries_and_refuse_forgeries(
    tb, testbed_settings, tmp_path
):
    settings = testbed_settings(tb, tmp_path, webhook_allow_networks=["127.0.0.0/8"])
    with Receiver() as receiver:
        deliveries = await _deliveries(settings, receiver)
    [code] = _blocks("python")
    page: dict[str, Any] = {}
    exec(compile(code, str(PAGE), "exec"), page)
    verify = page["verify_signature"]
    for secret, headers, body in deliveries:
        assert verify(secret, headers, body) is True
        assert verify(secret, headers, body.replace(b'"completed"', b'"failed"')) is False
        assert verify("another secret", headers, body) is False
        late = int(headers["X-Verimail-Timestamp"]) + 301
        assert verify(secret, headers, body, now=late) is False
        assert verify(secret, {**headers, "X-Verimail-Signature": "sha256=00"}, body) is False
        assert verify(secret, {}, body) is False
    secret, headers, body = deliveries[0]
    assert _node_check(secret, headers, body, tmp_path) == "true"
    assert _node_check(secret, headers, body + b" ", tmp_path) == "false"
    assert _node_check("another secret", headers, body, tmp_path) == "false"

    # The page's samples are real payloads: the same fields, the same types.
    samples = [json.loads(block) for block in _blocks("json")]
    real = [json.loads(body) for _, _, body in deliveries]
    # (The failure shows the real payloads, ready to paste into the page.)
    assert [_shape(s) for s in samples] == [_shape(p) for p in real], "\n".join(
        json.dumps(payload, indent=2) for payload in real
    )
