"""Every ``verimail`` help page, walked in-process: flags show no value type, arguments are
named one way (upper case), and nothing points at documents outside the repository."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from verimail import cli

REPO = Path(__file__).resolve().parent.parent


def _app() -> typer.Typer:
    if not cli.app.registered_groups:  # (main() registers them; once per process)
        cli._register()
    return cli.app


def _command_paths() -> list[list[str]]:
    """Every command and group, as the words that reach it (``["keys", "revoke"]``)."""
    root = typer.main.get_command(_app())
    paths: list[list[str]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, [])
    return paths


def test_every_help_page_names_arguments_one_way_and_flags_without_a_type():
    paths = _command_paths()
    assert ["history", "query"] in paths and ["testbed", "up"] in paths
    accounts = [
        "accounts set",
        "accounts set-password",
        "keys create",
        "keys list",
        "credits grant",
    ]
    for path in paths:
        # (a fixed wide terminal: nothing below depends on how Rich wraps)
        result = CliRunner().invoke(_app(), [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        page = result.output
        assert "<bool>" not in page, (path, page)
        assert "../shared" not in page and "SPEC §" not in page, (path, page)
        usage = next(line for line in page.splitlines() if "Usage:" in line)
        words = usage.split("[OPTIONS]", 1)[1].split() if "[OPTIONS]" in usage else []
        for word in words:
            name = word.strip("[]{}.")
            if name in ("COMMAND", "ARGS"):
                continue
            assert re.fullmatch(r"[A-Z][A-Z_]*", name), (path, usage)
            assert not word.startswith("{"), (path, usage)
        if " ".join(path) in accounts:  # (one name for the account everywhere)
            assert "--account" in page, (path, page)


def test_make_demo_takes_a_port():
    run = subprocess.run(
        ["make", "-n", "demo", "PORT=8123"], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "verimail demo --port 8123" in run.stdout


# What `verimail --help` must not load: each of these took 0.1-0.9 s to import, and together
# they made the CLI take 2-3.5 s to say how it is used (issue 36). A command imports them
# when it runs. (pydantic itself is not listed: typer loads it for some kinds of option.)
HEAVY_MODULES = (
    "prefect", "polars", "duckdb", "sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn",
    "httpx", "pyarrow", "aiosmtplib", "aiosmtpd", "dns", "email_validator", "redis", "jinja2",
    "pydantic_settings",
)  # fmt: skip

_LOADED_AFTER_HELP = """
import sys
heavy, words = sys.argv[1].split(","), sys.argv[2:]
sys.argv = ["verimail", *words, "--help"]
from verimail.cli import main
try:
    main()
except SystemExit:
    pass
loaded = sorted({name.split(".")[0] for name in sys.modules} & set(heavy))
sys.stderr.write("LOADED=" + ",".join(loaded) + "\\n")
"""


@pytest.mark.parametrize(
    "words",
    [[], ["verify"], ["bulk"], ["find"], ["demo"], ["serve"], ["accounts"], ["testbed", "up"]],
    ids=lambda words: " ".join(words) or "verimail",
)
def test_help_imports_no_heavy_module(words: list[str]) -> None:
    """``verimail [COMMAND] --help`` in a fresh interpreter loads none of HEAVY_MODULES: the
    check is what was imported (``sys.modules``), not a time, so a busy machine cannot fail it."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADED_AFTER_HELP, ",".join(HEAVY_MODULES), *words],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "Usage" in done.stdout
    line = done.stderr.strip().splitlines()[-1]
    assert line == "LOADED=", f"verimail {' '.join(words)} --help imported {line[7:]}"


def test_help_text_breaks_only_where_the_line_is_full():
    """Issue 44.8: Typer kept the docstrings' own line ends, and Rich wrapped them again:
    `verimail --help` at 80 columns read "exit 1 when an SMTP egress" / "fails (…)". A
    description line now ends only where the next word would not fit."""
    from cli_helpers import VERIMAIL_BIN

    done = subprocess.run(
        [str(VERIMAIL_BIN), "--help"],
        env={**os.environ, "COLUMNS": "80", "TERMINAL_WIDTH": "80"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    panel = [line[1:-1] for line in done.stdout.splitlines() if line.startswith("│ ")]
    column = max(len(line) - len(line[1:].lstrip()) for line in panel if line.startswith("  "))
    width = len(panel[0]) - column - 1  # (the description column, less its padding)
    for above, below in itertools.pairwise(panel):
        if below[:column].strip():
            continue  # (a new command, not a continuation)
        said, next_word = above[column:].rstrip(), below.split()[0]
        assert len(said) + 1 + len(next_word) > width, (above, below)
