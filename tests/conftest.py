"""Shared fixtures: the loopback mail world (``testbed``) and settings pointing at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from verimail.config import Settings
from verimail.testbed.server import Testbed
from verimail.testbed.world import World


def make_testbed_settings(tb: Testbed, tmp_path: Path, **overrides: Any) -> Settings:
    """Settings for an engine run against ``tb``: short timeouts so failing tests fail fast."""
    values: dict[str, Any] = {
        "data_dir": tmp_path,
        "dns_timeout": 2.0,
        "smtp_connect_timeout": 3.0,
        "smtp_command_timeout": 3.0,
        "smtp_greylist_delay": 0.05,
        "prefect_warm_up": False,  # a test session shares one Prefect server (prefect_harness)
        **tb.settings_overrides(),
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def testbed_factory() -> Iterator[Callable[..., Testbed]]:
    """``make(world, **kwargs) -> Testbed``: started now, stopped at teardown."""
    started: list[Testbed] = []

    def make(world: World, **kwargs: Any) -> Testbed:
        tb = Testbed(world, **kwargs).start()
        started.append(tb)
        return tb

    yield make
    for tb in reversed(started):
        tb.stop()


@pytest.fixture
def testbed_settings() -> Callable[..., Settings]:
    """The ``make_testbed_settings(tb, tmp_path, **overrides)`` helper, as a fixture."""
    return make_testbed_settings


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server for the whole session (it takes ~15 s to start)."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield
