"""The words of the CLI's job progress: pace, ETA, counts under the API's status names and
the greylist-retry phase (the end-to-end run is in test_cli_jobs.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from verimail.cli.progress import Rate, progress_text, retry_phase, status_counts


class Clock:
    """Seconds that move only when told (the rate must not depend on the test's speed)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pace_and_eta_count_from_the_first_progress_not_from_start_up():
    clock = Clock()
    rate = Rate(clock=clock)
    rate.update(0)  # (Prefect starting: no pace yet)
    assert progress_text(0, 160, {"valid": 0}, rate, None) == ("–/s, ETA –", "no results yet")
    rate.update(10)
    clock.now += 5
    assert progress_text(10, 160, {}, rate, None)[0] == "–/s, ETA –"
    rate.update(60)
    pace, counts = progress_text(60, 160, {"valid": 50, "catchall": 0, "invalid": 10}, rate, None)
    assert pace == "10.0/s, ETA 0:10"
    assert counts == "valid 50, invalid 10"  # (statuses still at zero are left out)
    assert progress_text(160, 160, {}, rate, None)[0].endswith("ETA 0:00")


def test_the_retry_phase_replaces_the_pace_while_a_job_waits():
    now = datetime(2026, 11, 27, 4, 0, tzinfo=UTC)
    waiting = {
        "phase": "waiting_to_retry",
        "retry_waiting": 3,
        "next_retry_at": now + timedelta(seconds=75),
    }
    assert retry_phase(waiting, now) == "waiting to retry 3 put off (next try in 1:15)"
    assert retry_phase({"phase": "retrying", "retry_waiting": 2}) == "retrying 2 put off"
    assert retry_phase({"phase": "verifying", "retry_waiting": 0}) is None
    assert retry_phase({}) is None  # (a job of a version without phases)
    pace, _ = progress_text(5, 9, {}, Rate(clock=Clock()), retry_phase(waiting, now))
    assert pace.startswith("waiting to retry 3")


def test_counts_use_the_apis_status_names_and_split_the_catch_all_column():
    row = SimpleNamespace(
        valid_count=5,
        likely_valid_count=2,
        catch_all_count=7,  # (the job row holds both catch-all statuses here)
        risky_count=1,
        disposable_count=0,
        invalid_count=3,
        unknown_count=4,
    )
    assert status_counts(row) == {
        "valid": 5,
        "likely_valid": 2,
        "catchall": 5,
        "risky": 1,
        "disposable": 0,
        "invalid": 3,
        "unknown": 4,
    }
