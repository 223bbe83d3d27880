"""Issue 44 points 5 and 8 in chromium, as a list owner sees them: a job page opened while
the first pass runs shows the counts by status group once the job waits for a retry pass
(it showed every count 0 beside "34 of 34 verified" and "about 1 s left"), its time as
people read it (not ``2026-12-07T12:53:41.215039Z``), the Jobs list counting by the same
groups (it said "Catch-all 3" where the page said "Catch-all 1 · Likely valid 2"), a
sign-up refusal that says why, the operators' command as docs/cli.md spells it, and the
results preview readable at 390 px."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from api_helpers import env_for_testbed, serve_processes
from test_dashboard_browser import CHROMIUM_ARGS, JOB_TIMEOUT_MS, chromium, submit  # noqa: F401

from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

PASSWORD = "a long enough password"
GROUPS = ("valid", "likely_valid", "catchall", "invalid")  # (the Jobs list's columns)


def _world() -> World:
    hosts = {
        "acme.test": HostBehaviour(mailboxes={"alice"}),
        "catchall.test": HostBehaviour(accept_all=True),
        "grey.test": HostBehaviour(mailboxes={"bob"}, greylist_delay=1.0),
        # (the first pass lasts this long: the page is open, counts at 0, while it runs)
        "late.test": HostBehaviour(mailboxes={"lee"}, greeting_delay=15),
    }
    return World.of(
        [HostSpec(f"mx.{d}", b) for d, b in hosts.items()],
        [DomainSpec(d, mx=[(10, f"mx.{d}")]) for d in hosts],
    )


@pytest.fixture
def server(testbed_factory, tmp_path) -> Iterator[str]:
    from prefect.settings import PREFECT_API_URL

    env = {
        **env_for_testbed(testbed_factory(_world())),
        "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
        "VERIMAIL_PREFECT_WARM_UP": "false",
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "VERIMAIL_SMTP_GREYLIST_RETRIES": "0",
        "VERIMAIL_SMTP_CONNECT_TIMEOUT": "60",
        "VERIMAIL_JOB_RETRY_DELAY": "900",  # (parked for the whole test)
    }
    with serve_processes(1, env, tmp_path) as servers:
        yield servers[0].base_url


def test_live_counts_times_and_the_lists_groups_agree(chromium, server, tmp_path):  # noqa: F811
    context = chromium.new_context(base_url=server, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        _walk(page, tmp_path)
        _phone(context, page.url.rsplit("/dashboard", 1)[0], tmp_path)
    finally:
        context.close()
    # (the refused sign-up answers 422, which chromium logs; nothing else may fail)
    assert [e for e in errors if "status of 422" not in e] == [], errors


def _walk(page: Any, tmp_path: Any) -> None:
    # A reserved domain is refused with the reason, not only "Enter a valid email address."
    page.goto("/dashboard/signup")
    page.fill("input[name=email]", "newbie@example.test")
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=password_confirm]", PASSWORD)
    submit(page, "main form")
    said = page.inner_text("main")
    assert "special-use or reserved name that cannot be used with email" in said, said
    page.fill("input[name=email]", "owner@example.com")
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=password_confirm]", PASSWORD)
    submit(page, "main form")
    # (A sign-up answers as for a taken address: the login form, then the keys page.)
    assert page.input_value("input[name=email]") == "owner@example.com"
    page.fill("input[name=password]", PASSWORD)
    submit(page, "main form")
    assert page.url.endswith("/dashboard/keys?notice=welcome"), page.url

    # The operators' command, spelled as docs/cli.md spells it.
    page.goto("/dashboard/plan")
    assert "verimail accounts set --account" in page.inner_text("main")

    people = tmp_path / "people.csv"
    people.write_text(
        "Email\nalice@acme.test\nnobody@acme.test\nanyone@catchall.test\n"
        "bob@grey.test\nlee@late.test\n"
    )
    page.goto("/dashboard/upload")
    page.set_input_files("input[name=file]", str(people))
    submit(page, "form[action='/dashboard/upload']")
    assert re.search(r"/dashboard/jobs/\d+$", page.url), page.url
    job_url = page.url
    # Opened while the pass runs (late.test greets after 15 s): no count yet on the page.
    assert page.inner_text("dl.facts [data-group=valid]") == "0"
    phase = page.locator("[data-testid=phase]", has_text="Waiting to retry")
    phase.wait_for(timeout=JOB_TIMEOUT_MS)
    live = _groups(page, "dl.facts")
    assert live["valid"] == 2 and live["invalid"] == 1 and live["unknown"] == 1, live
    assert live["catchall"] + live["likely_valid"] == 1, live
    assert page.inner_text(".job-progress .eta") == ""  # (no "about 1 s left")

    page.goto(job_url)  # (after a reload: the server's words)
    assert _groups(page, "dl.facts") == live
    notice = page.inner_text("p.notice[data-field=phase]")
    assert re.search(r"at \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", notice), notice
    assert not re.search(r"\d{2}T\d{2}:", notice), notice

    page.goto("/dashboard/jobs")
    row = _groups(page, "tr[data-job]")
    assert row == {key: live[key] for key in GROUPS}, (row, live)


def _groups(page: Any, scope: str) -> dict[str, int]:
    cells = page.locator(f"{scope} [data-group]")
    return {
        cells.nth(i).get_attribute("data-group"): int(cells.nth(i).inner_text().replace(",", ""))
        for i in range(cells.count())
    }


def _phone(context: Any, server: str, tmp_path: Any) -> None:
    """The results preview at 390 px: each row a block, the reason across the screen
    (six columns made each row a tall, narrow column of words)."""
    page = context.new_page()
    page.set_viewport_size({"width": 390, "height": 844})
    done = tmp_path / "done.csv"
    done.write_text("Email\nalice@acme.test\nnobody@acme.test\n")
    page.goto("/dashboard/upload")
    page.set_input_files("input[name=file]", str(done))
    submit(page, "form[action='/dashboard/upload']")
    page.wait_for_selector("[data-testid=preview-link]", timeout=JOB_TIMEOUT_MS)
    page.click("[data-testid=preview-link]")
    reason = page.locator("table.results tbody tr").first.locator("td.reason")
    box = reason.bounding_box()
    assert box is not None and box["width"] > 300, box
