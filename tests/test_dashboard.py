"""The dashboard over HTTP (in-process ASGI): every page and form, sessions and cookies,
CSRF, the login throttle, enumeration-safe messages and other accounts' objects (404).

Jobs run for real (local runner, Prefect harness) against the loopback testbed.
"""

from __future__ import annotations

import asyncio
import csv
import html
import io
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from api_helpers import RunningApp, api_world, env_for_testbed, running_app, serve_processes
from cli_helpers import folded
from pydantic import SecretStr
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from verimail.api.dashboard import verify as verify_pages
from verimail.api.dashboard.account import NOTICES
from verimail.api.dashboard.security import (
    LOGIN_FAILURES,
    LOGIN_FAILURES_PER_ADDRESS,
    SESSION_COOKIE,
    SIGNUPS_PER_HOUR,
    hash_password_sync,
)
from verimail.api.dashboard.uploads import PICKER_MAX_COLUMNS
from verimail.store import accounts as acc
from verimail.store.billing.ledger import ledger
from verimail.store.billing.movements import grant, refund
from verimail.store.billing.pools import balance
from verimail.store.jobs import list_jobs

PASSWORD = "correct horse battery"
CSRF_PAGE = "did not come from this site"
LOGIN_FAILED = "Email or password is incorrect."


