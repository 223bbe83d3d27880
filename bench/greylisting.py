"""Deadlines and greylisting (issue 22): how late a synchronous answer can come, and what
deferred retries do for a job on postgrey-style hosts.

1. Single and batch calls (through the API app, in process) against the testbed's tarpit,
   postgrey, silent, mute-after-EHLO and slow-greeting hosts, for several ``timeout``
   values, with the servers' own timeouts far beyond them: the worst answer time.
2. A JSON bulk job of ``--size`` addresses, ``--grey-share`` of them on postgrey hosts
   (delay ``--grey-delay`` s), on the local runner: with deferred retries (first retry
   ``--grey-delay`` + a sixth of it after the pass) and without (``retry_unknowns=false``). The
   in-run greylist back-off is off, so the comparison is of the deferred retries alone.
3. ``--one-worker`` (alone: parts 1 and 2 are skipped): deployment mode with exactly one
   worker (``prefect worker start --limit 1`` on a fresh pool, the recipe of the deployment
   tests, ``runners/testing.py``). Job A (the same list) parks its greylisted addresses; job B
   (``--second-size`` plain addresses) is submitted during A's wait; the timeline of both,
   from the API's job phases and Prefect's flow-run times, shows whether B completed before
   A's retry pass started.

4. ``--in-pass`` (alone: parts 1 and 2 are skipped): the job of part 2 with deferred
   retries and the in-run back-off at its default (3 retries, 5/10/20 s), once with the old
   behaviour (``job_greylist_retries`` 3: the first pass waits the back-off out before it
   parks) and once with the new default (0: it parks at once) — when the first pass ended
   and the job's total (issue 33.3).

``python -m bench.greylisting [--timeouts 1,2,5] [--size 1000] [--grey-delay 30]``
``python -m bench.greylisting --in-pass [--size 1000] [--grey-delay 60]``
``python -m bench.greylisting --one-worker [--size 1000] [--second-size 100] [--grey-delay 30]
[--database auto|postgres|sqlite]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import unittest
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


PATIENT_SERVERS = {
    "smtp_connect_timeout": 120.0,
    "smtp_command_timeout": 120.0,
    "smtp_greylist_retries": 0,
}
"""The servers' own timeouts far beyond any deadline; the in-run greylist back-off off (so a
job's figures are of the deferred retries alone)."""


def _settings(tb: Testbed, data_dir: Path, **extra: Any) -> Settings:
    values = {"data_dir": data_dir, "prefect_warm_up": False, **PATIENT_SERVERS}
    return Settings(**{**values, **tb.settings_overrides(), **extra})


def _retry_settings(grey_delay: float) -> dict[str, Any]:
    """Deferred retries against postgrey hosts of ``grey_delay``: the first pass after
    ``grey_delay`` + a sixth of it (at least 1 s), two passes at most."""
    return {
        "job_retry_delay": grey_delay + max(1.0, grey_delay / 6),
        "job_retry_passes": 2,
        "job_retry_max_wait": 10 * grey_delay,
    }


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


async def _outcome(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]
) -> dict[str, Any]:
    """A finished job's counts, and its verdicts on the postgrey hosts' addresses."""
    results: list[dict[str, Any]] = []
    while len(results) < body["total_emails"]:
        page = await client.get(
            url, params={"offset": len(results), "limit": 1000}, headers=headers
        )
        results += page.json()["results"]
    grey = [r for r in results if "@grey" in r["email"]]
    return {
        "total": body["total_emails"],
        "valid": body["valid_count"],
        "invalid": body["invalid_count"],
        "unknown": body["unknown_count"],
        "grey_unknown": sum(r["status"] == "unknown" for r in grey),
        "grey_valid": sum(r["status"] == "valid" for r in grey),
        "grey_invalid": sum(r["status"] == "invalid" for r in grey),
        "grey": len(grey),
        "status": body["status"],
    }


async def _job(
    tb: Testbed,
    data_dir: Path,
    emails: list[str],
    grey_delay: float,
    retry: bool,
    **extra: Any,
) -> dict[str, Any]:
    """One job of ``emails`` to its end (``extra``: settings beside the deferred retries')."""
    name = "job-retry" if retry else "job-plain"
    if extra:
        name += "-" + "-".join(f"{k}{v}" for k, v in sorted(extra.items()))
    settings = _settings(tb, data_dir / name, **_retry_settings(grey_delay), **extra)

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
        return {
            "wall": wall,
            "first_pass": first_pass,
            "retry_started": retry_started,
            **await _outcome(client, url, headers, body),
        }

    return await _app_session(settings, work)


