"""The job service (``jobs/create.py``): one way to make a job, whatever surface asks —
its reservation with the row, its refusals before anything is stored, its upload's
inspection kept with it so the run does not sniff the file again."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.api_helpers import RunningApp, poll_job, total_balance
from verimail.files import csv_detect, csv_io
from verimail.files.bulk_io import load_info, read_job_input, save_info
from verimail.jobs import create as job_service
from verimail.store import accounts as acc
from verimail.store import jobs as job_store
from verimail.store.db import Store
from verimail.store.testing import temporary_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with temporary_store("sqlite", tmp_path) as s:
        yield s


def _account(store: Store) -> int:
    """An Enterprise account with the 100 signup credits."""
    return acc.create_account(store.engine, store.settings, plan="enterprise").id


def _jobs_of(store: Store, account_id: int) -> list[job_store.Job]:
    return job_store.list_jobs(store.engine, account_id)


def test_a_verify_job_reserves_its_price_with_the_row(store: Store, tmp_path: Path) -> None:
    account_id = _account(store)
    job = job_service.create_verify_job(store, account_id, 40, upload=tmp_path / "u.csv")
    assert job.credits_reserved == 40
    assert total_balance(store, account_id) == 60


def test_short_of_credits_nothing_is_stored_or_charged(store: Store, tmp_path: Path) -> None:
    account_id = _account(store)
    with pytest.raises(job_service.NotEnoughCredits) as refused:
        job_service.create_verify_job(store, account_id, 101, upload=tmp_path / "u.csv")
    assert (refused.value.needed, refused.value.have) == (101, 100)
    assert _jobs_of(store, account_id) == []
    assert total_balance(store, account_id) == 100


def test_a_finder_job_needs_one_find_and_reserves_nothing(store: Store, tmp_path: Path) -> None:
    account_id = _account(store)
    job = job_service.create_finder_job(
        store, store.settings, account_id, 500, upload=tmp_path / "people.csv"
    )
    assert (job.kind, job.total_emails, job.credits_reserved) == ("finder_csv", 500, 0)
    assert total_balance(store, account_id) == 100

    poor = _account(store)
    job_store.create_job(store.engine, poor, "bulk_csv", 100, reserve=100)  # spends it all
    with pytest.raises(job_service.NotEnoughCredits) as refused:
        job_service.create_finder_job(
            store, store.settings, poor, 5, upload=tmp_path / "people.csv"
        )
    assert refused.value.have == 0
    assert [j.kind for j in _jobs_of(store, poor)] == ["bulk_csv"]


class _DownRunner:
    """A runner whose work pool is down."""

    def submit(
        self,
        kind: str,
        job_id: int,
        attempt: int | None = None,
        *,
        retry_pass: int = 0,
        at: datetime | None = None,
    ) -> None:
        raise RuntimeError("no work pool")

    def shutdown(self) -> None:
        return None


def test_a_job_that_cannot_start_is_failed_with_its_refund(store: Store, tmp_path: Path) -> None:
    account_id = _account(store)
    job = job_service.create_verify_job(store, account_id, 30, upload=tmp_path / "u.csv")
    with pytest.raises(job_service.NotStarted) as refused:
        job_service.submit(store, _DownRunner(), job)
    assert refused.value.settled == "its credits were refunded"
    failed = job_store.get_job_any(store.engine, job.id)
    assert failed is not None and failed.status == "failed"
    assert total_balance(store, account_id) == 100


def test_stored_inspection_loads_what_sniffing_would(tmp_path: Path) -> None:
    """The run's load from the kept inspection gives the rows a fresh sniff gives."""
    upload = tmp_path / "list.csv"
    upload.write_text(
        "Name;Backup;E-Mail\nAlice;x@acme.test;alice@acme.test\nBob;;Bob@ACME.test\n;;\n",
        encoding="utf-8",
    )
    save_info(tmp_path, csv_detect.inspect_csv(upload, max_rows=100, email_column="E-Mail"))
    kept = load_info(tmp_path)  # as the job's folder keeps it
    loaded = read_job_input(upload, "E-Mail", 100, kept)
    sniffed = read_job_input(upload, "E-Mail", 100)
    assert loaded.rows.equals(sniffed.rows)
    assert loaded.uniques == sniffed.uniques == ["alice@acme.test", "Bob@acme.test"]


@pytest.fixture
def sniffed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the sniffer reads from now on (it still reads them)."""
    seen: list[str] = []
    real = csv_detect.inspect_csv_cells

    def counting(path: Any, **kwargs: Any) -> Any:
        seen.append(Path(path).name)
        return real(path, **kwargs)

    monkeypatch.setattr(csv_detect, "inspect_csv_cells", counting)
    monkeypatch.setattr(csv_io, "inspect_csv_cells", counting)
    return seen


UPLOADS = {
    "bulk": ("/api/bulk", b"id;E-Mail\n1;alice@acme.test\n2;bob@acme.test\n", "E-Mail"),
    "finder": (
        "/api/find-email/csv",
        b"first_name;last_name;domain\nAlice;Smith;acme.test\n",
        None,
    ),
}


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("kind", UPLOADS)
async def test_an_api_upload_is_inspected_once(
    api: RunningApp, sniffed: list[str], kind: str
) -> None:
    """The API inspects the upload as it takes it; the run loads the file as the job's
    kept inspection says, without sniffing it a second time."""
    path, content, column = UPLOADS[kind]
    customer = api.customer(credits=50)
    created = await api.client.post(
        path,
        headers=customer.headers,
        files={"file": ("list.csv", content)},
        data={"email_column": column} if column else {},
    )
    assert created.status_code == 200, created.text
    job_id = created.json()["job_id"]
    done = await poll_job(api.client, f"{path}/{job_id}", customer.headers)
    assert done["status"] == "completed", done
    assert sniffed == ["upload.csv"]  # the API's inspection, and no other
    job = (
        job_store.get_job_any(api.store.engine, job_id)
        if kind == "bulk"
        else job_store.get_job_by_public_id(api.store.engine, customer.account_id, job_id)
    )
    assert job is not None
    kept = job_service.stored_info(api.app.state.settings, job)
    assert kept is not None and kept.delimiter == ";"
    assert kept.columns[-1] == ("E-Mail" if kind == "bulk" else "domain")
