"""The reaper with a database that does not answer: one line a sweep, not a traceback each."""

from __future__ import annotations

import logging
import time

import pytest
from api_helpers import PATIENCE

from verimail.config import Settings
from verimail.jobs.recovery import Reaper


class _NoRunner:
    def held_jobs(self) -> list[int]:
        return []

    def submit(self, kind: str, job_id: int, attempt: int | None = None, **_: object) -> None:
        raise AssertionError("nothing is resubmitted while the database is down")


def test_sweeps_against_a_database_that_is_down_log_one_line_each(tmp_path, caplog):
    settings = Settings(
        data_dir=tmp_path,
        database_url="postgresql+psycopg://u@127.0.0.1:1/nothing",
        job_stale_after=2.0,  # a sweep every 0.5 s
    )
    caplog.set_level(logging.WARNING, logger="verimail.jobs.recovery")
    reaper = Reaper(settings, _NoRunner()).start()  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + PATIENCE
        while len(caplog.records) < 3:
            if time.monotonic() > deadline:
                pytest.fail(f"only {len(caplog.records)} sweeps logged in {PATIENCE:g} s")
            reaper._stop.wait(0.05)
    finally:
        reaper.stop()
    first, *rest = caplog.records[:3]
    assert first.exc_info is not None and "does not answer" in first.getMessage()
    assert all(r.exc_info is None and "still does not answer" in r.getMessage() for r in rest)
