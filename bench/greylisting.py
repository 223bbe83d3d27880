"""Deadlines and greylisting (issue 22): how late a synchronous answer can come, and what
deferred retries do for a job on postgrey-style hosts.

1. Single and batch calls (through the API app, in process) against the testbed's tarpit,
   postgrey, silent, mute-after-EHLO and slow-greeting hosts, for several ``timeout``
   values, with the servers' own timeouts far beyond them: the worst answer time.
2. A JSON bulk job of ``--size`` addresses, ``--grey-share`` of them on postgrey hosts
   (delay ``--grey-delay`` s), on the local runner: with deferred retries (first retry
   ``--grey-delay`` + a sixth of it after the pass) and without (``retry_unknowns=false``). The
   in-run greylist back-off is off, so the comparison is of the deferred retries alone.

``python -m bench.greylisting [--timeouts 1,2,5] [--size 1000] [--grey-delay 30]``
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Table, add_output_args, command_text, publish
from verimail.api.app import create_app
from verimail.config import Settings
from verimail.store.accounts import create_account, create_api_key
from verimail.store.db import Store, make_engine
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

SLOW_HOSTS = {
    "tarpit": HostBehaviour(mailboxes={"alice"}, tarpit_delay=120),
    "postgrey": HostBehaviour(mailboxes={"alice"}, greylist_delay=300),
    "silent": HostBehaviour(hostile="silent"),
    "mute-after-ehlo": HostBehaviour(hostile="mute_after_ehlo"),
    "slow-greeting": HostBehaviour(mailboxes={"alice"}, reply_delay=120),
}
PLAIN_DOMAINS = 8
GREY_DOMAINS = 2


def _world(grey_delay: float, per_plain: int, per_grey: int) -> World:
    hosts = [HostSpec(f"mx.{name}.test", b) for name, b in SLOW_HOSTS.items()]
    domains = [DomainSpec(f"{name}.test", mx=[(10, f"mx.{name}.test")]) for name in SLOW_HOSTS]
    real = {f"user{i}" for i in range(0, max(per_plain, per_grey), 2)}  # half are real
    for i in range(PLAIN_DOMAINS):
        hosts.append(HostSpec(f"mx.plain{i}.test", HostBehaviour(mailboxes=real)))
        domains.append(DomainSpec(f"plain{i}.test", mx=[(10, f"mx.plain{i}.test")]))
    for i in range(GREY_DOMAINS):
        grey = HostBehaviour(mailboxes=real, greylist_delay=grey_delay)
        hosts.append(HostSpec(f"mx.grey{i}.test", grey))
        domains.append(DomainSpec(f"grey{i}.test", mx=[(10, f"mx.grey{i}.test")]))
    return World.of(hosts=hosts, domains=domains)


def _settings(tb: Testbed, data_dir: Path, **extra: Any) -> Settings:
    return Settings(
        data_dir=data_dir,
        smtp_connect_timeout=120.0,
        smtp_command_timeout=120.0,
        smtp_greylist_retries=0,
        prefect_warm_up=False,
        **tb.settings_overrides(),
        **extra,
    )


async def _call(client: httpx.AsyncClient, key: str, path: str, body: dict) -> float:
    started = time.perf_counter()
    response = await client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed


async def _app_session(settings: Settings, work: Any) -> Any:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        store = Store(engine=make_engine(settings), settings=settings)
        funded = settings.model_copy(update={"signup_credits": 1_000_000})
        account = create_account(store.engine, funded, plan="enterprise")
        key, _ = create_api_key(store.engine, account.id, name="bench")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://b", timeout=600) as c:
            try:
                return await work(c, key, app)
            finally:
                store.close()


async def _deadlines(tb: Testbed, data_dir: Path, timeouts: list[float]) -> Table:
    table = Table(
        "Worst answer time of a synchronous call (s), servers' own timeouts 120 s",
        ["host", *[f"timeout {t:g} s: single / batch" for t in timeouts]],
    )

    async def work(client: httpx.AsyncClient, key: str, app: Any) -> None:
        for name in SLOW_HOSTS:
            cells = []
            for timeout in timeouts:
                tb.reset_greylist()
                single = await _call(
                    client,
                    key,
                    "/api/verify/single",
                    {"email": f"alice@{name}.test", "timeout": timeout},
                )
                emails = [f"user{i}@{name}.test" for i in range(20)] + ["user0@plain0.test"]
                batch = await _call(
                    client, key, "/api/verify/batch", {"emails": emails, "timeout": timeout}
                )
                cells.append(f"{single:.2f} / {batch:.2f}")
                if not tb.wait_until(lambda tb: tb.total_stats().active == 0, timeout=1.0):
                    cells[-1] += " (sessions left open!)"
            table.add(name, *cells)

    await _app_session(_settings(tb, data_dir / "deadlines", job_retry_passes=0), work)
    return table


async def _job(
    tb: Testbed, data_dir: Path, emails: list[str], grey_delay: float, retry: bool
) -> dict[str, Any]:
    settings = _settings(
        tb,
        data_dir / ("job-retry" if retry else "job-plain"),
        job_retry_delay=grey_delay + max(1.0, grey_delay / 6),
        job_retry_passes=2,
        job_retry_max_wait=10 * grey_delay,
    )

    async def work(client: httpx.AsyncClient, key: str, app: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"}
        started = time.perf_counter()
        created = await client.post(
            "/api/verify/bulk", json={"emails": emails, "retry_unknowns": retry}, headers=headers
        )
        created.raise_for_status()
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        first_pass = retry_started = None
        while True:
            body = (await client.get(url, headers=headers)).json()
            now = time.perf_counter() - started
            if body.get("phase") == "waiting_to_retry" and first_pass is None:
                first_pass = now
            if body.get("phase") == "retrying" and retry_started is None:
                retry_started = now
            if body["status"] in ("completed", "failed"):
                break
            await asyncio.sleep(0.1)
        wall = time.perf_counter() - started
        results: list[dict[str, Any]] = []
        while len(results) < body["total_emails"]:
            page = await client.get(
                url, params={"offset": len(results), "limit": 1000}, headers=headers
            )
            results += page.json()["results"]
        grey = [r for r in results if "@grey" in r["email"]]
        return {
            "wall": wall,
            "first_pass": first_pass,
            "retry_started": retry_started,
            "unknown": body["unknown_count"],
            "grey_unknown": sum(r["status"] == "unknown" for r in grey),
            "grey_valid": sum(r["status"] == "valid" for r in grey),
            "grey_invalid": sum(r["status"] == "invalid" for r in grey),
            "grey": len(grey),
            "status": body["status"],
        }

    return await _app_session(settings, work)


def _prefect() -> Any:
    """A temporary Prefect server for the jobs (the suite's own when PREFECT_API_URL names
    one), given time to start on a loaded machine."""
    import contextlib
    import os

    from prefect.testing.utilities import prefect_test_harness

    if os.environ.get("PREFECT_API_URL"):
        return contextlib.nullcontext()
    return prefect_test_harness(server_startup_timeout=180)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", default="1,2,5")
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--grey-share", type=float, default=0.25)
    parser.add_argument("--grey-delay", type=float, default=30.0)
    add_output_args(parser)
    args = parser.parse_args(argv)
    timeouts = [float(t) for t in args.timeouts.split(",")]
    per_grey = round(args.size * args.grey_share / GREY_DOMAINS)
    per_plain = (args.size - per_grey * GREY_DOMAINS) // PLAIN_DOMAINS
    emails = [f"user{i}@plain{d}.test" for d in range(PLAIN_DOMAINS) for i in range(per_plain)]
    emails += [f"user{i}@grey{d}.test" for d in range(GREY_DOMAINS) for i in range(per_grey)]
    tb = Testbed(_world(args.grey_delay, per_plain, per_grey)).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            deadlines = asyncio.run(_deadlines(tb, Path(tmp), timeouts))
            with _prefect():  # (started before the clock: not part of the figures)
                # A process's first flow run pays Prefect's start-up: a one-address job first.
                asyncio.run(_job(tb, Path(tmp) / "warm", emails[:1], args.grey_delay, False))
                tb.reset_greylist()
                with_retry = asyncio.run(_job(tb, Path(tmp), emails, args.grey_delay, True))
                tb.reset_greylist()
                without = asyncio.run(_job(tb, Path(tmp), emails, args.grey_delay, False))
    finally:
        tb.stop()
    jobs = Table(
        f"A job of {len(emails)} addresses, {per_grey * GREY_DOMAINS} on postgrey hosts "
        f"(delay {args.grey_delay:g} s), local runner",
        ["run", "wall (s)", "parked at (s)", "retry pass from (s)", "unknown", "grey: valid / "
         "invalid / unknown"],
    )  # fmt: skip
    for label, run in (("deferred retries", with_retry), ("retry_unknowns=false", without)):
        jobs.add(
            label,
            f"{run['wall']:.1f}",
            "–" if run["first_pass"] is None else f"{run['first_pass']:.1f}",
            "–" if run["retry_started"] is None else f"{run['retry_started']:.1f}",
            run["unknown"],
            f"{run['grey_valid']} / {run['grey_invalid']} / {run['grey_unknown']}",
        )
    reading = [
        "Each cell is one call; a batch holds 20 addresses on the slow host and one on a "
        "plain host. Every answer must come by the deadline (+1 s allowed); the script "
        "checks after each call that the testbed sees no session left open.",
        f"With deferred retries the job parks its {per_grey * GREY_DOMAINS} greylisted "
        "addresses after the first pass (no worker held), starts the retry pass when the "
        "delay is over, and ends with the grey hosts' true verdicts; without, they stay "
        "unknown. Wall time ≈ first pass + retry delay + retry pass.",
    ]
    publish(
        args,
        title=f"Greylisting and deadlines ({len(emails)} addresses)",
        command=command_text("bench.greylisting", argv),
        tables=[deadlines, jobs],
        reading=reading,
        extra={"with_retry": with_retry, "without": without},
    )
    return {"with_retry": with_retry, "without": without}


if __name__ == "__main__":
    main()