# --- 3. one worker in deployment mode ----------------------------------------------------


STORES = {"postgres": "PostgreSQL", "sqlite": "SQLite"}


def _as_env(values: dict[str, Any]) -> dict[str, str]:
    """Settings as the ``VERIMAIL_*`` variables a worker process reads."""
    return {f"VERIMAIL_{name.upper()}": str(value) for name, value in values.items()}


async def _worker_online(pool: str, log: Path, timeout: float = 180.0) -> None:
    """Wait until the pool's worker has said hello to the Prefect server (untimed set-up)."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while not any(
            w.status.value == "ONLINE"
            for w in await client.read_workers_for_work_pool(work_pool_name=pool)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker came online: {log.read_text()[-3000:]}")
            await asyncio.sleep(0.5)


async def _pool_runs(pool: str) -> tuple[list[Any], int]:
    """Every flow run of the work pool (it is this run's own), and its workers."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName

    async with get_client() as client:
        runs = await client.read_flow_runs(
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool]))
        )
        workers = await client.read_workers_for_work_pool(work_pool_name=pool)
    return runs, len(workers)


async def _two_jobs(
    client: httpx.AsyncClient, key: str, first: list[str], second: list[str], limit: float
) -> dict[str, Any]:
    """Job A (``first``); once it is parked, job B (``second``); both to the end. The times
    (s after A was submitted, wall clock so Prefect's can be set beside them) at which each
    change was first seen, polling every 0.1 s."""
    headers = {"Authorization": f"Bearer {key}"}
    t0 = time.time()

    async def submit(emails: list[str]) -> tuple[int, str]:
        created = await client.post("/api/verify/bulk", json={"emails": emails}, headers=headers)
        created.raise_for_status()
        job_id = created.json()["job_id"]
        return int(job_id), f"/api/verify/bulk/{job_id}"

    a_id, a_url = await submit(first)
    seen: dict[str, float] = {"A submitted": 0.0}
    b_id: int | None = None
    b_url: str | None = None
    parked: dict[str, Any] = {}
    done: dict[str, dict[str, Any]] = {}
    while "A" not in done or (b_url is not None and "B" not in done):
        if time.time() - t0 > limit:
            raise RuntimeError(f"the jobs did not finish in {limit:.0f} s: {seen}")
        body = (await client.get(a_url, headers=headers)).json()
        now = time.time() - t0
        if body.get("phase") == "waiting_to_retry" and "A parked" not in seen:
            seen["A parked"] = now
            keys = ("retry_waiting", "valid_count", "invalid_count", "unknown_count")
            parked = {k: body[k] for k in keys}
            b_id, b_url = await submit(second)
            seen["B submitted"] = time.time() - t0
        if body.get("phase") == "retrying":
            seen.setdefault("A retrying", now)
        if body["status"] in ("completed", "failed") and "A" not in done:
            seen["A completed"] = now
            done["A"] = await _outcome(client, a_url, headers, body)
        if b_url is not None and "B" not in done:
            body = (await client.get(b_url, headers=headers)).json()
            if body["status"] in ("completed", "failed"):
                seen["B completed"] = time.time() - t0
                done["B"] = await _outcome(client, b_url, headers, body)
        await asyncio.sleep(0.1)
    return {"t0": t0, "seen": seen, "parked": parked, "ids": {"A": a_id, "B": b_id}, **done}


def _flow_runs(runs: list[Any], ids: dict[str, int | None], t0: float) -> dict[str, Any]:
    """The pool's flow runs by name ("A pass 0", "A pass 1", "B pass 0"): scheduled for,
    started (Running) and ended, in s after A was submitted; and the most that ran at once."""

    def at(moment: Any) -> float | None:
        return None if moment is None else moment.timestamp() - t0

    jobs = {job_id: name for name, job_id in ids.items() if job_id is not None}
    found: dict[str, Any] = {}
    for run in runs:
        name = jobs.get(run.parameters.get("job_id"))
        if name is not None:
            found[f"{name} pass {run.parameters.get('retry_pass', 0)}"] = {
                "scheduled": at(run.expected_start_time),
                "started": at(run.start_time),
                "ended": at(run.end_time),
                "state": run.state.type.value if run.state else None,
            }
    spans = sorted((r["started"], r["ended"]) for r in found.values() if r["started"] is not None)
    at_once = max(
        (sum(1 for s, e in spans if s <= start and (e is None or e > start)) for start, _ in spans),
        default=0,
    )
    return {"runs": found, "at_once": at_once}


