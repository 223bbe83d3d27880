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

    from verimail.api.dashboard import finder, results, uploads
    from verimail.api.dashboard.reverify import router as reverify_router
    from verimail.api.dashboard.routes import router
    from verimail.api.dashboard.web import PREFIX, STATIC_DIR

    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    # The pages split by resource come before the main router, whose catch-all ends it.
    app.include_router(results.router)
    app.include_router(finder.router)
    app.include_router(reverify_router)
    app.include_router(uploads.router)
    app.include_router(router)
