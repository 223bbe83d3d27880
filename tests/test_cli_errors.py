"""Mistakes on the command line or in the environment are usage errors that say what to fix,
never a Python traceback."""

from __future__ import annotations

import subprocess

from api_helpers import clean_env
from cli_helpers import folded, run_verimail


def _verimail(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_verimail(args, env)


def _refused(args: list[str], env: dict[str, str], code: int = 2) -> str:
    """Run a command that must be refused with exit status ``code`` and no traceback; what
    it printed, folded to one line (Rich's wrapping and boxes taken out)."""
    out = _verimail(args, env)
    text = folded(out.stdout + out.stderr)
    assert out.returncode == code, (args, text)
    assert "Traceback" not in text, (args, text)
    return text


def test_bad_setting_is_a_usage_error_naming_the_variable(tmp_path):
    """A mistyped VERIMAIL_* value stops every command with the variable's name, not a
    pydantic traceback; a value refused as IPv4 and as IPv6 is one line."""
    env = clean_env(
        {
            "VERIMAIL_DATA_DIR": str(tmp_path),
            "VERIMAIL_SMTP_COMMAND_TIMEOUT": "abc",
            "VERIMAIL_SMTP_ALLOW_NETWORKS": "notanet",
        }
    )
    for args in (["verify", "a@b.example"], ["accounts", "list"]):
        out = _verimail(args, env)
        assert out.returncode == 2, out.stderr
        text = folded(out.stderr)
        assert "Traceback" not in out.stderr and "ValidationError" not in out.stderr
        assert "VERIMAIL_SMTP_COMMAND_TIMEOUT: Input should be a valid number" in text
        assert "(got 'abc')" in text
        assert text.count("VERIMAIL_SMTP_ALLOW_NETWORKS") == 1, text


def test_bad_world_file_and_log_level_are_usage_errors(tmp_path):
    env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})
    broken = tmp_path / "broken.yaml"
    broken.write_text("hosts: [\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("hosts: {h: {bogus: 1}}\n")
    for world, expected in ((broken, "line 2"), (unknown, "unknown keys ['bogus']")):
        assert expected in _refused(["testbed", "up", "--world", str(world)], env)
    assert "'bogus' is not one of" in _refused(["serve", "--log-level", "bogus"], env)


def test_deploy_needs_a_reachable_prefect_server(tmp_path):
    env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})
    env.pop("PREFECT_API_URL", None)
    unset = _verimail(["deploy"], env)
    assert unset.returncode == 2 and "Traceback" not in unset.stderr
    assert "set PREFECT_API_URL" in folded(unset.stderr)
    # An API process on the deployment runner started, said it was healthy, and answered
    # every job with a 503 (its runs went to a throwaway Prefect server of its own).
    serve = _verimail(["serve", "--port", "1"], {**env, "VERIMAIL_RUNNER": "deployment"})
    assert serve.returncode == 2 and "Traceback" not in serve.stderr
    assert "VERIMAIL_RUNNER=deployment needs" in folded(serve.stderr)
    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # (nothing listens on port 9)
    down = _verimail(["deploy"], env)
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert "Could not register the deployments at PREFECT_API_URL=http://127.0.0.1:9/api" in (
        folded(down.stderr)
    )


def test_a_database_that_cannot_be_used_is_one_line(tmp_path):
    """A database that does not answer, or a URL SQLAlchemy cannot read, is one line naming
    it (the password hidden), not a traceback of some 400 lines."""
    down = "postgresql+psycopg://u:secret@127.0.0.1:1/db"
    for url, code, expected in ((down, 1, "127.0.0.1:1/db"), ("foo://", 2, "'foo://'")):
        env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path), "VERIMAIL_DATABASE_URL": url})
        for args in (["accounts", "list"], ["credits", "show", "--account", "1"]):
            text = _refused(args, env, code)
            assert text.startswith("error: ") and expected in text and "secret" not in text


def test_ports_out_of_range_are_usage_errors(tmp_path):
    env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})
    for args in (
        ["demo", "--port", "70000"],
        ["demo", "--port", "0"],
        ["demo", "--dns-port", "-1"],
        ["testbed", "up", "--smtp-port", "70000"],
        ["testbed", "up", "--dns-port", "-1"],
        ["history", "query", "SELECT 1", "--limit", "-1"],
    ):
        assert "Invalid value" in _refused(args, env), args


def test_a_testbed_port_held_on_every_address_is_one_line(tmp_path):
    """A program on 0.0.0.0 at the DNS port (as avahi holds 5353, the port a non-root user
    gets) takes it on every loopback address: the testbed says so and which options choose
    others, where it printed a traceback."""
    import socket

    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", 0))
    port = holder.getsockname()[1]
    try:
        env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})
        text = _refused(["testbed", "up", "--dns-port", str(port), "--smtp-port", "2799"], env, 1)
    finally:
        holder.close()
    assert f"DNS port {port}" in text and "--dns-port" in text


def test_verify_file_that_is_empty_or_a_csv_is_refused(tmp_path):
    """An empty --file said "give at least one address or --file" though one was given; a
    CSV had each line checked whole ("alice,alice@x.test" invalid) with exit 0."""
    env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# only a comment\n")
    table = tmp_path / "people.csv"
    table.write_text("name,email\nalice,alice@x.test\nbob,bob@x.test\n")
    for path, expected in ((empty, "holds no addresses"), (table, "verimail bulk FILE")):
        assert expected in _refused(["verify", "--file", str(path)], env)


def test_bulk_names_its_own_option_not_the_apis_field(tmp_path):
    env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})
    nomail = tmp_path / "nomail.csv"
    nomail.write_text("name,phone\nann,123\n")
    listed = tmp_path / "list.csv"
    listed.write_text("email\nann@x.test\n")
    for args, hint in (
        (["bulk", str(nomail)], "FILE"),
        (["bulk", str(listed), "--column", "nope"], "--column"),
    ):
        text = _refused(args, env)
        assert "email_column" not in text, text
        assert "--column" in text and f"Invalid value for {hint}" in text, text


def test_find_file_names_no_api_field_and_a_stray_quote_names_its_line(tmp_path):
    """`find --file` said "Pass domain_column", an API field it has no option for; a quote
    never closed merged every later row into one cell without a word (issue 36)."""
    env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})
    people = tmp_path / "people.csv"
    people.write_text("first_name,last_name,company\nAlice,Smith,acme.test\n")
    text = _refused(["find", "--file", str(people)], env)
    assert "_column" not in text, text
    assert "No company-domain column found" in text and "last_name and domain" in text, text
    stray = tmp_path / "stray.csv"
    stray.write_text('name,email\nann,"ann@x.test\nbob,bob@x.test\ncy,cy@x.test\n')
    text = _refused(["bulk", str(stray)], env)
    assert "Line 2 could not be read" in text and "never closed" in text, text