async def _one_worker(
    tb: Testbed,
    data_dir: Path,
    first: list[str],
    second: list[str],
    grey_delay: float,
    backend: str,
) -> dict[str, Any]:
    """Jobs A and B through the API in deployment mode, one worker (limit 1) on a fresh pool."""
    from verimail.runners.deploy import register_deployments
    from verimail.runners.testing import prefect_worker, worker_env
    from verimail.store.testing import temporary_database_url

    pool = f"verimail-bench-{os.getpid()}"
    await asyncio.to_thread(register_deployments, pool, schedule=False)
    retry = _retry_settings(grey_delay)
    with temporary_database_url(backend, data_dir) as url:  # type: ignore[arg-type]
        settings = _settings(
            tb, data_dir, database_url=url, runner="deployment", prefect_work_pool=pool, **retry
        )
        env = worker_env(
            tb.environment(),
            database_url=url,
            data_dir=data_dir,
            **_as_env({**PATIENT_SERVERS, **retry}),
        )
        log = data_dir / "worker.log"
        with prefect_worker(pool, env, log, limit=1):
            await _worker_online(pool, log)  # (its start-up is not part of the figures)

            async def work(client: httpx.AsyncClient, key: str, app: Any) -> dict[str, Any]:
                limit = 10 * grey_delay + 600
                return await _two_jobs(client, key, first, second, limit)

            timeline = await _app_session(settings, work)
            runs, workers = await _pool_runs(pool)
    return {
        **timeline,
        **_flow_runs(runs, timeline["ids"], timeline["t0"]),
        "workers": workers,
        "database": backend,
        "retry_delay": retry["job_retry_delay"],
    }


