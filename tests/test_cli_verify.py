"""`verimail verify` as a user runs it: JSON lines, a table, a file, and the counters."""

from __future__ import annotations

import json
import subprocess

from api_helpers import api_world, clean_env, env_for_testbed
from cli_helpers import VERIMAIL_BIN, folded, run_verimail


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_verimail(["verify", *args], env)


def test_verify_json_table_file_and_stats(testbed_factory, tmp_path):
    tb = testbed_factory(api_world())
    env = clean_env({**env_for_testbed(tb), "VERIMAIL_DATA_DIR": str(tmp_path)})
    out = _run(["alice@acme.test", "nobody@acme.test", "--json", "--stats"], env)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["email"], r["status"]) for r in lines] == [
        ("alice@acme.test", "valid"),
        ("nobody@acme.test", "invalid"),
    ]
    assert {"safe_to_send", "confidence_score", "reason", "mx_records"} <= set(lines[0])
    stats = json.loads(out.stderr)
    assert stats["mx_queries"] == 1 and stats["sessions"] == 1 and stats["rcpts"] == 3
    listing = tmp_path / "list.txt"
    listing.write_text("# a comment\nbob@acme.test\n\nsomeone@catchall.test\n")
    table = _run(["--file", str(listing)], env)
    assert table.returncode == 0, table.stderr
    assert "bob@acme.test" in table.stdout and "valid" in table.stdout
    assert "catchall" in table.stdout or "likely_valid" in table.stdout
    nothing = _run([], env)
    assert nothing.returncode == 2 and "at least one address" in folded(nothing.stderr)


def test_verify_file_skips_an_email_header_and_shows_pace_eta_and_counts(testbed_factory, tmp_path):
    """`verify --file` on a one-column CSV verified its header "email" as an address (and
    found it invalid), and showed no ETA or counts where `bulk` does (issue 36)."""
    tb = testbed_factory(api_world())
    env = clean_env({**env_for_testbed(tb), "VERIMAIL_DATA_DIR": str(tmp_path)})
    column = tmp_path / "column.csv"
    column.write_text("Email\nalice@acme.test\nnobody@acme.test\n")
    out = _run(["--file", str(column), "--json"], env)
    assert out.returncode == 0, out.stderr
    emails = [json.loads(line)["email"] for line in out.stdout.splitlines()]
    assert emails == ["alice@acme.test", "nobody@acme.test"]
    said = folded(out.stderr)
    assert "the first line, 'Email', is a header: not verified" in said, said
    # Not on a terminal: the plain progress lines of `bulk`, then the counts by status.
    progress = [line for line in out.stderr.splitlines() if line.startswith("progress ")]
    assert progress and progress[-1].startswith("progress 2/2: "), out.stderr
    assert "/s" in progress[-1] and progress[-1].endswith("; valid 1, invalid 1"), progress
    assert "total 2" in said and "valid 1 50.0%" in said, said


def test_verify_table_at_80_columns_keeps_the_reason_readable(testbed_factory, tmp_path):
    """Issue 44.8: at 80 columns the reason column was a word a line (some twenty lines
    for one address). Now the reason goes under the table, a line an address, whole."""
    tb = testbed_factory(api_world())
    env = clean_env({**env_for_testbed(tb), "VERIMAIL_DATA_DIR": str(tmp_path)})
    done = subprocess.run(
        [str(VERIMAIL_BIN), "verify", "alice@acme.test", "nobody@acme.test"],
        env={**env, "COLUMNS": "80", "TERMINAL_WIDTH": "80"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, done.stdout
    assert len(lines) <= 12, done.stdout  # (a 6-line table, then a reason or two a line)
    said = folded(done.stdout)
    assert "alice@acme.test: The mail server for acme.test confirmed that this mailbox" in said
    assert "alice@acme.test valid ok 0.97 nobody@acme.test invalid" in said, said
