"""Issue 25's API additions, over real HTTP against the testbed: ``GET /api/account``, the
``segment`` of a bulk download, and the verdict on a typo of a major provider's domain
(also in the details CSV, the Parquet file and the CLI table)."""

from __future__ import annotations

import csv
import io
import subprocess

import polars as pl
import pytest
from api_helpers import (
    VERIMAIL_BIN,
    api_world,
    assert_error_body,
    clean_env,
    env_for_testbed,
    poll_job,
    running_app,
)

from verimail.store.accounts import set_finder
from verimail.store.billing.movements import charge
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World


def _world() -> World:
    """The API world plus a domain whose server refuses us (every address ``unknown``)."""
    base = api_world()
    return World.of(
        hosts=[*base.hosts.values(), HostSpec("mx.blocked.test", HostBehaviour(block=True))],
        domains=[
            *base.domains.values(),
            DomainSpec("blocked.test", mx=[(10, "mx.blocked.test")]),
        ],
    )


@pytest.fixture
def tb(testbed_factory):
    return testbed_factory(_world())


@pytest.fixture
def settings(tb, testbed_settings, tmp_path):
    return testbed_settings(tb, tmp_path)


# --- GET /api/account ----------------------------------------------------------------------


async def test_account_shows_balance_plan_limits_and_finder(settings):
    async with running_app(settings) as app:
        free = app.customer(plan="free", credits=40)
        set_finder(app.store.engine, free.account_id, False)
        body = (await app.client.get("/api/account", headers=free.headers)).json()
        assert body["account_id"] == free.account_id and body["plan"] == "free"
        assert body["balance"] == {
            "total": 65,
            "prepaid": 40,
            "allowance": 25,
            "allowance_remaining": 25,
            "allowance_resets_at": body["balance"]["allowance_resets_at"],
        }
        assert body["balance"]["allowance_resets_at"].endswith(("Z", "+00:00"))
        assert body["limits"]["requests_per_minute"] == 10
        assert body["limits"]["concurrent_requests"] == 1
        assert body["limits"]["upload_max_bytes"] == settings.upload_max_bytes
        assert body["finder_enabled"] is False
        assert "verimail credits grant" in body["upgrade"]

        # Spending moves the figures: the allowance goes first, then prepaid credits.
        await app.client.post(
            "/api/verify/single", json={"email": "alice@acme.test"}, headers=free.headers
        )
        after = (await app.client.get("/api/account", headers=free.headers)).json()
        assert after["balance"]["allowance_remaining"] == 24 and after["balance"]["total"] == 64

        rich = app.customer(plan="enterprise", credits=500)
        set_finder(app.store.engine, rich.account_id, True)
        charge(app.store.engine, rich.account_id, 3, reason="test")
        other = (await app.client.get("/api/account", headers=rich.headers)).json()
        assert other["account_id"] == rich.account_id and other["plan"] == "enterprise"
        assert other["balance"]["prepaid"] == 497 and other["balance"]["allowance"] is None
        assert other["limits"]["requests_per_minute"] is None
        assert other["finder_enabled"] is True
        assert other["finder_credits_per_find"] == settings.finder_charge

        refused = await app.client.get("/api/account")
        assert_error_body(refused, 401)


async def test_account_is_in_the_openapi_document(settings):
    async with running_app(settings) as app:
        spec = (await app.client.get("/openapi.json")).json()
    operation = spec["paths"]["/api/account"]["get"]
    assert operation["summary"] and {"200", "401", "429"} <= set(operation["responses"])


# --- the typo verdict ----------------------------------------------------------------------


async def test_a_typo_of_gmail_is_a_probable_typo_never_disposable(settings):
    async with running_app(settings) as app:
        customer = app.customer()
        response = await app.client.post(
            "/api/verify/single", json={"email": "someone@gmial.com"}, headers=customer.headers
        )
    body = response.json()
    assert (body["status"], body["sub_status"]) == ("invalid", "possible_typo"), body
    assert body["did_you_mean"] == "someone@gmail.com"
    assert body["reason"].endswith("did you mean gmail.com?")
    assert body["is_disposable"] is False and body["safe_to_send"] is False
    assert body["smtp_response"] is None  # a typo domain's server is never asked


