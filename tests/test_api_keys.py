"""API keys are stored hashed: after issuing keys and using them, no raw key (nor its
secret part) is anywhere in the database file, its WAL, or a dump of every table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from api_helpers import api_world, running_app

from verimail.store.accounts import DISPLAY_PREFIX_LENGTH, hash_key


async def test_raw_keys_are_nowhere_in_the_database(
    testbed_factory, testbed_settings, tmp_path: Path
) -> None:
    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path)
    async with running_app(settings) as api:
        customers = [api.customer(credits=5), api.customer(plan="free", credits=5)]
        for customer in customers:
            response = await api.client.post(
                "/api/verify/single", json={"email": "alice@acme.test"}, headers=customer.headers
            )
            assert response.status_code == 200, response.text

    db_path = Path(settings.database_url.removeprefix("sqlite:///"))
    with sqlite3.connect(db_path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert {"accounts", "api_keys", "credit_ledger"} <= set(tables)
        dump = "\n".join(conn.iterdump())
        stored_hashes = {r[0] for r in conn.execute("SELECT key_hash FROM api_keys")}
    raw_files = b"".join(
        p.read_bytes() for p in db_path.parent.iterdir() if p.name.startswith(db_path.name)
    )
    for customer in customers:
        secret = customer.key[DISPLAY_PREFIX_LENGTH:]
        assert customer.key not in dump and secret not in dump
        assert customer.key.encode() not in raw_files and secret.encode() not in raw_files
        assert hash_key(customer.key) in stored_hashes
