"""`verimail bulk`, `verimail find --file` and `verimail history query` as a user runs them:
the installed command in a subprocess, against the testbed, on the session's Prefect."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess

import pytest
from api_helpers import clean_env, env_for_testbed
from cli_helpers import folded, run_verimail

from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _world() -> World:
    return World.of(
        [HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice", "john.smith", "mary"}))],
        [DomainSpec("acme.test", mx=[(10, "mx.acme.test")])],
    )


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_verimail(args, env, timeout=180)


def test_bulk_find_and_history_commands(testbed_factory, tmp_path):
    from prefect.settings import PREFECT_API_URL

    tb = testbed_factory(_world())
    env = clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
            "VERIMAIL_PREFECT_WARM_UP": "false",
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        }
    )
    people = tmp_path / "list.csv"
    people.write_text(
        "Name,E-mail,Work email\nAlice,alice@acme.test,a@w.test\nNo,nobody@acme.test,n@w.test\n"
    )
    bulk = _run(["bulk", str(people), "--out", str(tmp_path / "out.csv")], env)
    assert bulk.returncode == 0, bulk.stderr
    # Two columns of addresses: the first is verified, and the run says which (issue 36).
    assert (
        "More than one column holds addresses ('E-mail', 'Work email'): 'E-mail' is verified."
        in folded(bulk.stderr)
    ), bulk.stderr
    # Not on a terminal, progress is plain lines: done/total, pace, counts by API status.
    progress = [line for line in bulk.stderr.splitlines() if line.startswith("progress ")]
    assert progress, bulk.stderr
    assert progress[-1].startswith("progress 2/2: ")
    assert progress[-1].endswith("; valid 1, invalid 1"), progress[-1]
    summary = dict(re.findall(r"(\w+)\s*\W\s*(\d+)\s*\W\s*[\d.]+%", bulk.stdout))
    assert summary == {
        "valid": "1",
        "likely_valid": "0",
        "catchall": "0",
        "risky": "0",
        "disposable": "0",
        "invalid": "1",
        "unknown": "0",
    }, bulk.stdout
    with open(tmp_path / "out.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert [row[:6] for row in rows] == [  # (and Reason, Score, Did You Mean: issue 44)
        ["Name", "E-mail", "Work email", "Safe to Send", "Status", "Sub Status"],
        ["Alice", "alice@acme.test", "a@w.test", "Yes", "valid", "ok"],
        ["No", "nobody@acme.test", "n@w.test", "No", "invalid", "mailbox_not_found"],
    ]
    finder = tmp_path / "people.csv"
    finder.write_text("first_name,last_name,domain\nJohn,Smith,acme.test\n")
    found = _run(["find", "--file", str(finder)], env)
    assert found.returncode == 0, found.stderr
    assert "1 found" in folded(found.stderr)
    with open(tmp_path / "people.found.csv", newline="") as fh:
        assert list(csv.reader(fh))[1][3:5] == ["john.smith@acme.test", "found"]
    # --max-probes bounds a file's lookups too (it was ignored there): mary@ is the
    # second candidate for Mary Jones (after the domain's learned first.last), so one
    # probe does not find her. (Not Alice: the history knows alice@ is valid.)
    mary = tmp_path / "mary.csv"
    mary.write_text("first_name,last_name,domain\nMary,Jones,acme.test\n")
    one = _run(["find", "--file", str(mary), "--max-probes", "1"], env)
    assert one.returncode == 0 and "0 found" in folded(one.stderr), one.stderr
    two = _run(["find", "--file", str(mary), "--max-probes", "2"], env)
    assert two.returncode == 0 and "1 found" in folded(two.stderr), two.stderr
    for wrong in (
        ["find", "--file", str(mary), "Mary", "Jones", "acme.test"],
        ["find", "--file", str(mary), "--json"],
        ["find", "Alice", "Jones", "acme.test", "--out", str(tmp_path / "x.csv")],
    ):
        refused_find = _run(wrong, env)
        assert refused_find.returncode == 2, (wrong, refused_find.stderr)
    history = _run(["history", "query", "SELECT email, status FROM latest ORDER BY email"], env)
    assert history.returncode == 0, history.stderr
    assert "alice@acme.test" in history.stdout and "invalid" in history.stdout
    bad_sql = _run(["history", "query", "SELEC nonsense"], env)
    assert bad_sql.returncode == 2 and "syntax" in folded(bad_sql.stderr).lower()
    # The shortcuts: a job's results as JSON, an address's history as CSV (any letter
    # case), a domain's latest verdicts as a table; csv/json carry every column.
    job_id = re.search(r"^job (\d+):", bulk.stderr, re.MULTILINE).group(1)  # type: ignore[union-attr]
    as_json = _run(["history", "job", job_id, "--format", "json"], env)
    assert as_json.returncode == 0, as_json.stderr
    records = json.loads(as_json.stdout)
    assert sorted((r["email"], r["status"]) for r in records) == [
        ("alice@acme.test", "valid"),
        ("nobody@acme.test", "invalid"),
    ]
    assert {"sub_status", "confidence_score", "reason", "verified_at", "job_id"} <= set(records[0])
    as_csv = _run(["history", "address", "ALICE@acme.test", "--format", "csv"], env)
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [(r["status"], r["job_id"]) for r in rows] == [("valid", job_id)]
    table = _run(["history", "domain", "acme.test"], env)
    assert table.returncode == 0, table.stderr
    assert "alice@acme.test" in table.stdout and "nobody@acme.test" in table.stdout
    nothing = _run(["history", "address", "nobody@else.test", "--format", "csv"], env)
    assert nothing.returncode == 0 and len(nothing.stdout.splitlines()) == 1  # (the header)
    wrong = _run(["history", "job", "1", "--format", "xml"], env)
    assert wrong.returncode == 2
    missing_column = tmp_path / "nocol.csv"
    missing_column.write_text("name,phone\nann,1\n")
    refused = _run(["bulk", str(missing_column)], env)
    assert refused.returncode == 2 and "email column" in folded(refused.stderr).lower()
    # A results path in a folder that does not exist is refused before any job runs.
    nowhere = _run(["bulk", str(people), "--out", str(tmp_path / "no" / "out.csv")], env)
    assert nowhere.returncode == 2 and "does not" in folded(nowhere.stderr), nowhere.stderr
    lost = _run(["find", "--file", str(finder), "--out", str(tmp_path / "no" / "f.csv")], env)
    assert lost.returncode == 2 and "does not" in folded(lost.stderr), lost.stderr
    runs = _run(["history", "query", "SELECT count(DISTINCT job_id) AS runs FROM history"], env)
    assert runs.returncode == 0 and re.search(r"│ 1 +│", runs.stdout), runs.stdout  # no new job


def _on_its_own_prefect(tb, tmp_path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The command's environment with no Prefect server named: it starts its own."""
    env = clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
            "PREFECT_HOME": str(tmp_path / "prefect"),
            **extra,
        }
    )
    for name in ("PREFECT_API_URL", "PREFECT_LOGGING_LEVEL", "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"):
        env.pop(name, None)
    return env


