"""Concurrent requests never overdraw: 50 singles on 20 credits give exactly 20 × 200 and
30 × 402, on SQLite (one app, concurrent ASGI requests) and on PostgreSQL (two uvicorn
processes sharing the database)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest
from api_helpers import (
    api_world,
    env_for_testbed,
    make_customer,
    running_app,
    serve_processes,
    total_balance,
)

from verimail.config import Settings
from verimail.store.db import init_store
from verimail.store.testing import temporary_database_url

SINGLE = "/api/verify/single"
REQUESTS = 50
CREDITS = 20


def _check(statuses: list[int], bodies: list[dict]) -> None:
    assert Counter(statuses) == {200: CREDITS, 402: REQUESTS - CREDITS}, Counter(statuses)
    for status, body in zip(statuses, bodies, strict=True):
        if status == 200:
            assert body["status"] == "valid"
        else:
            assert body["detail"].startswith("Not enough credits: this request needs 1")


async def test_sqlite_50_concurrent_singles_on_20_credits(
    testbed_factory, testbed_settings, tmp_path: Path
) -> None:
    tb = testbed_factory(api_world())
    async with running_app(testbed_settings(tb, tmp_path)) as api:
        customer = api.customer(plan="enterprise", credits=CREDITS)
        responses = await asyncio.gather(
            *(
                api.client.post(SINGLE, json={"email": "alice@acme.test"}, headers=customer.headers)
                for _ in range(REQUESTS)
            )
        )
        _check([r.status_code for r in responses], [r.json() for r in responses])
        assert total_balance(api.store, customer.account_id) == 0


@pytest.mark.postgres
async def test_postgres_two_processes_50_concurrent_singles_on_20_credits(
    testbed_factory, tmp_path: Path
) -> None:
    tb = testbed_factory(api_world())
    with temporary_database_url("postgres", tmp_path) as url:
        settings = Settings(data_dir=tmp_path / "data", database_url=url)
        store = init_store(settings)
        try:
            customer = make_customer(store, plan="enterprise", credits=CREDITS)
            env = {
                **env_for_testbed(tb),
                "VERIMAIL_DATABASE_URL": url,
                "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
                # No job runs here: Prefect's embedded server, warmed at start-up, was still
                # starting when the test ended and outlived its killed parent (issue 36).
                "VERIMAIL_PREFECT_WARM_UP": "false",
            }
            with serve_processes(2, env, tmp_path) as servers:
                async with httpx.AsyncClient(timeout=60) as client:
                    responses = await asyncio.gather(
                        *(
                            client.post(
                                servers[i % 2].base_url + SINGLE,
                                json={"email": "alice@acme.test"},
                                headers=customer.headers,
                            )
                            for i in range(REQUESTS)
                        )
                    )
                _check([r.status_code for r in responses], [r.json() for r in responses])
            assert total_balance(store, customer.account_id) == 0
        finally:
            store.close()
