"""The dashboard end to end in a real browser: Debian's chromium driven by Playwright against
``verimail serve`` on loopback, as a customer uses it.

Sign up (which signs in), create an API key and use it over plain HTTP, try one address,
upload a CSV, watch the job complete (the page polls by itself) and read its chart, preview
its results filtered by status, download the results and one segment, choose the email
column of a file where it is not detected, find one person's address and a CSV of people's
with the Email Finder, read credits and plan, log out and back in. Every page is saved as a
screenshot under ``test-artifacts/dashboard/``; with ``VERIMAIL_DOC_SCREENSHOTS=1`` (``make
screenshots``) the pages the documentation shows are also written to ``docs/images/``.

The browser is the system's ``/usr/bin/chromium`` (``make venv`` installs Debian's package
when it is missing); Playwright never downloads one. The test skips only when that
browser is not there or cannot start.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import api_world, env_for_testbed, serve_processes

pytestmark = pytest.mark.usefixtures("prefect_harness")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",  # tests run as root in a container
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
DOC_IMAGES = ROOT / "docs" / "images"
EMAIL = "e2e.customer@example.com"
PASSWORD = "a long enough password"
JOB_TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless chromium under Playwright; a skip (saying why) when there is none to start."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"no {CHROMIUM}: Debian's chromium is not installed and could not be "
            "(`make venv` installs it with apt where apt is available)"
        )
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    # Chromium keeps a Unix socket in its profile under TMPDIR, and a socket path is at most
    # 107 bytes: under a long TMPDIR (a fresh machine's may be) it cannot start. Its
    # profile goes to a short folder instead (Playwright's driver reads TMPDIR at start).
    short_tmp = Path(tempfile.mkdtemp(prefix="vm-chromium-", dir="/tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(short_tmp))
        playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
    except PlaywrightError as exc:
        playwright.stop()
        shutil.rmtree(short_tmp, ignore_errors=True)
        pytest.skip(f"{CHROMIUM} is installed but could not be started: {exc.message[:500]}")
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()
        shutil.rmtree(short_tmp, ignore_errors=True)


@pytest.fixture
def server(testbed_factory, tmp_path) -> Iterator[str]:
    """``verimail serve`` on a loopback port, verifying against the testbed, jobs on the
    session's Prefect server."""
    from prefect.settings import PREFECT_API_URL

    tb = testbed_factory(api_world())
    env = {
        **env_for_testbed(tb),
        "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
        "VERIMAIL_PREFECT_WARM_UP": "false",
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
    }
    with serve_processes(1, env, tmp_path) as servers:
        yield servers[0].base_url


def shot(page: Any, name: str, doc: str | None = None) -> None:
    """The page under test-artifacts; also as ``docs/images/<doc>.png`` when the run makes
    the documentation's pictures (``make screenshots``)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    if doc and os.environ.get("VERIMAIL_DOC_SCREENSHOTS") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOC_IMAGES / f"{doc}.png"), full_page=True)


def submit(page: Any, form: str) -> None:
    """Click the form's submit button and wait for the page that answers."""
    with page.expect_navigation():
        page.locator(f"{form} button[type=submit]").click()


def download_rows(page: Any, link: str, name: str) -> list[list[str]]:
    """Click the download ``link``, keep the file as ``name`` and read it as CSV rows."""
    with page.expect_download() as info:
        page.click(link)
    saved = ARTIFACTS / name
    info.value.save_as(str(saved))
    return list(csv.reader(io.StringIO(saved.read_text("utf-8"))))


def test_customer_journey_in_chromium(chromium, server, tmp_path):
    for old in ARTIFACTS.glob("*"):  # only this run's pictures
        old.unlink()
    context = chromium.new_context(
        base_url=server, accept_downloads=True, viewport={"width": 1280, "height": 900}
    )
    context.set_default_timeout(30_000)
    page = context.new_page()
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        _journey(page, server, tmp_path)
    except Exception:
        shot(page, "zz-failure")
        raise
    finally:
        context.close()
    assert not console_errors, console_errors  # e.g. a CSP violation or a script error