def _one_worker_tables(run: dict[str, Any], grey: int) -> tuple[list[Table], list[str]]:
    seen, runs = run["seen"], run["runs"]

    def t(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"

    def flow(name: str, key: str) -> float | None:
        return runs.get(name, {}).get(key)

    timeline = Table(
        "Timeline, s after job A was submitted",
        ["event", "t (s)", "seen in"],
    )
    rows = [
        ("A submitted", seen.get("A submitted"), "API"),
        ("A's first pass: flow run started", flow("A pass 0", "started"), "Prefect"),
        ("A's first pass: flow run ended", flow("A pass 0", "ended"), "Prefect"),
        ("A parked (phase waiting_to_retry)", seen.get("A parked"), "API"),
        ("B submitted", seen.get("B submitted"), "API"),
        ("B: flow run started", flow("B pass 0", "started"), "Prefect"),
        ("B: flow run ended", flow("B pass 0", "ended"), "Prefect"),
        ("B completed", seen.get("B completed"), "API"),
        ("A's retry pass: scheduled for", flow("A pass 1", "scheduled"), "Prefect"),
        ("A's retry pass: flow run started", flow("A pass 1", "started"), "Prefect"),
        ("A's retry pass: flow run ended", flow("A pass 1", "ended"), "Prefect"),
        ("A completed", seen.get("A completed"), "API"),
    ]
    # In the order they happened (an event that did not happen last).
    for label, value, source in sorted(rows, key=lambda r: (r[1] is None, r[1] or 0.0)):
        timeline.add(label, t(value), source)

    a, b, parked = run.get("A", {}), run.get("B", {}), run["parked"]
    counts = Table(
        "Jobs A and B: counts",
        ["job", "addresses", "valid", "invalid", "unknown", "grey: valid / invalid / unknown"],
    )
    counts.add(
        "A when parked",
        a.get("total", "–"),
        parked.get("valid_count", "–"),
        parked.get("invalid_count", "–"),
        parked.get("unknown_count", "–"),
        f"– / – / {parked.get('retry_waiting', '–')} waiting",
    )
    for label, job in (("A at the end", a), ("B at the end", b)):
        counts.add(
            label,
            job.get("total", "–"),
            job.get("valid", "–"),
            job.get("invalid", "–"),
            job.get("unknown", "–"),
            f"{job.get('grey_valid', '–')} / {job.get('grey_invalid', '–')} / "
            f"{job.get('grey_unknown', '–')}"
            if job.get("grey")
            else "–",
        )

    b_done, a_retry = seen.get("B completed"), flow("A pass 1", "started")
    if b_done is not None and a_retry is not None and b_done < a_retry:
        verdict = (
            f"**B completed {a_retry - b_done:.1f} s before A's retry pass started** "
            f"(t = {b_done:.1f} s against {a_retry:.1f} s)"
        )
    else:
        verdict = (
            f"B did **not** complete before A's retry pass started (B completed at "
            f"{t(b_done)} s, A's retry pass started at {t(a_retry)} s)"
        )
    planned = flow("A pass 1", "scheduled")
    if planned is None or a_retry is None:
        lateness = ""
    else:
        lateness = f" A's retry pass was scheduled for t = {planned:.1f} s and started " + (
            f"{planned - a_retry:.1f} s early (Prefect's server rounds the wait before a "
            "scheduled run to whole seconds, so a run may start up to half a second early)."
            if a_retry < planned
            else f"{a_retry - planned:.1f} s after that."
        )
    reading = [
        f"One `prefect worker` process (`--limit 1`, the only worker of a fresh `process` "
        f"pool: {run['workers']} worker seen in the pool at the end) runs the bulk-verify "
        f"deployment; the API (in this process, runner `deployment`) hands it the jobs; the "
        f"store is {STORES[run['database']]}. Flow-run times are Prefect's (start = Running, end = "
        "Completed); the others are the first API poll (every 0.1 s) that showed the change.",
        f"Job A parked its {parked.get('retry_waiting', '–')} greylisted addresses after its "
        f"first pass; the run that parked it scheduled the retry pass as a Prefect `Scheduled` "
        f"flow run {run['retry_delay']:g} s later, and ended, freeing the worker. "
        f"Job B was submitted during the wait: {verdict}. At most "
        f"{run['at_once']} flow run ran at once in the pool.{lateness}",
        f"A's {grey} greylisted addresses ended {a.get('grey_valid', '–')} valid / "
        f"{a.get('grey_invalid', '–')} invalid / {a.get('grey_unknown', '–')} unknown "
        f"(A's unknown: {parked.get('unknown_count', '–')} when parked, "
        f"{a.get('unknown', '–')} at the end).",
    ]
    return [timeline, counts], reading


def _prefect() -> Any:
    """A temporary Prefect server for the jobs (the suite's own when PREFECT_API_URL names
    one), given time to start on a loaded machine."""
    import contextlib

    from verimail.runners.testing import prefect_server

    if os.environ.get("PREFECT_API_URL"):
        return contextlib.nullcontext()
    return prefect_server()


def _database(choice: str) -> str:
    """``auto``: PostgreSQL when it answers (as workers on several machines would share it),
    else SQLite (one file, shared by the API and the worker on this machine)."""
    if choice != "auto":
        return choice
    from verimail.store.testing import temporary_database_url

    try:
        with tempfile.TemporaryDirectory() as tmp, temporary_database_url("postgres", Path(tmp)):
            return "postgres"
    except unittest.SkipTest:  # (how it says PostgreSQL did not answer)
        return "sqlite"


def _main_one_worker(
    args: argparse.Namespace,
    argv: list[str] | None,
    emails: list[str],
    per_plain: int,
    per_grey: int,
) -> dict[str, Any]:
    """Part 3: job A (``emails``) parks; job B (``--second-size`` plain addresses, a few per
    domain in turn) is submitted during its wait; one worker runs them both."""
    count = min(args.second_size, per_plain * PLAIN_DOMAINS)
    second = [f"user{i // PLAIN_DOMAINS}@plain{i % PLAIN_DOMAINS}.test" for i in range(count)]
    backend = _database(args.database)
    tb = Testbed(_world(args.grey_delay, per_plain, per_grey)).start()
    try:
        with tempfile.TemporaryDirectory() as tmp, _prefect():  # (untimed set-up)
            run = asyncio.run(_one_worker(tb, Path(tmp), emails, second, args.grey_delay, backend))
    finally:
        tb.stop()
    grey = per_grey * GREY_DOMAINS
    tables, reading = _one_worker_tables(run, grey)
    publish(
        args,
        title=(
            f"Greylisting: one worker in deployment mode (job A {len(emails)} addresses, "
            f"{grey} on postgrey hosts with delay {args.grey_delay:g} s; job B "
            f"{len(second)} plain addresses; {STORES[backend]})"
        ),
        command=command_text("bench.greylisting", argv),
        tables=tables,
        reading=reading,
        extra={"one_worker": run},
    )
    return {"one_worker": run}


# --- 4. in-pass greylist retries: the old default against the new (issue 33.3) -------------

IN_PASS = {
    "old: in-pass back-off, then park": {"job_greylist_retries": 3},
    "new: park at once": {"job_greylist_retries": 0},
}
"""Both with the in-run back-off at its default (3 retries, 5/10/20 s), which a job's pass
followed by a deferred pass used before ``job_greylist_retries`` (default 0)."""


def _main_in_pass(
    args: argparse.Namespace,
    argv: list[str] | None,
    emails: list[str],
    per_plain: int,
    per_grey: int,
) -> dict[str, Any]:
    """Part 4: the same job with the old and the new default of in-pass greylist retries."""
    back_off = {"smtp_greylist_retries": 3, "smtp_greylist_delay": 5.0}
    runs: dict[str, dict[str, Any]] = {}
    grey = per_grey * GREY_DOMAINS
    tb = Testbed(_world(args.grey_delay, per_plain, per_grey)).start()
    try:
        with tempfile.TemporaryDirectory() as tmp, _prefect():  # (untimed set-up)
            asyncio.run(_job(tb, Path(tmp) / "warm", emails[:1], args.grey_delay, False))
            for label, setting in IN_PASS.items():
                tb.reset_greylist()
                runs[label] = asyncio.run(
                    _job(tb, Path(tmp), emails, args.grey_delay, True, **back_off, **setting)
                )
    finally:
        tb.stop()
    retry = _retry_settings(args.grey_delay)
    table = Table(
        f"A job of {len(emails)} addresses, {grey} on postgrey hosts (delay "
        f"{args.grey_delay:g} s), deferred retries {retry['job_retry_delay']:g} s after a "
        "pass, local runner",
        ["first pass", "first pass ended (s)", "parked", "retry pass from (s)", "job total (s)",
         "grey: valid / invalid / unknown"],
    )  # fmt: skip
    for label, run in runs.items():
        ended = run["first_pass"] if run["first_pass"] is not None else run["wall"]
        table.add(
            label,
            f"{ended:.1f}",
            "yes" if run["first_pass"] is not None else "no",
            "–" if run["retry_started"] is None else f"{run['retry_started']:.1f}",
            f"{run['wall']:.1f}",
            f"{run['grey_valid']} / {run['grey_invalid']} / {run['grey_unknown']}",
        )
    reading = [
        "Both runs: `VERIMAIL_SMTP_GREYLIST_RETRIES` 3 and `VERIMAIL_SMTP_GREYLIST_DELAY` 5 "
        "(their defaults); old: `VERIMAIL_JOB_GREYLIST_RETRIES=3` (the pass waits 5 + 10 + "
        "20 s for a greylisted recipient before it parks it, as every job pass did before), "
        'new: its default 0. "First pass ended": when the job was seen parked '
        "(`waiting_to_retry`), or its end when the first pass settled everything.",
    ]
    publish(
        args,
        title=f"Greylisting: in-pass retries in a job, old default against new "
        f"({len(emails)} addresses, postgrey delay {args.grey_delay:g} s)",
        command=command_text("bench.greylisting", argv),
        tables=[table],
        reading=reading,
        extra={"in_pass": runs},
    )
    return {"in_pass": runs}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", default="1,2,5")
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--grey-share", type=float, default=0.25)
    parser.add_argument("--grey-delay", type=float, default=30.0)
    parser.add_argument(
        "--one-worker",
        action="store_true",
        help="Part 3 only: jobs A and B on one worker in deployment mode (parts 1-2 skipped).",
    )
    parser.add_argument(
        "--in-pass",
        action="store_true",
        help="Part 4 only: the job with the old and the new default of in-pass greylist "
        "retries (parts 1-2 skipped).",
    )
    parser.add_argument("--second-size", type=int, default=100, help="Job B's addresses.")
    parser.add_argument(
        "--database",
        choices=["auto", "postgres", "sqlite"],
        default="auto",
        help="Part 3's store (auto: PostgreSQL when it answers, else SQLite).",
    )
    add_output_args(parser)
    args = parser.parse_args(argv)
    timeouts = [float(t) for t in args.timeouts.split(",")]
    per_grey = round(args.size * args.grey_share / GREY_DOMAINS)
    per_plain = (args.size - per_grey * GREY_DOMAINS) // PLAIN_DOMAINS
    emails = [f"user{i}@plain{d}.test" for d in range(PLAIN_DOMAINS) for i in range(per_plain)]
    emails += [f"user{i}@grey{d}.test" for d in range(GREY_DOMAINS) for i in range(per_grey)]
    if args.one_worker:
        return _main_one_worker(args, argv, emails, per_plain, per_grey)
    if args.in_pass:
        return _main_in_pass(args, argv, emails, per_plain, per_grey)
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
