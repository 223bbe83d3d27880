"""Authorisation: another account's job is a 404 on every job endpoint (found by walking
the app's routes, so a new endpoint is covered without editing this file); a revoked key
is refused on the very next request, in this process and in another one; raw keys never
reach a log line, whatever the outcome of the request.

Already covered elsewhere and not repeated: the plan limits shared between two app
instances through Redis (``test_api_ratelimit``), keys stored hashed (``test_api_keys``).
Added here: the same limit across two real ``verimail serve`` processes.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import httpx
import pytest
import redis
from api_helpers import (
    RecordingRunner,
    api_world,
    assert_error_body,
    env_for_testbed,
    make_customer,
    running_app,
    serve_processes,
)

from verimail.api import app as app_module
from verimail.config import Settings
from verimail.store.accounts import DISPLAY_PREFIX_LENGTH, create_api_key, list_keys, revoke_key
from verimail.store.db import init_store

OWN_404 = "a 404 about the owner's job, not 'no such job'"
PEOPLE_CSV = b"first_name,last_name,domain\nAlice,Smith,acme.test\n"


@pytest.fixture
def settings(testbed_factory, testbed_settings, tmp_path):
    return testbed_settings(testbed_factory(api_world()), tmp_path)


@pytest.fixture
def no_flows(monkeypatch: pytest.MonkeyPatch) -> RecordingRunner:
    runner = RecordingRunner()
    monkeypatch.setattr(app_module, "make_runner", lambda _settings: runner)
    return runner


def _job_paths(app) -> list[str]:
    """Every published GET path that takes a job id."""
    return [
        path
        for path, operations in app.openapi()["paths"].items()
        if path.startswith("/api/") and "{job_id}" in path and "get" in operations
    ]


async def test_other_accounts_jobs_are_404_everywhere(settings, no_flows):
    async with running_app(settings) as app:
        owner, other = app.customer(credits=20), app.customer(credits=20)
        created = [
            await app.client.post(
                "/api/bulk",
                headers=owner.headers,
                files={"file": ("l.csv", b"email\nalice@acme.test\n", "text/csv")},
            ),
            await app.client.post(
                "/api/verify/bulk", headers=owner.headers, json={"emails": ["bob@acme.test"]}
            ),
            await app.client.post(
                "/api/find-email/csv",
                headers=owner.headers,
                files={"file": ("p.csv", PEOPLE_CSV, "text/csv")},
            ),
        ]
        ids: set[str] = set()
        for response in created:
            assert response.status_code == 200, response.text
            body = response.json()
            ids.add(str(body["job_id"]))
        assert len(no_flows.submitted) == 3
        paths = _job_paths(app.app)
        assert len(paths) >= 5, paths
        variants = ["", "?format=parquet", "?include=details", "?neutralise_formulas=true"]
        for path in paths:
            seen_by_owner = set()
            for job_id in sorted(ids):
                for query in variants if path.endswith("/download") else [""]:
                    url = path.replace("{job_id}", job_id) + query
                    mine = await app.client.get(url, headers=owner.headers)
                    if mine.status_code == 422:
                        continue  # an id of the other style (integer vs public id)
                    theirs = await app.client.get(url, headers=other.headers)
                    assert_error_body(theirs, 404)
                    # Exactly what an id that never existed gets: nothing leaks.
                    unknown = path.replace("{job_id}", "9" + job_id) + query
                    never = await app.client.get(unknown, headers=owner.headers)
                    assert never.status_code == 404
                    hidden = never.json()["detail"].replace("9" + job_id, "X")
                    assert theirs.json()["detail"].replace(job_id, "X") == hidden
                    if mine.status_code != 404:
                        seen_by_owner.add(mine.status_code)
                    elif mine.json()["detail"].replace(job_id, "X") != hidden:
                        seen_by_owner.add(OWN_404)  # e.g. the list has no schedule yet
            # The owner reaches the job through each route: 200, 409 before completion, or a
            # 404 about the job's own state (a list with no schedule), not "no such job".
            assert seen_by_owner & {200, 409, OWN_404}, (path, seen_by_owner)


async def test_revoked_key_is_refused_at_once_in_every_process(settings):
    async with running_app(settings) as one, running_app(settings) as two:
        customer = one.customer(credits=10)
        spare, _ = create_api_key(one.store.engine, customer.account_id, name="spare")
        for app in (one, two):
            ok = await app.client.post(
                "/api/verify/single", json={"email": "x"}, headers=customer.headers
            )
            assert ok.status_code == 200, ok.text
        (first, _spare) = list_keys(one.store.engine, customer.account_id)
        assert revoke_key(one.store.engine, customer.account_id, first.id)
        for app in (one, two):  # the other "process" has cached nothing
            refused = await app.client.post(
                "/api/verify/single", json={"email": "x"}, headers=customer.headers
            )
            assert "revoked" in assert_error_body(refused, 401)
            assert refused.headers["www-authenticate"] == "Bearer"
        still = await two.client.post(
            "/api/verify/single", json={"email": "x"}, headers={"Authorization": f"Bearer {spare}"}
        )
        assert still.status_code == 200  # only the revoked key stopped working


async def test_raw_keys_never_reach_the_logs(
    settings, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
):
    """A whole cycle — success, every refusal, an upload, a crash inside a request — logged
    at DEBUG for every logger: neither a valid, a wrong nor a revoked key shows up."""
    caplog.set_level(logging.DEBUG)
    async with running_app(settings, raise_app_exceptions=False) as app:
        customer = app.customer(credits=3)
        revoked, _ = create_api_key(app.store.engine, customer.account_id, name="old")
        info = [k for k in list_keys(app.store.engine, customer.account_id) if k.name == "old"]
        revoke_key(app.store.engine, customer.account_id, info[0].id)
        wrong = "vm_" + secrets.token_urlsafe(32)
        good = customer.headers
        calls = [
            ("POST", "/api/verify/single", good, {"json": {"email": "alice@acme.test"}}),
            ("POST", "/api/verify/batch", good, {"json": {"emails": ["a@acme.test"] * 5}}),  # 402
            ("POST", "/api/verify/single", good, {"json": {"nope": 1}}),  # 422
            ("GET", "/api/bulk/424242", good, {}),  # 404
            ("POST", "/api/bulk", good, {"files": {"file": ("x.csv", b"\x89PNG", "image/png")}}),
            ("POST", "/api/verify/single", {"Authorization": f"Bearer {wrong}"}, {"json": {}}),
            ("POST", "/api/verify/single", {"Authorization": f"Bearer {revoked}"}, {"json": {}}),
            ("POST", "/api/verify/single", {"Authorization": f"Basic {wrong}"}, {"json": {}}),
            ("POST", "/api/verify/single", {"Authorization": wrong}, {"json": {}}),
            ("GET", "/api/nowhere", good, {}),
        ]
        for method, url, headers, kwargs in calls:
            response = await app.client.request(method, url, headers=headers, **kwargs)
            assert response.status_code < 500, (url, response.text)

        def crash(*args, **kwargs):
            raise RuntimeError("engine exploded")

        app.app.state.engine.verify = crash  # an unexpected error inside a charged request
        response = await app.client.post(
            "/api/verify/single", json={"email": "bob@acme.test"}, headers=good
        )
        assert_error_body(response, 500)
    captured = capfd.readouterr()
    logged = "\n".join(
        [r.getMessage() + (r.exc_text or "") for r in caplog.records] + [captured.out, captured.err]
    )
    assert "engine exploded" in logged  # the log was really captured
    for key in (customer.key, revoked, wrong):
        assert key not in logged
        assert key[DISPLAY_PREFIX_LENGTH:] not in logged


@pytest.mark.redis
async def test_rate_limit_holds_across_two_serve_processes(testbed_factory, tmp_path: Path):
    """Two ``verimail serve`` processes on one database and one Redis: a free account's 10
    requests a minute are 10 in total, whichever process they hit; no key in their logs."""
    # ``verimail serve`` uses the default key prefix, so this test takes a Redis database
    # of its own (1-15, by chance) and clears its account's keys before and after.
    url = f"redis://127.0.0.1:6379/{secrets.randbelow(15) + 1}"
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {url} did not answer: {exc}")
    tb = testbed_factory(api_world())
    data = tmp_path / "data"
    store = init_store(Settings(data_dir=data))
    try:
        free = make_customer(store, plan="free", credits=100)
    finally:
        store.close()

    def clear() -> None:
        for key in client.scan_iter(match=f"verimail:*{free.account_id}*"):
            client.delete(key)

    clear()
    env = {
        **env_for_testbed(tb),
        "VERIMAIL_DATA_DIR": str(data),
        "VERIMAIL_REDIS_URL": url,
        "VERIMAIL_PREFECT_WARM_UP": "false",
    }
    try:
        with serve_processes(2, env, tmp_path) as servers:
            async with httpx.AsyncClient(timeout=30) as http:
                statuses = []
                for i in range(12):
                    response = await http.post(
                        servers[i % 2].base_url + "/api/verify/single",
                        json={"email": "not-an-address"},
                        headers=free.headers,
                    )
                    statuses.append(response.status_code)
                assert statuses[:10] == [200] * 10, statuses
                assert statuses[10:] == [429, 429], statuses
            logs = "".join(server.log() for server in servers)
        assert free.key not in logs and free.key[DISPLAY_PREFIX_LENGTH:] not in logs
    finally:
        clear()
        client.close()


async def test_a_401_never_echoes_a_key_glued_to_its_scheme(settings):
    """The reason for a 401 names a plain scheme (Basic) to help, but never a "scheme" that
    holds the key itself: ``Bearer:vm_…``, ``Bearer=vm_…`` or ``Bearer<TAB>vm_…``."""
    async with running_app(settings) as app:
        customer = app.customer(credits=1)
        random_part = customer.key[len("vm_") :]
        for header in (
            f"Bearer:{customer.key}",
            f"Bearer={customer.key}",
            f"Bearer\t{customer.key}",
            customer.key,
            f"X{customer.key[1:]}",  # (not even a key's lookalike is echoed)
        ):
            response = await app.client.post(
                "/api/verify/single", json={"email": "x"}, headers={"Authorization": header}
            )
            detail = assert_error_body(response, 401)
            assert random_part[:6] not in detail, (header, detail)
        basic = await app.client.post(
            "/api/verify/single", json={"email": "x"}, headers={"Authorization": "Basic abc"}
        )
        assert "'Basic'" in assert_error_body(basic, 401)
