"""The pinned stack works together: Prefect's server imports with our FastAPI and
SQLAlchemy pins, and a flow with mapped tasks runs on the session's Prefect server."""

from __future__ import annotations

import pytest


def test_prefect_server_imports_with_pinned_fastapi_and_sqlalchemy():
    import fastapi
    import prefect.server.api.server as server
    import sqlalchemy

    assert server.create_app is not None
    assert fastapi.__version__ == "0.150.0"
    assert sqlalchemy.__version__.startswith("2.0.")


@pytest.mark.usefixtures("prefect_harness")
def test_a_trivial_flow_runs():
    from prefect import flow, task

    @task
    def double(x: int) -> int:
        return 2 * x

    @flow
    def total(n: int) -> int:
        return sum(double.map(range(n)).result())

    assert total(5) == 20
