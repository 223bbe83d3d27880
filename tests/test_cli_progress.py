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


def test_pace_counts_from_the_first_progress_and_the_eta_waits_for_a_measured_pace():
    """Answers come a mail server's batch at a time: one batch said "ETA 0:04" with
    minutes to go. The ETA is shown once the pace rests on three advances over 5 s."""
    clock = Clock()
    rate = Rate(clock=clock)
    rate.update(0)  # (Prefect starting: no pace yet)
    assert progress_text(0, 160, {"valid": 0}, rate, None) == ("–/s", "no results yet")
    rate.update(10)
    clock.now += 5
    assert progress_text(10, 160, {}, rate, None)[0] == "–/s"
    rate.update(60)
    pace, counts = progress_text(60, 160, {"valid": 50, "catchall": 0, "invalid": 10}, rate, None)
    assert pace == "10.0/s"  # (one advance: no ETA yet)
    assert counts == "valid 50, invalid 10"  # (statuses still at zero are left out)
    clock.now += 2
    rate.update(80)
    assert "ETA" not in progress_text(80, 160, {}, rate, None)[0]
    clock.now += 3
    rate.update(100)
    assert progress_text(100, 160, {}, rate, None)[0] == "9.0/s, ETA 0:07"
    assert "ETA" not in progress_text(160, 160, {}, rate, None)[0]  # (done)


def test_plain_lines_come_on_change_or_every_30_seconds_not_every_poll():
    """Outside a terminal an identical line every 2 s filled a pipe (~450 in 15 min)."""
    import io

    from rich.console import Console

    from verimail.cli.progress import JobProgress

    out = io.StringIO()
    clock = Clock()
    console = Console(file=out, force_terminal=False)
    shown = JobProgress(console, 10, rate=Rate(clock=clock), clock=clock)
    with shown:
        for _ in range(20):  # (the same facts for 20 polls, 1 s apart)
            shown.show(3, {"valid": 3})
            clock.now += 1
        shown.show(4, {"valid": 4})  # (a change: a line at once)
        clock.now += 40
        shown.show(4, {"valid": 4})  # (nothing new for 40 s: one line)
        shown.show(10, {"valid": 10}, final=True)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "progress 3/10",
        "progress 4/10",
        "progress 4/10",
        "progress 10/10",
    ], lines


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