def _journey(page: Any, server: str, tmp_path: Path) -> None:
    # Sign up: the login form, the address filled in, the same for a new and a taken
    # address; logging in goes on to the keys page (the next step).
    page.goto("/dashboard")
    assert page.url.endswith("/dashboard/login?next=/dashboard")
    page.goto("/dashboard/signup")
    shot(page, "01-signup", "signup")
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=password_confirm]", PASSWORD)
    submit(page, "main form")
    assert "log in with the password you just chose" in page.inner_text(".notice")
    assert page.input_value("input[name=email]") == EMAIL
    page.fill("input[name=password]", PASSWORD)
    submit(page, "main form")
    assert page.url.endswith("/dashboard/keys?notice=welcome")
    assert "you are signed in" in page.inner_text(".notice")
    assert EMAIL in page.inner_text("header")
    shot(page, "02-welcome")
    page.click("nav >> text=Overview")
    assert page.url == f"{server}/dashboard"
    assert page.inner_text("[data-testid=balance]") == "125"  # 100 signup + 25 Free a day
    shot(page, "03-overview")

    # The session cookie is out of reach of scripts and scoped to the dashboard.
    cookie = next(c for c in page.context.cookies() if c["name"] == "vm_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/dashboard"

    # An API key, shown once, used with plain HTTP.
    page.click("nav >> text=API keys")
    shot(page, "04-keys")
    page.fill("input[name=name]", "e2e laptop")
    submit(page, "form[action='/dashboard/keys']")
    key = page.input_value("[data-testid=new-key]")
    assert re.fullmatch(r"vm_[A-Za-z0-9_-]{43}", key), key
    shot(page, "05-key-created", "keys")
    response = httpx.post(
        f"{server}/api/verify/single",
        json={"email": "alice@acme.test"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "valid"
    page.goto("/dashboard/keys")
    assert key not in page.content()  # never shown again
    assert "never" not in page.inner_text("table")  # last used: just now

    # Try one address in the browser.
    page.click("nav >> text=Try an address")
    page.fill("main input[name=email]", "nobody@acme.test")
    submit(page, "main form")
    assert page.inner_text("[data-testid=result] .status") == "Invalid"
    shot(page, "06-try-an-address")

    # Upload a CSV, watch it complete, download the results.
    people = tmp_path / "people.csv"
    people.write_text(
        "id,Name,Email Address\n1,Alice,alice@acme.test\n2,Sam,sam@slow.test\n"
        "3,Nobody,nobody@acme.test\n4,Any,someone@catchall.test\n"
    )
    page.click("nav >> text=Upload a list")
    shot(page, "07-upload", "upload")
    page.set_input_files("input[name=file]", str(people))
    submit(page, "form[action='/dashboard/upload']")
    assert re.search(r"/dashboard/jobs/\d+$", page.url), page.url
    shot(page, "08-job-started")
    page.wait_for_selector("[data-testid=download]", timeout=JOB_TIMEOUT_MS)
    assert page.inner_text(".job-progress .status") == "Completed"
    # The breakdown chart: one bar segment per status present, a legend with the counts.
    chart = page.locator("[data-testid=job-chart]")
    assert chart.locator("svg rect[data-status=valid]").count() == 1
    assert chart.locator("svg rect[data-status=invalid]").count() == 1
    assert "Valid 2" in " ".join(chart.locator(".legend li").all_inner_texts())
    shot(page, "09-job-completed", "job")
    rows = download_rows(page, "[data-testid=download]", "results.csv")
    assert rows[0] == ["id", "Name", "Email Address", "Safe to Send"]
    assert [r[-1] for r in rows[1:]] == ["Yes", "Yes", "No", "No"]

    # One segment: only the valid rows, with the details columns.
    rows = download_rows(page, "[data-testid=segment-valid]", "valid.csv")
    assert [r[2] for r in rows[1:]] == ["alice@acme.test", "sam@slow.test"]
    assert rows[0][3:5] == ["Safe to Send", "Status"]

    # The results preview, filtered to the invalid addresses.
    page.click("[data-testid=preview-link]")
    assert len(page.locator("table.results tbody tr").all()) == 4
    page.select_option("select[name=status]", "invalid")
    submit(page, "[data-testid=filters]")
    assert "status=invalid" in page.url
    cells = page.locator("table.results tbody tr td:first-child").all_inner_texts()
    assert cells == ["nobody@acme.test"]
    assert "Mailbox not found" in page.inner_text("table.results")
    shot(page, "09b-results-preview", "results")

    # A file whose email column is not recognised: choose it from the file's columns.
    odd = tmp_path / "odd.csv"
    odd.write_text("who,where\nalice@acme.test,x\nbob@acme.test,y\nn/a,z\nn/a,z\nn/a,z\n")
    page.click("nav >> text=Upload a list")
    page.set_input_files("input[name=file]", str(odd))
    submit(page, "form[action='/dashboard/upload']")
    assert page.locator("select[name=email_column] option").all_inner_texts() == ["who", "where"]
    shot(page, "10-column-picker")
    page.select_option("select[name=email_column]", "who")
    submit(page, "form[action='/dashboard/upload/column']")
    page.wait_for_selector("[data-testid=download]", timeout=JOB_TIMEOUT_MS)
    assert page.inner_text("dl.facts [data-status=valid]") == "2"  # (the status groups)

    page.click("nav >> text=Jobs")
    assert page.locator("text=Download CSV").count() == 2
    assert "CSV upload" in page.inner_text("table") and "bulk_csv" not in page.content()
    shot(page, "11-jobs")

    # The Email Finder: one person, then a CSV of people (a job page like a bulk one).
    page.click("nav >> text=Email Finder")
    page.fill("input[name=first_name]", "Alice")
    page.fill("input[name=last_name]", "Smith")
    page.fill("input[name=domain]", "acme.test")
    submit(page, "[data-testid=finder-form]")
    result = page.inner_text("[data-testid=finder-result]")
    assert "alice@acme.test" in result and "Found" in result
    shot(page, "11b-finder", "finder")
    team = tmp_path / "team.csv"
    team.write_text("first_name,last_name,domain\nAlice,Smith,acme.test\nBob,Jones,acme.test\n")
    page.set_input_files("input[name=file]", str(team))
    submit(page, "form[action='/dashboard/finder/upload']")
    assert re.search(r"/dashboard/jobs/\d+$", page.url), page.url
    page.wait_for_selector("[data-testid=download]", timeout=JOB_TIMEOUT_MS)
    assert page.inner_text("[data-field=found_count]") == "2"
    assert "Email Finder CSV" in page.inner_text("h1")
    assert page.locator("[data-testid=job-chart] rect[data-status=found]").count() == 1
    shot(page, "11c-finder-job", "finder-job")
    rows = download_rows(page, "[data-testid=download]", "found.csv")
    assert [r[3] for r in rows[1:]] == ["alice@acme.test", "bob@acme.test"]

    # A CSV of people whose headers the finder does not know: choose its columns, as the
    # verify upload's picker does; the page names no API field (issue 36).
    crew = tmp_path / "crew.csv"
    crew.write_text("given,family,site\nAlice,Smith,acme.test\nZed,Nobody,acme.test\n")
    page.click("nav >> text=Email Finder")
    page.set_input_files("input[name=file]", str(crew))
    submit(page, "form[action='/dashboard/finder/upload']")
    picker = page.locator("[data-testid=finder-picker]")
    assert "domain_column" not in picker.inner_text() and "_column" not in picker.inner_text()
    assert page.locator("select[name=domain_column] option").all_inner_texts()[1:] == [
        "given", "family", "site",
    ]  # fmt: skip
    shot(page, "11e-finder-column-picker")
    page.select_option("select[name=first_name_column]", "given")
    page.select_option("select[name=last_name_column]", "family")
    page.select_option("select[name=domain_column]", "site")
    submit(page, "form[action='/dashboard/finder/upload/columns']")
    assert re.search(r"/dashboard/jobs/\d+$", page.url), page.url
    page.wait_for_selector("[data-testid=download]", timeout=JOB_TIMEOUT_MS)
    assert page.inner_text("[data-field=found_count]") == "1"

    # The jobs list on a phone: no wider than the screen (it overflowed at 390 px).
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/dashboard/jobs")
    widths = page.evaluate(
        """() => {
            const table = document.querySelector('[data-testid=jobs-table]');
            const card = table.closest('.card');
            return {page: document.documentElement.scrollWidth,
                    table: table.getBoundingClientRect().right,
                    card: card.scrollWidth - card.clientWidth};
        }"""
    )
    assert widths["page"] <= 390 and widths["table"] <= 390 and widths["card"] <= 0, widths
    shot(page, "11f-jobs-at-390px")
    page.set_viewport_size({"width": 1280, "height": 900})

    page.click("nav >> text=Overview")
    assert page.locator("figure.breakdown rect[data-status=valid]").count() == 1
    assert page.locator("figure.daily rect").count() == 30
    shot(page, "11d-overview-with-charts", "overview")
    page.click("nav >> text=Credits")
    ledger = page.inner_text("table.ledger")
    for reason in ("signup credits", "verify single", "verify single (dashboard)", "CSV upload"):
        assert reason in ledger
    assert "bulk_csv" not in ledger and "request:" not in ledger
    shot(page, "12-credits", "credits")
    page.click("nav >> text=Plan")
    assert "Your plan: Free" in page.inner_text("main")
    assert "verimail credits grant" in page.inner_text("#upgrade")
    shot(page, "13-plan", "plan")

    # Log out: the dashboard asks for a login again.
    submit(page, "form.logout")
    assert "/dashboard/login" in page.url and "logged out" in page.inner_text(".notice")
    shot(page, "14-logged-out")
    page.goto("/dashboard/keys")
    assert "/dashboard/login" in page.url
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", PASSWORD)
    submit(page, "main form")
    assert page.url == f"{server}/dashboard/keys"  # back where the login was asked for