@pytest.fixture
def settings(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(api_world())
    return testbed_settings(tb, tmp_path, upload_max_bytes=20_000, upload_max_rows=1000)


# --- helpers -------------------------------------------------------------------------------


@asynccontextmanager
async def browser(
    app: RunningApp, base_url: str = "http://verimail.test", address: str = "127.0.0.1"
) -> AsyncIterator[httpx.AsyncClient]:
    """Another client on the same app: its own cookie jar, like a second browser."""
    transport = httpx.ASGITransport(app=app.app, client=(address, 50000))
    async with httpx.AsyncClient(transport=transport, base_url=base_url, timeout=60) as client:
        yield client


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token on the page"
    return match.group(1)


async def token(client: httpx.AsyncClient, page: str = "/dashboard/login") -> str:
    response = await client.get(page)
    assert response.status_code == 200, (page, response.status_code, response.text[:500])
    return csrf_of(response.text)


async def sign_up(
    client: httpx.AsyncClient, email: str, password: str = PASSWORD
) -> httpx.Response:
    return await client.post(
        "/dashboard/signup",
        data={
            "csrf_token": await token(client, "/dashboard/signup"),
            "email": email,
            "password": password,
            "password_confirm": password,
        },
    )


async def log_in(
    client: httpx.AsyncClient, email: str, password: str = PASSWORD, next: str = ""
) -> httpx.Response:
    return await client.post(
        "/dashboard/login",
        data={
            "csrf_token": await token(client),
            "email": email,
            "password": password,
            "next": next,
        },
    )


def make_user(
    app: RunningApp,
    email: str,
    *,
    plan: str = "enterprise",
    credits: int = 100,
    is_admin: bool = False,
) -> acc.Account:
    """An account with a dashboard password, ``credits`` prepaid (enterprise: no allowance)."""
    settings = app.store.settings.model_copy(update={"signup_credits": credits})
    return acc.create_account(
        app.store.engine,
        settings,
        plan=plan,
        email=email,
        password_hash=hash_password_sync(PASSWORD),
        is_admin=is_admin,
    )


async def logged_in(client: httpx.AsyncClient, email: str) -> None:
    response = await log_in(client, email)
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/dashboard"


def set_cookie_header(response: httpx.Response) -> str:
    cookies = [v for k, v in response.headers.multi_items() if k == "set-cookie"]
    assert len(cookies) == 1, cookies
    return cookies[0]


def upload_files(content: str, name: str = "list.csv") -> dict:
    return {"file": (name, content.encode("utf-8"), "text/csv")}


async def upload(client: httpx.AsyncClient, content: str, name: str = "list.csv"):
    csrf = await token(client, "/dashboard/upload")
    return await client.post(
        "/dashboard/upload", data={"csrf_token": csrf}, files=upload_files(content, name)
    )


async def wait_finished(client: httpx.AsyncClient, job_id: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        response = await client.get(f"/dashboard/jobs/{job_id}/progress")
        assert response.status_code == 200, response.text
        body = response.json()
        if body["finished"]:
            return body
        assert time.monotonic() < deadline, f"job {job_id} still {body['status']}"
        await asyncio.sleep(0.05)


def job_id_of(response: httpx.Response) -> int:
    assert response.status_code == 303, (response.status_code, response.text[:2000])
    match = re.fullmatch(r"/dashboard/jobs/(\d+)", response.headers["location"])
    assert match, response.headers["location"]
    return int(match.group(1))


# --- pages and login -----------------------------------------------------------------------

PAGES = [
    "/dashboard",
    "/dashboard/credits",
    "/dashboard/plan",
    "/dashboard/keys",
    "/dashboard/jobs",
    "/dashboard/jobs/1",
    "/dashboard/upload",
    "/dashboard/verify",
    "/dashboard/admin/accounts",
]


async def test_a_page_asked_with_another_method_is_an_html_405(settings):
    """PUT /dashboard/keys got the API's JSON 405 ("use GET") without the dashboard's
    security headers, though POST is taken there too."""
    async with running_app(settings) as app:
        for method, path, allow in [
            ("PUT", "/dashboard/keys", "GET, POST"),
            ("DELETE", "/dashboard/jobs/1", "GET"),
            ("PATCH", "/dashboard/login", "GET, POST"),
            ("PUT", "/dashboard/finder", "GET, POST"),  # (a page of another module)
            ("DELETE", "/dashboard/jobs/1/results", "GET"),
            ("PUT", "/dashboard/upload", "GET, POST"),  # (every page module counts)
            ("GET", "/dashboard/jobs/1/reverify", "POST"),
        ]:
            response = await app.client.request(method, path)
            assert response.status_code == 405, (method, path)
            assert response.headers["content-type"].startswith("text/html")
            assert "content-security-policy" in response.headers
            assert response.headers["cache-control"] == "no-store"
            assert response.headers["allow"] == allow
        unknown = await app.client.request("DELETE", "/dashboard/no-such-page")
        assert unknown.status_code == 404 and unknown.headers["content-type"].startswith(
            "text/html"
        )


async def test_every_page_needs_a_login(settings):
    async with running_app(settings) as app:
        for page in PAGES:
            response = await app.client.get(page + "?page=2")
            assert response.status_code == 303, page
            assert response.headers["location"] == (f"/dashboard/login?next={page}%3Fpage%3D2"), (
                page
            )
        for action in ("/dashboard/keys", "/dashboard/verify", "/dashboard/upload"):
            response = await app.client.post(action, data={"csrf_token": "x"})
            assert response.status_code == 303, action
        # The login page is public, and sets an anonymous session for its CSRF token.
        login = await app.client.get("/dashboard/login")
        assert login.status_code == 200 and 'name="password"' in login.text


async def test_signup_login_pages_logout(settings):
    async with running_app(settings) as app:
        client = app.client
        response = await sign_up(client, "New.User@Example.COM")
        assert response.status_code == 200 and NOTICES["signed_up"] in html.unescape(response.text)
        assert 'action="/dashboard/login"' in response.text
        assert 'value="New.User@Example.COM"' in response.text
        account = acc.get_account_by_email(app.store.engine, "new.user@example.com")
        assert account is not None and account.plan == "free" and not account.is_admin
        assert account.password_hash and account.password_hash.startswith("$argon2id$")
        assert PASSWORD not in account.password_hash
        assert balance(app.store.engine, account.id).prepaid == settings.signup_credits == 100
        # Not signed in by the sign-up (it would tell a new address from a taken one): the
        # login form it shows goes on to the page of the next step.
        assert (await client.get("/dashboard/keys")).status_code == 303
        first = await client.post(
            "/dashboard/login",
            data={
                "csrf_token": csrf_of(response.text),
                "email": "New.User@Example.COM",
                "password": PASSWORD,
                "next": re.search(r'name="next" value="([^"]+)"', response.text).group(1),
            },
        )
        assert first.status_code == 303
        assert first.headers["location"] == "/dashboard/keys?notice=welcome"
        welcome = await client.get(first.headers["location"])
        assert welcome.status_code == 200 and "you are signed in" in welcome.text
        assert "new.user@example.com" in welcome.text and "Create a key" in welcome.text
        out = await client.post("/dashboard/logout", data={"csrf_token": csrf_of(welcome.text)})
        assert out.status_code == 303

        logged = await log_in(client, "new.user@example.com", next="/dashboard/credits")
        assert logged.status_code == 303 and logged.headers["location"] == "/dashboard/credits"
        cookie = set_cookie_header(logged)
        assert cookie.startswith(f"{SESSION_COOKIE}=")
        flags = [part.strip().lower() for part in cookie.split(";")]
        assert "httponly" in flags and "samesite=lax" in flags and "path=/dashboard" in flags
        assert "secure" not in flags  # plain http here; see the https test
        assert PASSWORD not in cookie and "example.com" not in cookie

        pages = {}
        for page in PAGES[:-1]:
            if page == "/dashboard/jobs/1":
                continue
            response = await client.get(page)
            assert response.status_code == 200, (page, response.text[:500])
            assert "new.user@example.com" in response.text
            pages[page] = response.text
        # 100 signup credits + the Free plan's 25 a day.
        assert 'data-testid="balance">125<' in pages["/dashboard"]
        assert "25 per day" in pages["/dashboard/plan"]
        assert "signup credits" in pages["/dashboard/credits"]

        out = await client.post(
            "/dashboard/logout", data={"csrf_token": csrf_of(pages["/dashboard"])}
        )
        assert out.status_code == 303 and out.headers["location"].endswith("notice=logged_out")
        assert (await client.get("/dashboard/keys")).status_code == 303


async def test_logout_ends_every_copy_of_the_session(settings):
    """The session is a signed cookie, so logging out must also end a copy taken before
    (another browser, a stolen cookie) — and only that session, not the account's others."""
    async with running_app(settings) as app:
        make_user(app, "copied@example.com")
        async with browser(app) as first, browser(app) as copy, browser(app) as other:
            assert (await log_in(first, "copied@example.com")).status_code == 303
            assert (await log_in(other, "copied@example.com")).status_code == 303
            copy.cookies.set(
                SESSION_COOKIE, first.cookies[SESSION_COOKIE], "verimail.test", "/dashboard"
            )
            assert (await copy.get("/dashboard/keys")).status_code == 200
            page = await first.get("/dashboard")
            out = await first.post("/dashboard/logout", data={"csrf_token": csrf_of(page.text)})
            assert out.status_code == 303

            replayed = await copy.get("/dashboard/keys")
            assert replayed.status_code == 303
            assert replayed.headers["location"].startswith("/dashboard/login")
            assert (await first.get("/dashboard/keys")).status_code == 303
            kept = await other.get("/dashboard/keys")
            assert kept.status_code == 200 and "copied@example.com" in kept.text


async def test_session_cookie_is_secure_over_https(settings):
    async with running_app(settings) as app:
        make_user(app, "tls@example.com")
        async with browser(app, base_url="https://verimail.test") as client:
            response = await log_in(client, "tls@example.com")
            assert response.status_code == 303
            flags = [p.strip().lower() for p in set_cookie_header(response).split(";")]
            assert "secure" in flags and "httponly" in flags and "samesite=lax" in flags
            assert (await client.get("/dashboard")).status_code == 200


async def test_wrong_password_and_unknown_email_read_the_same(settings):
    async with running_app(settings) as app:
        make_user(app, "known@example.com")
        wrong = await log_in(app.client, "known@example.com", "not the password")
        unknown = await log_in(app.client, "nobody@example.com", "not the password")
        cli_made = acc.create_account(app.store.engine, settings, email="cli@example.com")
        no_password = await log_in(app.client, cli_made.email or "", "whatever password")
        for response in (wrong, unknown, no_password):
            assert response.status_code == 400
            assert LOGIN_FAILED in response.text
        # Same page, word for word, apart from the address typed back into the form.
        assert wrong.text.replace("known@", "X@") == unknown.text.replace("nobody@", "X@")
        assert (await app.client.get("/dashboard")).status_code == 303


async def test_signup_reads_the_same_for_a_new_and_a_taken_address(settings):
    """Issue 47: sign-up answered 409 "This address already has an account" — a list of
    accounts for anyone who asks. Now a new and a taken address get the same answer, word
    for word apart from the address typed back (the login form, and a notice that covers
    both); the stranger's password neither signs in nor changes the account."""
    async with running_app(settings) as app:
        async with browser(app) as first:
            new = await sign_up(first, "taken@example.com")
        async with browser(app) as other:
            taken = await sign_up(other, "Taken@Example.com", "another password!")
            assert (await other.get("/dashboard/keys")).status_code == 303  # not signed in
            assert (
                await log_in(other, "taken@example.com", "another password!")
            ).status_code == 400
        assert new.status_code == taken.status_code == 200
        assert new.headers.keys() == taken.headers.keys()
        assert 'value="Taken@Example.com"' in taken.text

        def neutral(page: httpx.Response, typed: str) -> str:
            return page.text.replace(csrf_of(page.text), "T").replace(f'value="{typed}"', "E")

        assert neutral(new, "taken@example.com") == neutral(taken, "Taken@Example.com")
        async with browser(app) as owner:
            assert (await log_in(owner, "taken@example.com")).status_code == 303
        assert len([a for a in acc.list_accounts(app.store.engine) if a.email]) == 1


async def test_signup_of_another_case_of_a_cli_accounts_email_makes_no_account(settings):
    """A CLI account keeps its address as typed; signing up its lower-case form made a
    second account, which the sign-in found first: the owner could no longer log in."""
    async with running_app(settings) as app:
        make_user(app, "Bob@Example.com")
        async with browser(app) as stranger:
            signed = await sign_up(stranger, "bob@example.com", "another password!")
            assert signed.status_code == 200
            assert (
                await log_in(stranger, "bob@example.com", "another password!")
            ).status_code == 400
        assert [a.email for a in acc.list_accounts(app.store.engine) if a.email] == [
            "Bob@Example.com"
        ]
        async with browser(app, address="127.0.0.3") as owner:
            assert (await log_in(owner, "Bob@Example.com")).status_code == 303


async def test_signup_validation(settings):
    async with running_app(settings) as app:
        csrf = await token(app.client, "/dashboard/signup")
        for email, password, confirm, message in [
            ("not an email", PASSWORD, PASSWORD, "valid email"),
            ("a@example.com", "short", "short", "at least 10"),
            ("a@example.com", PASSWORD, PASSWORD + "x", "differ"),
        ]:
            response = await app.client.post(
                "/dashboard/signup",
                data={
                    "csrf_token": csrf,
                    "email": email,
                    "password": password,
                    "password_confirm": confirm,
                },
            )
            assert response.status_code == 422 and message in response.text
        assert acc.list_accounts(app.store.engine) == []


async def test_signups_per_address_are_limited(settings, monkeypatch):
    from verimail.api.dashboard import security

    monkeypatch.setattr(security, "_SIGNUP", security.RateLimitItemPerHour(2))
    async with running_app(settings) as app:
        for i in range(2):
            async with browser(app) as client:
                assert (await sign_up(client, f"s{i}@example.com")).status_code == 200
        refused = await sign_up(app.client, "s2@example.com")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert acc.get_account_by_email(app.store.engine, "s2@example.com") is None


async def test_login_rate_limit_per_email_and_address(settings):
    async with running_app(settings) as app:
        make_user(app, "victim@example.com")
        make_user(app, "bystander@example.com")
        for _ in range(LOGIN_FAILURES):
            assert (
                await log_in(app.client, "victim@example.com", "guess guess")
            ).status_code == 400
        blocked = await log_in(app.client, "victim@example.com")  # even the right password
        assert blocked.status_code == 429
        assert 1 <= int(blocked.headers["retry-after"]) <= 15 * 60
        assert "Too many failed logins" in blocked.text
        assert (await app.client.get("/dashboard")).status_code == 303
        # Another address may still log in to that account; this address to another one.
        async with browser(app, address="127.0.0.2") as elsewhere:
            assert (await log_in(elsewhere, "victim@example.com")).status_code == 303
        async with browser(app) as same_address:
            assert (await log_in(same_address, "bystander@example.com")).status_code == 303


@pytest.mark.parametrize("redis", [False, True], ids=["memory", "redis"])
async def test_a_burst_of_guesses_checks_no_more_passwords_than_the_limit(settings, redis):
    """40 guesses at once for one account from one address: each is counted before its
    password is checked, so at most LOGIN_FAILURES are checked and the rest answered 429 —
    in one process's memory and in Redis alike."""
    if redis:
        settings = settings.model_copy(update={"redis_url": "redis://127.0.0.1:6379/0"})
    async with running_app(settings, rate_limit_prefix=f"burst-{secrets.token_hex(4)}") as app:
        make_user(app, "victim@example.com")
        async with browser(app) as client:
            csrf = await token(client)

            async def guess(i: int) -> int:
                password = PASSWORD if i == 39 else f"wrong guess {i}"
                form = {"csrf_token": csrf, "email": "victim@example.com", "password": password}
                return (await client.post("/dashboard/login", data=form)).status_code

            codes = await asyncio.gather(*(guess(i) for i in range(40)))
        checked = [c for c in codes if c != 429]
        assert len(checked) <= LOGIN_FAILURES, sorted(codes)


@pytest.mark.parametrize("redis", [False, True], ids=["memory", "redis"])
async def test_a_burst_of_guesses_at_many_emails_checks_no_more_than_the_address_limit(
    settings, redis
):
    """Spraying: 80 guesses at once from one address, each at another email. The
    address-wide limit was checked before and counted after the password check, so every
    guess of a burst passed (all 400, no 429); now at most LOGIN_FAILURES_PER_ADDRESS are
    checked, and a good login from the address still counts for nothing."""
    if redis:
        settings = settings.model_copy(update={"redis_url": "redis://127.0.0.1:6379/0"})
    burst = LOGIN_FAILURES_PER_ADDRESS + 30
    async with running_app(settings, rate_limit_prefix=f"spray-{secrets.token_hex(4)}") as app:
        csrf = await token(app.client)

        async def guess(i: int) -> int:
            form = {"csrf_token": csrf, "email": f"user{i}@example.com", "password": "x" * 12}
            return (await app.client.post("/dashboard/login", data=form)).status_code

        codes = await asyncio.gather(*(guess(i) for i in range(burst)))
    assert codes.count(400) <= LOGIN_FAILURES_PER_ADDRESS, sorted(codes)
    assert codes.count(429) >= burst - LOGIN_FAILURES_PER_ADDRESS


@pytest.mark.parametrize("redis", [False, True], ids=["memory", "redis"])
async def test_a_burst_of_signups_makes_no_more_accounts_than_the_limit(settings, redis):
    """30 sign-ups at once from one address: at most SIGNUPS_PER_HOUR accounts (each comes
    with free credits), whichever store holds the counters."""
    if redis:
        settings = settings.model_copy(update={"redis_url": "redis://127.0.0.1:6379/0"})
    async with running_app(settings, rate_limit_prefix=f"burst-{secrets.token_hex(4)}") as app:

        async def one(i: int) -> httpx.Response:
            async with browser(app) as client:
                return await sign_up(client, f"farm{i}@example.com")

        codes = await asyncio.gather(*(one(i) for i in range(30)))
        made = [
            i
            for i in range(30)
            if acc.get_account_by_email(app.store.engine, f"farm{i}@example.com")
        ]
    assert (
        len(made) <= SIGNUPS_PER_HOUR
        and [r.status_code for r in codes].count(429) >= 30 - SIGNUPS_PER_HOUR
    )


async def test_good_logins_from_one_address_never_lock_it_out(settings):
    """An office behind one address: LOGIN_FAILURES_PER_ADDRESS successful logins, then a
    colleague's first one still succeeds (only failures count for the address)."""
    async with running_app(settings) as app:
        make_user(app, "owner@example.com")
        make_user(app, "colleague@example.com")
        for _ in range(LOGIN_FAILURES_PER_ADDRESS):
            async with browser(app) as client:
                assert (await log_in(client, "owner@example.com")).status_code == 303
        async with browser(app) as client:
            assert (await log_in(client, "colleague@example.com")).status_code == 303


async def test_a_successful_login_clears_earlier_failures(settings):
    async with running_app(settings) as app:
        make_user(app, "forgetful@example.com")
        for _ in range(LOGIN_FAILURES - 1):
            await log_in(app.client, "forgetful@example.com", "wrong wrong")
        assert (await log_in(app.client, "forgetful@example.com")).status_code == 303
        async with browser(app) as again:
            for _ in range(LOGIN_FAILURES - 1):
                assert (await log_in(again, "forgetful@example.com", "wrong")).status_code == 400
            assert (await log_in(again, "forgetful@example.com")).status_code == 303


async def test_next_only_redirects_inside_the_dashboard(settings):
    async with running_app(settings) as app:
        make_user(app, "nav@example.com")
        for target, expected in [
            ("https://evil.example/", "/dashboard"),
            ("//evil.example/dashboard", "/dashboard"),
            ("/\\evil.example", "/dashboard"),
            ("/api/health", "/dashboard"),
            ("/dashboardx", "/dashboard"),
            ("/dashboard/../api/health", "/dashboard"),  # a browser resolves the ".."
            ("/dashboard/%2e%2e/docs", "/dashboard"),
            ("/dashboard/..//evil.example", "/dashboard"),
            ("/dashboard/keys//", "/dashboard"),
            ("/dashboard/keys", "/dashboard/keys"),
            ("/dashboard/", "/dashboard/"),
            ("/dashboard/jobs/7?page=2", "/dashboard/jobs/7?page=2"),
        ]:
            async with browser(app) as client:
                response = await log_in(client, "nav@example.com", next=target)
                assert response.headers["location"] == expected, target


# --- sessions ------------------------------------------------------------------------------


async def test_tampered_or_foreign_cookies_are_anonymous(settings, tmp_path):
    async with running_app(settings) as app:
        make_user(app, "sess@example.com")
        await logged_in(app.client, "sess@example.com")
        good = app.client.cookies[SESSION_COOKIE]
        payload, _, rest = good.partition(".")
        async with browser(app) as forger:
            forger.cookies.set(SESSION_COOKIE, payload[:-2] + "xy." + rest, path="/dashboard")
            assert (await forger.get("/dashboard")).status_code == 303
        other_settings = settings.model_copy(
            update={"data_dir": tmp_path / "other", "database_url": settings.database_url}
        )
    async with running_app(other_settings) as other, browser(other) as client:
        client.cookies.set(SESSION_COOKIE, good, path="/dashboard")
        assert (await client.get("/dashboard")).status_code == 303  # other secret


async def test_secret_is_persisted_so_restarts_keep_sessions(settings):
    async with running_app(settings) as app:
        make_user(app, "stay@example.com")
        await logged_in(app.client, "stay@example.com")
        cookie = app.client.cookies[SESSION_COOKIE]
    secret_file = Path(settings.data_dir) / "session_secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert len(secret_file.read_text().strip()) >= 32
    async with running_app(settings) as restarted:
        restarted.client.cookies.set(SESSION_COOKIE, cookie, path="/dashboard")
        assert (await restarted.client.get("/dashboard")).status_code == 200


async def test_configured_secret_is_used(settings):
    configured = settings.model_copy(update={"session_secret": SecretStr("s" * 40)})
    async with running_app(configured) as app:
        make_user(app, "conf@example.com")
        await logged_in(app.client, "conf@example.com")
        cookie = app.client.cookies[SESSION_COOKIE]
    assert not (Path(settings.data_dir) / "session_secret").exists()
    changed = settings.model_copy(update={"session_secret": SecretStr("t" * 40)})
    async with running_app(changed) as app:
        app.client.cookies.set(SESSION_COOKIE, cookie, path="/dashboard")
        assert (await app.client.get("/dashboard")).status_code == 303


async def test_new_password_signs_out_every_session(settings):
    async with running_app(settings) as app:
        user = make_user(app, "rotate@example.com")
        await logged_in(app.client, "rotate@example.com")
        assert (await app.client.get("/dashboard")).status_code == 200
        acc.set_password_hash(app.store.engine, user.id, hash_password_sync("a new password"))
        assert (await app.client.get("/dashboard")).status_code == 303


async def test_login_rotates_the_session_id(settings):
    async with running_app(settings) as app:
        make_user(app, "fix@example.com")
        before = await token(app.client)
        await logged_in(app.client, "fix@example.com")
        after = csrf_of((await app.client.get("/dashboard")).text)
        assert before != after
        response = await app.client.post("/dashboard/keys", data={"csrf_token": before})
        assert response.status_code == 403


# --- CSRF ----------------------------------------------------------------------------------


async def test_forms_without_a_valid_csrf_token_are_refused(settings):
    async with running_app(settings) as app:
        user = make_user(app, "csrf@example.com")
        _raw, key = acc.create_api_key(app.store.engine, user.id, "keep")
        await logged_in(app.client, "csrf@example.com")
        async with browser(app) as attacker:
            foreign = await token(attacker)  # a valid token, of another session
        forms = [
            ("/dashboard/keys", {"name": "x"}),
            (f"/dashboard/keys/{key.id}/revoke", {}),
            ("/dashboard/verify", {"email": "alice@acme.test"}),
            ("/dashboard/upload/column", {"upload": "x", "email_column": "a"}),
            ("/dashboard/logout", {}),
            ("/dashboard/login", {"email": "csrf@example.com", "password": PASSWORD}),
            ("/dashboard/signup", {"email": "n@example.com", "password": PASSWORD}),
        ]
        for action, data in forms:
            for bad in (None, "", "0" * 64, foreign):
                body = dict(data) if bad is None else {**data, "csrf_token": bad}
                response = await app.client.post(action, data=body)
                assert response.status_code == 403, (action, bad, response.status_code)
                assert (
                    CSRF_PAGE in response.text and "text/html" in response.headers["content-type"]
                )
        csrf = csrf_of((await app.client.get("/dashboard")).text)
        upload_response = await app.client.post(
            "/dashboard/upload",
            data={"csrf_token": foreign},
            files=upload_files("email\nalice@acme.test\n"),
        )
        assert upload_response.status_code == 403
        cross_site = await app.client.post(
            "/dashboard/keys",
            data={"csrf_token": csrf, "name": "x"},
            headers={"Sec-Fetch-Site": "cross-site"},
        )
        assert cross_site.status_code == 403
        # Nothing happened: still logged in, no key made or revoked, nothing charged.
        keys = acc.list_keys(app.store.engine, user.id)
        assert [(k.name, k.active) for k in keys] == [("keep", True)]
        assert balance(app.store.engine, user.id).total == 100
        assert list_jobs(app.store.engine, user.id) == []
        assert not any((Path(settings.data_dir) / "uploads").rglob("*.csv"))
        assert (await app.client.get("/dashboard")).status_code == 200


# --- keys ----------------------------------------------------------------------------------


async def test_keys_create_once_use_revoke(settings):
    async with running_app(settings) as app:
        user = make_user(app, "keys@example.com")
        other = make_user(app, "other@example.com")
        other_raw, other_key = acc.create_api_key(app.store.engine, other.id, "theirs")
        await logged_in(app.client, "keys@example.com")
        page = await app.client.get("/dashboard/keys")
        created = await app.client.post(
            "/dashboard/keys", data={"csrf_token": csrf_of(page.text), "name": "ci <b>"}
        )
        assert created.status_code == 200
        match = re.search(r'value="(vm_[A-Za-z0-9_-]{43})"[^>]*data-testid="new-key"', created.text)
        assert match is not None and "shown only this once" in created.text
        raw_key = match.group(1)
        assert "ci &lt;b&gt;" in created.text  # escaped
        headers = {"Authorization": f"Bearer {raw_key}"}
        probe = await app.client.get("/api/bulk/999999", headers=headers)
        assert probe.status_code == 404  # authenticated: the job just does not exist
        listing = await app.client.get("/dashboard/keys")
        assert raw_key not in listing.text and raw_key[:12] in listing.text
        assert "never" not in listing.text.split("ci &lt;b&gt;")[1].split("</tr>")[0]

        key = next(k for k in acc.list_keys(app.store.engine, user.id) if k.name == "ci <b>")
        csrf = csrf_of(listing.text)
        foreign = await app.client.post(
            f"/dashboard/keys/{other_key.id}/revoke", data={"csrf_token": csrf}
        )
        assert foreign.status_code == 404 and "text/html" in foreign.headers["content-type"]
        assert (
            await app.client.post("/dashboard/keys/987654/revoke", data={"csrf_token": csrf})
        ).status_code == 404
        theirs = await app.client.get(
            "/api/bulk/999999", headers={"Authorization": f"Bearer {other_raw}"}
        )
        assert theirs.status_code == 404  # still active

        revoked = await app.client.post(
            f"/dashboard/keys/{key.id}/revoke", data={"csrf_token": csrf}
        )
        assert revoked.status_code == 303 and revoked.headers["location"].endswith("revoked")
        assert (await app.client.get("/api/bulk/999999", headers=headers)).status_code == 401
        after = await app.client.get(revoked.headers["location"])
        assert "revoked" in after.text and "now get 401" in after.text

        too_long = await app.client.post(
            "/dashboard/keys", data={"csrf_token": csrf, "name": "n" * 101}
        )
        assert too_long.status_code == 422
        with_nul = await app.client.post(
            "/dashboard/keys", data={"csrf_token": csrf, "name": "a\x00b"}
        )
        assert with_nul.status_code == 422 and "control characters" in with_nul.text


# --- try one address -----------------------------------------------------------------------


async def test_try_one_address_charges_one_credit(settings):
    async with running_app(settings) as app:
        user = make_user(app, "try@example.com", credits=2)
        await logged_in(app.client, "try@example.com")
        csrf = csrf_of((await app.client.get("/dashboard/verify")).text)
        valid = await app.client.post(
            "/dashboard/verify", data={"csrf_token": csrf, "email": "alice@acme.test"}
        )
        assert valid.status_code == 200, valid.text
        assert 'data-status="valid">Valid<' in valid.text and "mx.acme.test" in valid.text
        invalid = await app.client.post(
            "/dashboard/verify", data={"csrf_token": csrf, "email": "nobody@acme.test"}
        )
        assert 'data-status="invalid">Invalid<' in invalid.text
        assert balance(app.store.engine, user.id).total == 0
        charges = [e for e in ledger(app.store.engine, user.id) if e.kind == "charge"]
        assert [(e.delta, e.reason) for e in charges] == [(-1, "verify single (dashboard)")] * 2
        broke = await app.client.post(
            "/dashboard/verify", data={"csrf_token": csrf, "email": "alice@acme.test"}
        )
        assert broke.status_code == 402 and "Not enough credits" in broke.text
        empty = await app.client.post("/dashboard/verify", data={"csrf_token": csrf, "email": " "})
        assert empty.status_code == 422
        assert len(ledger(app.store.engine, user.id)) == 3  # signup + 2 charges


async def test_try_one_address_keeps_the_plan_rate_limit(settings):
    async with running_app(settings) as app:
        user = make_user(app, "rate@example.com", plan="free", credits=100)
        await logged_in(app.client, "rate@example.com")
        csrf = csrf_of((await app.client.get("/dashboard/verify")).text)
        statuses = []
        for _ in range(11):  # Free: 10 requests per minute
            response = await app.client.post(
                "/dashboard/verify", data={"csrf_token": csrf, "email": "bad-address"}
            )
            statuses.append(response.status_code)
        assert statuses == [200] * 10 + [429]
        assert "requests per minute" in response.text and response.headers["retry-after"]
        assert balance(app.store.engine, user.id).total == 125 - 10


# --- credits, plan, admin ------------------------------------------------------------------


async def test_credits_page_shows_grants_charges_refunds(settings):
    async with running_app(settings) as app:
        user = make_user(app, "ledger@example.com", credits=10)
        grant(app.store.engine, user.id, 50, reason="bought 50")
        from verimail.store.billing.movements import charge

        charge(app.store.engine, user.id, 3, reason="verify batch of 3")
        refund(app.store.engine, user.id, 2, reason="refund: verify batch of 3 failed")
        await logged_in(app.client, "ledger@example.com")
        page = await app.client.get("/dashboard/credits")
        text = page.text
        assert 'data-testid="balance">59 <' in text
        for needle in ("bought 50", "verify batch of 3", "refund: verify batch", "signup credits"):
            assert needle in text
        for kind in ("kind-grant", "kind-charge", "kind-refund", "kind-signup"):
            assert kind in text
        assert ">+50<" in text and ">-3<" in text and ">+2<" in text
        for _ in range(30):
            grant(app.store.engine, user.id, 1, reason="drip")
        first = await app.client.get("/dashboard/credits")
        assert "page=2" in first.text
        second = await app.client.get("/dashboard/credits?page=2")
        assert "signup credits" in second.text and "signup credits" not in first.text


async def test_plan_page_lists_limits(settings):
    async with running_app(settings) as app:
        make_user(app, "plan@example.com", plan="starter")
        await logged_in(app.client, "plan@example.com")
        text = (await app.client.get("/dashboard/plan")).text
        assert "Your plan: Starter" in text
        assert "5,000 credits per month" in text and ">60<" in text
        for name in ("Free", "Pro", "Business", "Enterprise"):
            assert name in text
        assert "10 credits per verified find" in text


async def test_admin_sees_every_account_read_only(settings):
    async with running_app(settings) as app:
        make_user(app, "admin@example.com", is_admin=True)
        make_user(app, "customer@example.com")
        acc.create_account(app.store.engine, settings, email=None)  # CLI-style, no email
        async with browser(app) as customer:
            await logged_in(customer, "customer@example.com")
            assert "All accounts" not in (await customer.get("/dashboard")).text
            refused = await customer.get("/dashboard/admin/accounts")
            assert refused.status_code == 404
            assert "admin@example.com" not in refused.text
        await logged_in(app.client, "admin@example.com")
        page = await app.client.get("/dashboard/admin/accounts")
        assert page.status_code == 200
        assert "customer@example.com" in page.text and "admin@example.com" in page.text
        assert "<form" not in page.text.split("<main>")[1]  # read-only


async def test_security_headers_static_and_html_404(settings):
    async with running_app(settings) as app:
        page = await app.client.get("/dashboard/login")
        assert page.headers["cache-control"] == "no-store"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert "<script>" not in page.text and "style=" not in page.text
        css = await app.client.get("/dashboard/static/dashboard.css")
        js = await app.client.get("/dashboard/static/dashboard.js")
        assert css.status_code == js.status_code == 200
        missing = await app.client.get("/dashboard/no/such/page")
        assert missing.status_code == 404 and "text/html" in missing.headers["content-type"]
        slash = await app.client.get("/dashboard/")
        assert slash.status_code in (303, 307) and slash.headers["location"].endswith("/dashboard")
        # The API keeps answering JSON.
        assert (
            (await app.client.get("/api/nope"))
            .headers["content-type"]
            .startswith("application/json")
        )
        assert "/dashboard" not in (await app.client.get("/openapi.json")).text


# --- uploads and jobs ----------------------------------------------------------------------

LIST = (
    "id,Name,Email Address\n1,Alice,alice@acme.test\n2,Nobody,nobody@acme.test\n"
    "3,Bob,bob@acme.test\n"
)


@pytest.mark.usefixtures("prefect_harness")
async def test_upload_progress_download_and_foreign_404s(settings):
    async with running_app(settings) as app:
        user = make_user(app, "up@example.com", credits=10)
        make_user(app, "snoop@example.com")
        await logged_in(app.client, "up@example.com")
        job_id = job_id_of(await upload(app.client, LIST, "people.csv"))
        assert balance(app.store.engine, user.id).total == 7  # 3 reserved
        page = await app.client.get(f"/dashboard/jobs/{job_id}")
        assert page.status_code == 200 and "people.csv" in page.text
        done = await wait_finished(app.client, job_id)
        assert done["status"] == "completed" and done["processed_emails"] == 3
        assert (done["valid_count"], done["invalid_count"]) == (2, 1)
        page = await app.client.get(f"/dashboard/jobs/{job_id}")
        assert 'data-testid="download"' in page.text and "data-progress-url" not in page.text
        listing = await app.client.get("/dashboard/jobs")
        assert f"/dashboard/jobs/{job_id}/download" in listing.text
        download = await app.client.get(f"/dashboard/jobs/{job_id}/download")
        assert download.status_code == 200 and download.headers["content-type"].startswith(
            "text/csv"
        )
        assert "attachment" in download.headers["content-disposition"]
        rows = list(csv.reader(io.StringIO(download.text)))
        assert rows[0] == ["id", "Name", "Email Address", "Safe to Send"]
        assert [r[-1] for r in rows[1:]] == ["Yes", "No", "Yes"]
        details = await app.client.get(f"/dashboard/jobs/{job_id}/download?include=details")
        assert details.text.splitlines()[0].endswith(
            "Safe to Send,Status,Sub Status,Reason,Score,Did You Mean"
        )
        assert (await app.client.get("/dashboard")).text.count(f">#{job_id}</a>") == 1

        async with browser(app) as snoop:
            await logged_in(snoop, "snoop@example.com")
            for path in ("", "/progress", "/download"):
                response = await snoop.get(f"/dashboard/jobs/{job_id}{path}")
                assert response.status_code == 404, path
                assert "text/html" in response.headers["content-type"]
                assert "people.csv" not in response.text
            assert f">#{job_id}<" not in (await snoop.get("/dashboard/jobs")).text
        assert (await app.client.get("/dashboard/jobs/999999")).status_code == 404


@pytest.mark.usefixtures("prefect_harness")
async def test_download_before_completion_is_409(settings):
    async with running_app(settings) as app:
        make_user(app, "slow@example.com")
        await logged_in(app.client, "slow@example.com")
        slow = "email\n" + "".join(f"sam{i}@slow.test\n" for i in range(3))
        job_id = job_id_of(await upload(app.client, slow))
        early = await app.client.get(f"/dashboard/jobs/{job_id}/download")
        assert early.status_code == 409 and "download it once" in early.text
        page = await app.client.get(f"/dashboard/jobs/{job_id}")
        assert "data-progress-url" in page.text and 'http-equiv="refresh"' in page.text
        assert (await wait_finished(app.client, job_id))["status"] == "completed"


PICK = "who,where\nalice@acme.test,x\nbob@acme.test,y\nn/a,z\nn/a,z\nn/a,z\n"


@pytest.mark.usefixtures("prefect_harness")
async def test_column_picker_when_no_email_column_is_found(settings):
    async with running_app(settings) as app:
        user = make_user(app, "pick@example.com")
        make_user(app, "thief@example.com")
        await logged_in(app.client, "pick@example.com")
        asked = await upload(app.client, PICK, "odd.csv")
        assert asked.status_code == 200
        assert "Which column holds the addresses?" in asked.text and "odd.csv" in asked.text
        options = re.findall(r'<option value="([^"]*)">([^<]*)<', asked.text)
        assert options == [("#1", "who"), ("#2", "where")]  # by position: names may repeat
        assert "alice@acme.test" in asked.text  # preview rows
        pending = re.search(r'name="upload" value="([^"]+)"', asked.text).group(1)
        csrf = csrf_of(asked.text)
        assert balance(app.store.engine, user.id).total == 100  # nothing reserved yet

        async with browser(app) as thief:
            await logged_in(thief, "thief@example.com")
            their_csrf = csrf_of((await thief.get("/dashboard/upload")).text)
            stolen = await thief.post(
                "/dashboard/upload/column",
                data={"csrf_token": their_csrf, "upload": pending, "email_column": "who"},
            )
            assert stolen.status_code == 410
        forged = await app.client.post(
            "/dashboard/upload/column",
            data={"csrf_token": csrf, "upload": pending[:-3] + "abc", "email_column": "who"},
        )
        assert forged.status_code == 410
        wrong = await app.client.post(
            "/dashboard/upload/column",
            data={"csrf_token": csrf, "upload": pending, "email_column": "nope"},
        )
        assert wrong.status_code == 422 and "&#39;nope&#39; is not a column" in wrong.text

        chosen = await app.client.post(
            "/dashboard/upload/column",
            data={"csrf_token": csrf, "upload": pending, "email_column": "#1"},
        )
        job_id = job_id_of(chosen)
        assert balance(app.store.engine, user.id).total == 95
        done = await wait_finished(app.client, job_id)
        assert done["status"] == "completed" and done["valid_count"] == 2
        again = await app.client.post(
            "/dashboard/upload/column",
            data={"csrf_token": csrf, "upload": pending, "email_column": "who"},
        )
        assert again.status_code == 410
        assert not any((Path(settings.data_dir) / "uploads" / "pending").iterdir())


@pytest.mark.usefixtures("prefect_harness")
async def test_the_picker_chooses_by_position_and_once(settings):
    """Two columns named alike (one of them blank-named too): the picker's choice is the
    column at that position, and a second submit of the same choice (a double click) is
    told the upload is taken — one job, one reservation, no error page."""
    twice = (
        "info,info, \nx1,alice@acme.test,a\nx2,bob@acme.test,b\nx3,nobody@acme.test,c\n"
        + "x,n/a,z\n" * 4  # too few addresses for the column to be found by its content
    )
    async with running_app(settings) as app:
        user = make_user(app, "twice@example.com")
        await logged_in(app.client, "twice@example.com")
        asked = await upload(app.client, twice, "twice.csv")
        options = re.findall(r'<option value="([^"]*)">([^<]*)<', asked.text)
        assert options == [("#1", "info"), ("#2", "info"), ("#3", "(blank header 3)")]
        pending = re.search(r'name="upload" value="([^"]+)"', asked.text).group(1)
        form = {"csrf_token": csrf_of(asked.text), "upload": pending, "email_column": "#2"}
        first, second = await asyncio.gather(
            app.client.post("/dashboard/upload/column", data=form),
            app.client.post("/dashboard/upload/column", data=form),
        )
        assert sorted([first.status_code, second.status_code]) == [303, 410]
        started = first if first.status_code == 303 else second
        done = await wait_finished(app.client, job_id_of(started))
        assert (done["status"], done["valid_count"], done["invalid_count"]) == ("completed", 2, 5)
        assert balance(app.store.engine, user.id).total == 93


async def test_one_upload_waits_per_account_and_a_wide_one_lists_its_first_columns(settings):
    """Each upload whose column was not found kept its whole file for an hour, however many
    one account posted (a way to fill the disk); and a file millions of columns wide made a
    page of every column. Now a new waiting upload replaces the account's earlier one, and
    the picker lists the first PICKER_MAX_COLUMNS columns and says how many there are."""
    wide_columns = PICKER_MAX_COLUMNS + 50
    wide = ",".join(f"c{i}" for i in range(wide_columns)) + "\n"
    wide += "".join(",".join(f"v{r}.{i}" for i in range(wide_columns)) + "\n" for r in range(3))
    pending_root = Path(settings.data_dir) / "uploads" / "pending"
    async with running_app(settings) as app:
        make_user(app, "many@example.com")
        other = make_user(app, "other@example.com")
        await logged_in(app.client, "many@example.com")
        async with browser(app) as them:
            await logged_in(them, "other@example.com")
            theirs = await upload(them, PICK, "theirs.csv")
            assert theirs.status_code == 200
        tokens = []
        for n in range(3):
            asked = await upload(app.client, PICK, f"odd{n}.csv")
            assert asked.status_code == 200
            tokens.append(re.search(r'name="upload" value="([^"]+)"', asked.text).group(1))
        waiting = sorted(p.name for p in pending_root.iterdir())
        assert len(waiting) == 2  # the last of the three, and the other account's
        assert sum(name.startswith(f"a{other.id}x") for name in waiting) == 1
        csrf = csrf_of((await app.client.get("/dashboard/upload")).text)
        old = await app.client.post(
            "/dashboard/upload/column",
            data={"csrf_token": csrf, "upload": tokens[0], "email_column": "#1"},
        )
        assert old.status_code == 410 and "upload the file again" in old.text

        shown = await upload(app.client, wide, "wide.csv")
        assert shown.status_code == 200
        options = re.findall(r'<option value="([^"]*)">', shown.text)
        assert options == [f"#{i + 1}" for i in range(PICKER_MAX_COLUMNS)]
        assert f"The file has {wide_columns} columns" in shown.text
        assert f"v0.{PICKER_MAX_COLUMNS - 1}<" in shown.text
        assert f"v0.{PICKER_MAX_COLUMNS}<" not in shown.text
        assert len(list(pending_root.iterdir())) == 2


async def test_odd_page_numbers_and_key_names_are_answered(settings):
    """A page number no query can take is an empty page, not an error; a key name over
    the limit is refused however long it is (it never becomes a key named "default")."""
    async with running_app(settings) as app:
        user = make_user(app, "pages@example.com")
        await logged_in(app.client, "pages@example.com")
        for page in ("/dashboard/jobs", "/dashboard/credits"):
            assert (await app.client.get(f"{page}?page=999999999999999999")).status_code == 200
        keys_page = await app.client.get("/dashboard/keys")
        for name in ("k" * 101, "k" * 5000):
            response = await app.client.post(
                "/dashboard/keys", data={"csrf_token": csrf_of(keys_page.text), "name": name}
            )
            assert response.status_code == 422, (len(name), response.status_code)
        assert acc.list_keys(app.store.engine, user.id) == []


@pytest.mark.usefixtures("prefect_harness")
async def test_upload_refusals_store_and_charge_nothing(settings):
    async with running_app(settings) as app:
        user = make_user(app, "poor@example.com", credits=2)
        await logged_in(app.client, "poor@example.com")
        short = await upload(app.client, "email\na@acme.test\nb@acme.test\nc@acme.test\n")
        assert short.status_code == 402 and "needs 3" in short.text
        big = await upload(app.client, "email\n" + "x@acme.test\n" * 3000)
        assert big.status_code == 413 and "larger than the limit" in big.text
        for content, why in [
            ("", "empty"),
            ("email\n", "no data rows"),
        ]:
            response = await upload(app.client, content)
            assert response.status_code == 422 and why in response.text, response.text
        csrf = await token(app.client, "/dashboard/upload")
        # What a browser sends when no file was chosen: a file part with an empty name.
        body = (
            f'--b\r\nContent-Disposition: form-data; name="csrf_token"\r\n\r\n{csrf}\r\n'
            '--b\r\nContent-Disposition: form-data; name="file"; filename=""\r\n'
            "Content-Type: application/octet-stream\r\n\r\n\r\n--b--\r\n"
        )
        no_file = await app.client.post(
            "/dashboard/upload",
            content=body.encode(),
            headers={"Content-Type": "multipart/form-data; boundary=b"},
        )
        assert no_file.status_code == 422 and "Choose a CSV file" in no_file.text
        not_multipart = await app.client.post("/dashboard/upload", data={"csrf_token": csrf})
        assert not_multipart.status_code == 422 and "multipart/form-data" in not_multipart.text
        assert balance(app.store.engine, user.id).total == 2
        assert list_jobs(app.store.engine, user.id) == []
        assert not any((Path(settings.data_dir) / "uploads").rglob("*.csv"))


# --- operators' CLI ------------------------------------------------------------------------


async def test_set_password_command_lets_a_cli_account_log_in(settings, monkeypatch):
    import typer

    from verimail.cli.passwords import set_password_command
    from verimail.config import get_settings

    async with running_app(settings) as app:
        admin = acc.create_account(
            app.store.engine, settings, email="ops@example.com", is_admin=True
        )
        nameless = acc.create_account(app.store.engine, settings)
        monkeypatch.setenv("VERIMAIL_DATA_DIR", str(settings.data_dir))
        monkeypatch.setenv("VERIMAIL_DATABASE_URL", str(settings.database_url))
        get_settings.cache_clear()
        try:
            cli = typer.Typer()
            cli.command()(set_password_command)
            runner = CliRunner()
            ok = await asyncio.to_thread(
                runner.invoke, cli, ["--id", str(admin.id)], input=f"{PASSWORD}\n{PASSWORD}\n"
            )
            assert ok.exit_code == 0, ok.output
            short = await asyncio.to_thread(
                runner.invoke, cli, ["--id", str(admin.id), "--password", "short"]
            )
            assert short.exit_code == 1
            no_email = await asyncio.to_thread(
                runner.invoke, cli, ["--id", str(nameless.id), "--password", PASSWORD]
            )
            assert no_email.exit_code == 1
            # No such account: said before any password is asked for (it asked twice first).
            missing = await asyncio.to_thread(runner.invoke, cli, ["--id", "999"], input="")
            assert missing.exit_code == 1 and "no account 999" in folded(missing.output)
            assert "password" not in missing.output.lower(), missing.output
        finally:
            get_settings.cache_clear()
        await logged_in(app.client, "ops@example.com")
        assert (await app.client.get("/dashboard/admin/accounts")).status_code == 200


@pytest.mark.usefixtures("prefect_harness")
def test_serve_believes_forwarded_headers_only_from_named_proxies(testbed_factory, tmp_path):
    """`verimail serve --forwarded-allow-ips 127.0.0.1` behind a TLS-terminating proxy: a
    request the proxy marks X-Forwarded-Proto: https gets a Secure session cookie. Without
    the option the header is ignored (any client could send it)."""
    from prefect.settings import PREFECT_API_URL

    tb = testbed_factory(api_world())
    env = {
        **env_for_testbed(tb),
        "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
        "VERIMAIL_PREFECT_WARM_UP": "false",
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
    }

    def cookie_flags(base_url: str, headers: dict[str, str]) -> list[str]:
        response = httpx.get(f"{base_url}/dashboard/login", headers=headers)
        return [p.strip().lower() for p in response.headers["set-cookie"].split(";")]

    https = {"X-Forwarded-Proto": "https"}
    with serve_processes(1, env, tmp_path, args=["--forwarded-allow-ips", "127.0.0.1"]) as (
        proxied,
    ):
        assert "secure" in cookie_flags(proxied.base_url, https)
        assert "secure" not in cookie_flags(proxied.base_url, {})
    with serve_processes(1, env, tmp_path) as (direct,):
        assert "secure" not in cookie_flags(direct.base_url, https)


@pytest.mark.usefixtures("prefect_harness")
async def test_a_finder_job_shows_as_one_and_downloads(settings):
    """A finder job on the dashboard: its own counts (found, not found, …) under its fj_ id,
    its rows in the progress line, and its results CSV to download — not bulk labels over
    the counters it reuses, nor 'no downloadable results'."""
    people = "first_name,last_name,domain\nAlice,X,acme.test\nNobody,Here,acme.test\nX,,acme.test\n"
    async with running_app(settings) as app:
        user = make_user(app, "finder@example.com", credits=100)
        acc.set_finder(app.store.engine, user.id, True)
        raw_key, _ = acc.create_api_key(app.store.engine, user.id, "k")
        created = await app.client.post(
            "/api/find-email/csv",
            headers={"Authorization": f"Bearer {raw_key}"},
            files={"file": ("people.csv", people.encode(), "text/csv")},
        )
        assert created.status_code == 200, created.text
        public = created.json()["job_id"]
        await logged_in(app.client, "finder@example.com")
        (job,) = list_jobs(app.store.engine, user.id)
        done = await wait_finished(app.client, job.id)
        assert done["job_id"] == public and done["processed_emails"] == 3
        assert (done["found_count"], done["not_found_count"], done["invalid_input_count"]) == (
            1,
            1,
            1,
        )
        page = (await app.client.get(f"/dashboard/jobs/{job.id}")).text
        assert public in page and "Found" in page and "rows looked up" in page
        assert "Valid" not in page and "no downloadable results" not in page
        download = await app.client.get(f"/dashboard/jobs/{job.id}/download")
        assert download.status_code == 200
        rows = list(csv.reader(io.StringIO(download.text)))
        assert rows[0][-3:] == ["email", "status", "confidence"]
        assert rows[1][3:5] == ["alice@acme.test", "found"]
        listing = (await app.client.get("/dashboard/jobs")).text
        assert "found <span" in listing


async def test_a_database_blip_after_a_charged_check_still_shows_its_result(settings, monkeypatch):
    """The balance under the result was read after the charge was final: when that read
    failed, the page said "nothing was charged" while the credit stayed spent and the
    result was lost. Now the result is shown, without the balance."""
    async with running_app(settings) as app:
        user = make_user(app, "blip@example.com", credits=5)
        await logged_in(app.client, "blip@example.com")
        csrf = csrf_of((await app.client.get("/dashboard/verify")).text)

        def database_gone(*args: object) -> None:
            raise OperationalError("SELECT", {}, Exception("server closed the connection"))

        monkeypatch.setattr(verify_pages, "balance", database_gone)
        shown = await app.client.post(
            "/dashboard/verify", data={"csrf_token": csrf, "email": "alice@acme.test"}
        )
        monkeypatch.undo()
        assert shown.status_code == 200, shown.text
        assert "nothing was charged" not in shown.text and "alice@acme.test" in shown.text
        assert "credits left" not in shown.text
        assert balance(app.store.engine, user.id).total == 4
