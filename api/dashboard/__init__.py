"""The account dashboard: server-rendered pages under ``/dashboard`` in the API's app.

``install_dashboard(app)`` is all the app needs: it serves the static files and includes
the router, whose lifespan (merged into the app's) sets up the session signer and the
login throttle once the app's own start-up made the settings and the limiter. The pages
are imported only then, so ``verimail.cli.passwords`` stays light for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["install_dashboard"]


def install_dashboard(app: FastAPI) -> None:
    """Mount ``/dashboard/static`` and the pages (static first: the pages end in a catch-all)."""
    from fastapi.staticfiles import StaticFiles

    from verimail.api.dashboard.routes import page_routers
    from verimail.api.dashboard.web import PREFIX, STATIC_DIR

    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    for pages in page_routers():  # (the last ends in the dashboard's catch-all)
        app.include_router(pages)
