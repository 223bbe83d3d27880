"""The service files docs/deployment.md tells operators to install (``deploy/systemd/``)
start commands that exist: each ``ExecStart`` is run here, from this checkout's venv, with
``--help`` (its sub-command and every option it names must be known), and each setting of
their environment files is one verimail reads."""

from __future__ import annotations

import configparser
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from verimail.config import Settings

REPO = Path(__file__).resolve().parent.parent
UNITS = sorted((REPO / "deploy" / "systemd").glob("*.service"))
ENV_FILES = sorted((REPO / "deploy" / "systemd").glob("*.env"))
BIN = Path(sys.executable).parent


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  (keys keep their case)
    parser.read_string(path.read_text())
    return parser


def test_the_documented_units_are_there() -> None:
    names = {p.name for p in UNITS}
    assert names >= {"verimail-api.service", "verimail-worker.service", "prefect-server.service"}
    documented = (REPO / "docs" / "deployment.md").read_text()
    for path in [*UNITS, *ENV_FILES]:
        assert f"`{path.name}`" in documented or f"deploy/systemd/{path.name}" in documented, path


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_a_unit_starts_a_command_that_exists(path: Path) -> None:
    unit = _unit(path)
    assert {"Unit", "Service", "Install"} <= set(unit.sections()), path.name
    command = shlex.split(unit["Service"]["ExecStart"])
    program = Path(command[0])
    assert program.is_absolute() and program.name in {"verimail", "prefect"}, command
    for env_file in unit["Service"].get("EnvironmentFile", "").split():
        assert (path.parent / Path(env_file.lstrip("-")).name).is_file(), env_file
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("PREFECT_API_URL", None)
    shown = subprocess.run(
        [str(BIN / program.name), *command[1:], "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert shown.returncode == 0, (command, shown.stdout[-2000:], shown.stderr[-2000:])
    for word in command[1:]:
        if word.startswith("--"):
            assert word in shown.stdout, (word, shown.stdout)


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.name)
def test_every_verimail_setting_in_an_env_file_is_one_verimail_reads(path: Path) -> None:
    known = {f"VERIMAIL_{name.upper()}" for name in Settings.model_fields}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key = line.split("=", 1)[0]
            assert key.startswith(("VERIMAIL_", "PREFECT_")), line
            assert not key.startswith("VERIMAIL_") or key in known, key