def test_cli_table_shows_sub_status_and_did_you_mean(tb, tmp_path):
    env = clean_env({**env_for_testbed(tb), "VERIMAIL_DATA_DIR": str(tmp_path), "COLUMNS": "250"})
    out = subprocess.run(
        [str(VERIMAIL_BIN), "verify", "someone@gmial.com", "nobody@acme.test"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    header = next(line for line in out.stdout.splitlines() if "sub_status" in line)
    assert "did_you_mean" in header
    typo = next(line for line in out.stdout.splitlines() if "someone@gmial.com" in line)
    assert "possible_typo" in typo and "someone@gmail.com" in typo
    missing = next(line for line in out.stdout.splitlines() if "nobody@acme.test" in line)
    assert "mailbox_not_found" in missing


# --- segment downloads ---------------------------------------------------------------------

UPLOAD = (
    "id,email\r\n"
    "1,alice@acme.test\r\n"  # valid
    "2,nobody@acme.test\r\n"  # invalid
    "3,john.smith@catchall.test\r\n"  # catch-all, likely valid
    "4,someone@gmial.com\r\n"  # invalid: possible typo
    "5,\r\n"  # no address: in no segment
    "6,bob@blocked.test\r\n"  # unknown: the server refused us
    "7,bob@acme.test\r\n"  # valid
)


def _rows(response) -> list[list[str]]:
    assert response.status_code == 200, response.text
    return list(csv.reader(io.StringIO(response.content.decode("utf-8"))))


@pytest.mark.usefixtures("prefect_harness")
async def test_segment_downloads_split_the_list(settings):
    async with running_app(settings) as app:
        customer = app.customer()
        files = {"file": ("list.csv", UPLOAD.encode(), "text/csv")}
        created = await app.client.post("/api/bulk", headers=customer.headers, files=files)
        job_id = created.json()["job_id"]
        done = await poll_job(app.client, f"/api/bulk/{job_id}", customer.headers)
        assert done["status"] == "completed", done
        url = f"/api/bulk/{job_id}/download"

        def get(query: str):
            return app.client.get(url + query, headers=customer.headers)

        whole = _rows(await get(""))
        assert [r[0] for r in whole[1:]] == ["1", "2", "3", "4", "5", "6", "7"]  # unchanged
        ids = {}
        for segment in ("valid", "valid_and_catchall", "invalid", "unknown"):
            rows = _rows(await get(f"?segment={segment}"))
            assert rows[0] == ["id", "email", "Safe to Send"]
            ids[segment] = [r[0] for r in rows[1:]]
        assert ids == {
            "valid": ["1", "7"],
            "valid_and_catchall": ["1", "3", "7"],
            "invalid": ["2", "4"],
            "unknown": ["6"],
        }
        segmented = await get("?segment=valid")
        assert 'filename="bulk-' in segmented.headers["content-disposition"]
        assert "valid" in segmented.headers["content-disposition"]

        # With details: the typo's sub-status and suggestion are columns of the CSV.
        details = _rows(await get("?segment=invalid&include=details"))
        assert details[0] == [
            "id",
            "email",
            "Safe to Send",
            "Status",
            "Sub Status",
            "Reason",
            "Score",
            "Did You Mean",
        ]
        typo = details[2]
        assert typo[:2] == ["4", "someone@gmial.com"]
        assert typo[3:5] == ["invalid", "possible_typo"]
        assert typo[-1] == "someone@gmail.com"
        all_details = _rows(await get("?include=details"))
        assert all_details[5][3:] == ["", "", "The cell holds no address.", "", ""]

        # Parquet: the same segments, every result field (did_you_mean, sub_status too).
        parquet = await get("?format=parquet&segment=valid_and_catchall")
        assert parquet.status_code == 200 and parquet.content[:4] == b"PAR1"
        frame = pl.read_parquet(io.BytesIO(parquet.content)).sort("row")
        assert frame.get_column("email").to_list() == [
            "alice@acme.test",
            "john.smith@catchall.test",
            "bob@acme.test",
        ]
        full = pl.read_parquet(io.BytesIO((await get("?format=parquet")).content))
        typo_row = full.filter(pl.col("email") == "someone@gmial.com").row(0, named=True)
        assert typo_row["sub_status"] == "possible_typo"
        assert typo_row["did_you_mean"] == "someone@gmail.com"

        bad = await get("?segment=catchall")
        assert "segment" in assert_error_body(bad, 422)