def test_bulk_on_its_own_prefect_server_ends_cleanly(testbed_factory, tmp_path):
    """With no PREFECT_API_URL the command starts a Prefect server of its own and stops it
    after the run. The runs' last log lines are sent first: left queued, Prefect sent them at
    exit to the stopped server, retrying for up to a minute (the command hung after its
    results), then printed "Error logging to API". Prefect's INFO lines are not shown."""
    env = _on_its_own_prefect(testbed_factory(_world()), tmp_path)
    people = tmp_path / "list.csv"
    people.write_text("email\nalice@acme.test\nnobody@acme.test\n")
    quiet = _run(["bulk", str(people)], env)
    assert quiet.returncode == 0, quiet.stderr
    assert "| INFO" not in quiet.stderr and "results:" in quiet.stderr, quiet.stderr
    # With Prefect's INFO lines asked for, there are log lines left to send at the end.
    chatty = _run(["bulk", str(people)], {**env, "PREFECT_LOGGING_LEVEL": "INFO"})
    assert chatty.returncode == 0, chatty.stderr
    assert "| INFO" in chatty.stderr and "results:" in chatty.stderr
    assert "Error logging to API" not in chatty.stdout + chatty.stderr


def test_bulk_whose_prefect_server_starts_too_slowly_fails_and_leaves_nothing_running(
    testbed_factory, tmp_path
):
    """An embedded Prefect server that misses its start deadline is stopped, and the job
    fails saying so. Prefect itself left such a server running and started another: on a
    busy CI machine the first start took over 20 s, and the orphan held the command's
    output open after it exited, so the caller waiting for that output hung."""
    env = _on_its_own_prefect(
        testbed_factory(_world()),
        tmp_path,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0",  # (no start is that fast)
    )
    people = tmp_path / "list.csv"
    people.write_text("email\nalice@acme.test\n")
    # (Returning at all shows that no server this command started holds its output.)
    failed = _run(["bulk", str(people)], env)
    assert failed.returncode == 1, failed.stderr
    text = folded(failed.stderr)
    assert "job 1 failed" in text, failed.stderr
    assert "embedded server did not start within 0 s" in text, failed.stderr
    assert not (tmp_path / "list.results.csv").exists()
