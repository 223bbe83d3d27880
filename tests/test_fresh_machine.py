"""What a new user meets on a fresh machine, before any verification: a quiet install and
no Prefect telemetry notice in the middle of a command's output."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from api_helpers import api_world, clean_env, env_for_testbed
from cli_helpers import folded, run_in_terminal

ROOT = Path(__file__).resolve().parent.parent


def test_every_data_folder_is_a_declared_package() -> None:
    """setuptools prints a "Package would be ignored" block for each folder of data files
    that is reached by a glob of its parent instead of being a package itself."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(tool["packages"])
    for package, patterns in tool["package-data"].items():
        assert package in packages, package
        assert not [p for p in patterns if "/" in p], (package, patterns)
        folder = ROOT.joinpath(*package.split(".")[1:])
        assert any(folder.glob(patterns[0])), (package, "matches no file")
    # and every folder that holds data files beside the code is one of them
    for folder in ("data", "data/worlds", "api/templates", "api/static"):
        assert "verimail." + folder.replace("/", ".") in tool["package-data"], folder


@pytest.mark.usefixtures("prefect_harness")
def test_bulk_in_a_terminal_shows_no_telemetry_notice(testbed_factory, tmp_path: Path) -> None:
    """Prefect prints a first-run "anonymous usage data" notice when a new user imports it
    in a terminal, into the middle of ``verimail bulk``'s progress bar; verimail turns
    Prefect's client telemetry off for the processes it runs."""
    from prefect.settings import PREFECT_API_URL

    tb = testbed_factory(api_world())
    env = clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
            "VERIMAIL_PREFECT_WARM_UP": "false",
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            "PREFECT_HOME": str(tmp_path / "prefect"),  # a new user: no notice shown yet
        }
    )
    for name in ("CI", "DO_NOT_TRACK", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "CI_NAME"):
        env.pop(name, None)  # Prefect is quiet in CI anyway, which would hide the notice
    listing = tmp_path / "list.csv"
    listing.write_text("email\nalice@acme.test\n")
    status, shown = run_in_terminal(["bulk", str(listing), "--out", str(tmp_path)], env)
    assert status == 0, shown
    assert "job 1: 1 addresses (1 unique)" in folded(shown), shown
    assert "anonymous usage data" not in folded(shown), shown
    assert not (tmp_path / "prefect" / ".sdk_telemetry" / "notice_shown").exists()
