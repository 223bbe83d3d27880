"""Issue 44 points 1 and 3: `verimail bulk` stopped at any moment, on a terminal as a person
runs it, and no silent wait for addresses a server put off.

A stop (Ctrl-C, SIGTERM) early in the first pass, in the middle of it (rows settled while
a slow server keeps the rest), or while the job waits for a retry pass: the settled rows
written to the partial file whose path is printed, the rest refunded, and the Prefect
server the command started stopped. Ctrl-C in the first pass once kept 0 rows though the
progress showed 231/633; SIGTERM left no file and the Prefect server running.

By default a first pass that leaves an address put off ends the command: the results
(with statuses) are written, and the printed `verimail retry` line asks that address
again into the same file. The moments are read from the command's output (the testbed's
slow server keeps a pass open), never waited for with a sleep."""

from __future__ import annotations

import csv
import re
import signal
from pathlib import Path

import pytest
from api_helpers import clean_env, env_for_testbed
from cli_helpers import folded, run_verimail, stop_in_terminal
from process_leaks import alive, children_of

from verimail.config import Settings
from verimail.store import jobs as job_store
from verimail.store.db import init_store
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

SLOW = HostBehaviour(mailboxes={"ann"}, greeting_delay=600)  # (a pass stays open on it)


def _world() -> World:
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice"})),
            HostSpec("mx.slow.test", SLOW),
            HostSpec("mx.grey.test", HostBehaviour(mailboxes={"bob"}, greylist_delay=1.0)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("slow.test", mx=[(10, "mx.slow.test")]),
            DomainSpec("grey.test", mx=[(10, "mx.grey.test")]),
        ],
    )


def _env(tb, tmp_path: Path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from prefect.settings import PREFECT_API_URL

    return clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
            "VERIMAIL_PREFECT_WARM_UP": "false",
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            "VERIMAIL_SMTP_CONNECT_TIMEOUT": "600",
            "VERIMAIL_SMTP_GREYLIST_RETRIES": "0",
            **extra,
        }
    )


def _job(tmp_path: Path) -> job_store.Job:
    store = init_store(Settings(data_dir=tmp_path / "data"))
    try:
        job = job_store.get_job_any(store.engine, 1)
        assert job is not None
        return job
    finally:
        store.close()


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def test_ctrl_c_early_in_the_first_pass_refunds_everything(testbed_factory, tmp_path):
    """Stopped before any answer: nothing settled, no file, every credit back, exit 130."""
    env = _env(testbed_factory(_world()), tmp_path)
    people = tmp_path / "list.csv"
    people.write_text("Email\nann@slow.test\nbob@slow.test\n")
    code, _, said = stop_in_terminal(["bulk", str(people)], env, "job 1:", signal.SIGINT)
    assert code == 130, said
    assert "job 1 cancelled after 0 of 2 rows; the rest was refunded." in said, said
    assert "no row was settled: no partial results file" in said, said
    job = _job(tmp_path)
    assert (job.status, job.credits_used, job.credits_refunded) == ("failed", 0, 2)
    assert not list(tmp_path.glob("list.results*"))


def test_ctrl_c_mid_pass_keeps_the_rows_the_progress_counted(testbed_factory, tmp_path):
    """Rows settled while the slow server keeps the rest: the bar shows 2/3, and those 2
    rows are in the partial file, with their statuses; the slow one is refunded."""
    env = _env(testbed_factory(_world()), tmp_path)
    people = tmp_path / "list.csv"
    people.write_text("Name,Email\nA,ann@slow.test\nB,not-an-address\nC,c@nomx.invalid\n")
    code, before, said = stop_in_terminal(["bulk", str(people)], env, "2/3", signal.SIGINT)
    assert "invalid 2" in before, before  # (the bar's counts as the key was pressed)
    assert code == 130, said
    partial = tmp_path / "list.results.partial.csv"
    assert f"partial results (2 rows): {partial}" in said, said
    rows = _rows(partial)
    assert rows[0][:4] == ["Name", "Email", "Safe to Send", "Status"]
    assert [row[:4] for row in rows[1:]] == [
        ["B", "not-an-address", "No", "invalid"],
        ["C", "c@nomx.invalid", "No", "invalid"],
    ]
    job = _job(tmp_path)
    assert job.failed_reason == "cancelled by its owner after 2 of 3 rows"
    assert (job.credits_used, job.credits_refunded) == (2, 1)


