"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) render in a browser that cannot reach the
internet: every script, stylesheet and font they need comes from the app itself.

Chromium (the same setup as the dashboard's browser test) is allowed loopback only: any
other request — script, stylesheet, font, data or image — is aborted and fails the test.
ReDoc's side-menu logo, which its script asked Redocly's CDN for, comes from the app too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from api_helpers import serve_processes
from test_dashboard_browser import chromium  # noqa: F401  (the module-scoped browser)

OPERATIONS = ("/api/verify/single", "/api/bulk", "/api/find-email")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``verimail serve`` on loopback; no job runs here, so no Prefect is started."""
    tmp = tmp_path_factory.mktemp("docs")
    env = {"VERIMAIL_DATA_DIR": str(tmp / "data"), "VERIMAIL_PREFECT_WARM_UP": "false"}
    with serve_processes(1, env, tmp) as servers:
        yield servers[0].base_url


@pytest.fixture
def offline_page(chromium: Any, server: str) -> Iterator[tuple[Any, list[str]]]:  # noqa: F811
    """A page whose requests outside 127.0.0.1 are aborted and listed."""
    context = chromium.new_context(base_url=server)
    context.set_default_timeout(20_000)
    blocked: list[str] = []

    def only_loopback(route: Any) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", only_loopback)
    try:
        yield context.new_page(), blocked
    finally:
        context.close()


def test_swagger_ui_renders_offline(offline_page: tuple[Any, list[str]]) -> None:
    page, blocked = offline_page
    page.goto("/docs")
    page.locator(".opblock").first.wait_for()
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    for path in OPERATIONS:
        assert any(p.replace("\u200b", "") == path for p in paths), (path, paths)
    assert not blocked, f"/docs asked the internet for {blocked}"


def test_redoc_renders_offline(offline_page: tuple[Any, list[str]]) -> None:
    page, blocked = offline_page
    page.goto("/redoc")
    operations = page.locator("[data-section-id^='operation/']")
    operations.first.wait_for()
    assert operations.count() >= len(OPERATIONS)
    text = page.locator("body").inner_text()
    for path in OPERATIONS:
        assert path in text, path
    logo = page.locator("img[alt='redocly logo']")
    logo.wait_for()
    assert logo.evaluate("img => img.complete && img.naturalWidth > 0"), "the logo did not load"
    assert not blocked, f"/redoc asked the internet for {blocked}"