def test_sigterm_mid_pass_keeps_the_rows_and_stops_its_prefect_server(
    testbed_factory, tmp_path, monkeypatch
):
    """On its own Prefect server (no PREFECT_API_URL): SIGTERM once ended the command with
    no file and left that server (uvicorn) running. Now it stops as Ctrl-C does (exit
    143) and the server goes with it."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    env = _env(testbed_factory(_world()), tmp_path, PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL")
    people = tmp_path / "list.csv"
    people.write_text("Email\nann@slow.test\nnot-an-address\n")
    servers: set[int] = set()
    code, _, said = stop_in_terminal(
        ["bulk", str(people)],
        env,
        "1/2",
        signal.SIGTERM,
        before_stop=lambda pid: servers.update(children_of(pid)),
    )
    assert code == 143, said
    assert "partial results (1 rows)" in said, said
    assert servers, "the command started no Prefect server of its own"
    assert not [pid for pid in servers if alive(pid)], said


def test_a_put_off_address_ends_the_run_with_results_and_the_retry_command(
    testbed_factory, tmp_path
):
    """No silent wait: the first pass's results are written (statuses included), the
    command says one address was put off and prints the line that asks it again; that
    line, run after the window, settles it into the same file."""
    env = _env(testbed_factory(_world()), tmp_path, VERIMAIL_JOB_RETRY_DELAY="2")
    people = tmp_path / "list.csv"
    people.write_text("Name,Email\nA,alice@acme.test\nB,bob@grey.test\n")
    first = run_verimail(["bulk", str(people)], env, timeout=180)
    assert first.returncode == 0, first.stderr
    said = folded(first.stderr)
    assert "1 put off by their servers" in said, said
    results = tmp_path / "list.results.csv"
    header, *rows = _rows(results)
    assert header[:6] == ["Name", "Email", "Safe to Send", "Status", "Sub Status", "Reason"]
    assert [row[:5] for row in rows] == [
        ["A", "alice@acme.test", "Yes", "valid", "ok"],
        ["B", "bob@grey.test", "No", "unknown", "greylisted"],
    ]
    command = re.search(r"same file: verimail (retry 1 --out \S+)", said)
    assert command is not None, said
    again = run_verimail(command.group(1).split(), env, timeout=180)
    assert again.returncode == 0, again.stderr
    # (It names the put-off address it asks again: as a wait when the window is still ahead,
    # as its phase when it is not; which lines show depends on the machine's pace.)
    assert "1 put off" in folded(again.stderr), again.stderr
    _, *rows = _rows(results)
    assert [row[:5] for row in rows] == [
        ["A", "alice@acme.test", "Yes", "valid", "ok"],
        ["B", "bob@grey.test", "Yes", "valid", "ok"],
    ]
    assert _job(tmp_path).status == "completed"


def test_no_details_keeps_the_uploads_columns_and_safe_to_send(testbed_factory, tmp_path):
    env = _env(testbed_factory(_world()), tmp_path)
    people = tmp_path / "list.csv"
    people.write_text("Name,Email\nA,alice@acme.test\nN,nobody@acme.test\n")
    done = run_verimail(["bulk", str(people), "--no-details"], env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert _rows(tmp_path / "list.results.csv") == [
        ["Name", "Email", "Safe to Send"],
        ["A", "alice@acme.test", "Yes"],
        ["N", "nobody@acme.test", "No"],
    ]


def test_find_file_ends_after_its_first_pass_too_and_retry_settles_the_row(
    testbed_factory, tmp_path
):
    """`verimail find --file` likewise: the row whose server put it off is written for now,
    and the printed `verimail retry` line looks it up again into the same file."""
    env = _env(testbed_factory(_world()), tmp_path, VERIMAIL_JOB_RETRY_DELAY="2")
    people = tmp_path / "people.csv"
    people.write_text("first_name,last_name,domain\nAlice,Smith,acme.test\nBob,Lee,grey.test\n")
    first = run_verimail(["find", "--file", str(people)], env, timeout=180)
    assert first.returncode == 0, first.stderr
    said = folded(first.stderr)
    assert "1 put off by their servers" in said, said
    found = tmp_path / "people.found.csv"
    assert [row[3:5] for row in _rows(found)][:2] == [
        ["email", "status"],
        ["alice@acme.test", "found"],
    ]
    command = re.search(r"same file: verimail (retry 1 --out \S+)", said)
    assert command is not None, said
    again = run_verimail(command.group(1).split(), env, timeout=180)
    assert again.returncode == 0, again.stderr
    rows = _rows(found)
    assert rows[2][4] == "found" and rows[2][3].endswith("@grey.test"), rows
    assert _job(tmp_path).status == "completed"
