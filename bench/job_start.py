"""How soon a small job starts and ends (issue 33.2): submit → ``processing`` and submit →
``completed`` of 10-row CSV (``POST /api/bulk``) and JSON (``POST /api/verify/bulk``) jobs,
through the real API (``verimail serve``, uvicorn, SQLite store) against a testbed process.

- ``local``: the local runner, its Prefect embedded server warmed at start-up as in
  production; a first job (not counted) warms the runner too, then ``--jobs`` jobs of each
  kind one after another.
- ``deployment``: the same API with ``runner=deployment``, a Prefect server of its own, and
  one ``prefect worker`` (``--limit 1``, polling every ``--poll`` s: the recipe of
  ``runners/testing.py``); a first job warms it, then ``--jobs`` of each kind.
- ``--worker warm`` (or ``both``): the deployment mode with ``verimail worker`` (the warm
  worker, ``runners/warm_worker.py``: ``--limit 1``, polling every ``--poll`` s) in the
  place of Prefect's process worker; ``both`` measures the two one after the other, each on
  a Prefect server of its own.

The times are the first API poll (every 20 ms) that shows the change, so each is late by up
to 20 ms plus one request.

``python -m bench.job_start [--mode local|deployment|both] [--worker process|warm|both]
[--jobs 5] [--poll 10] [--rows 10]``; ``--rows`` sizes every job (issue 43: a 3,000-row job
on the documented worker, ``--worker warm --poll 2``, beside the local runner's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.api import QUIET, VERIMAIL, _account, _env, _wait_healthy
from bench.common import Table, add_output_args, command_text, publish
from bench.world import RemoteTestbed
from verimail.runners.testing import free_port

ROWS = 10
WORLD_YAML = """\
hosts:
  mx.fast.test:
    mailboxes: [user0, user2, user4, user6, user8]
domains:
  fast.test:
    mx: [[10, mx.fast.test]]
"""
KINDS = (
    ("first", "first JSON job, as soon as the API answers"),
    ("csv", "CSV upload"),
    ("json", "JSON list"),
)
POLL = 0.02  # seconds between the bench's polls of the job
WORKER_MODES = {"process": "deployment", "warm": "deployment, warm worker"}


def _emails(n: int) -> list[str]:
    return [f"user{i}@fast.test" for i in range(n)]


def _submit(client: httpx.Client, kind: str) -> str:
    """Submit a 10-row job of ``kind`` (``csv`` or ``json``); its status URL (ending in
    its id)."""
    if kind == "csv":
        upload = "email\n" + "\n".join(_emails(ROWS)) + "\n"
        files = {"file": ("list.csv", io.BytesIO(upload.encode()), "text/csv")}
        created = client.post("/api/bulk", files=files)
        created.raise_for_status()
        return f"/api/bulk/{created.json()['job_id']}"
    created = client.post("/api/verify/bulk", json={"emails": _emails(ROWS)})
    created.raise_for_status()
    return f"/api/verify/bulk/{created.json()['job_id']}"


def _time_job(client: httpx.Client, kind: str, limit: float = 300.0) -> dict[str, Any]:
    """Submit one job and poll it to the end: seconds to ``processing`` and ``completed``
    (from just before the submitting request)."""
    started = time.perf_counter()
    url = _submit(client, kind)
    submitted = time.perf_counter() - started
    processing: float | None = None
    while True:
        body = client.get(url).json()
        now = time.perf_counter() - started
        if body["status"] != "pending" and processing is None:
            processing = now
        if body["status"] in ("completed", "failed"):
            return {
                "job_id": int(url.rsplit("/", 1)[1]),
                "kind": kind,
                "submit_request": submitted,
                "processing": processing,
                "completed": now,
                "status": body["status"],
            }
        if now > limit:
            raise RuntimeError(f"job {url} still {body['status']} after {limit:.0f} s")
        time.sleep(POLL)


@contextlib.contextmanager
def _serve(env: dict[str, str], cwd: Path) -> Iterator[str]:
    """``verimail serve`` on a free port until the block ends; its base URL."""
    port = free_port()
    log_path = cwd / "serve.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [VERIMAIL, "serve", "--host", "127.0.0.1", "--port", str(port), *QUIET],
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(server, base, log_path, timeout=180)
            yield base
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _measure(base: str, key: str, jobs: int) -> list[dict[str, Any]]:
    """A first JSON job as soon as the API answers (kind ``first``: a row of its own), then
    ``jobs`` CSV and ``jobs`` JSON jobs, alternating."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        first = {**_time_job(client, "json"), "kind": "first"}
        return [first, *(_time_job(client, kind) for _ in range(jobs) for kind in ("csv", "json"))]


def _local(tb: RemoteTestbed, work: Path, jobs: int) -> list[dict[str, Any]]:
    env = _env(tb, work / "data")
    env.update(
        {
            "VERIMAIL_PREFECT_WARM_UP": "true",  # (as in production)
            "PREFECT_HOME": str(work / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }
    )
    env.pop("PREFECT_API_URL", None)  # (the embedded server, as `verimail serve` alone)
    key = _account(env, work, credits=1_000_000)
    with _serve(env, work) as base:
        return _measure(base, key, jobs)


def _deployment(
    tb: RemoteTestbed, work: Path, jobs: int, poll: float, worker_kind: str = "process"
) -> list[dict[str, Any]]:
    from verimail.runners.deploy import register_deployments
    from verimail.runners.testing import prefect_server, prefect_worker, warm_worker, worker_env

    pool = f"verimail-bench-start-{os.getpid()}"
    data = work / "data"
    url = f"sqlite:///{data / 'verimail.db'}"
    with prefect_server():
        from prefect.settings import PREFECT_API_URL

        register_deployments(pool, schedule=False)
        env = _env(tb, data)
        env.update(
            {
                "VERIMAIL_RUNNER": "deployment",
                "VERIMAIL_PREFECT_WORK_POOL": pool,
                "VERIMAIL_DATABASE_URL": url,
                "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            }
        )
        key = _account(env, work, credits=1_000_000)
        testbed_env = {
            k: v for k, v in env.items() if k.startswith("VERIMAIL_") and "DATABASE" not in k
        }
        worker = worker_env(
            testbed_env,
            database_url=url,
            data_dir=data,
            PREFECT_WORKER_QUERY_SECONDS=f"{poll:g}",
        )
        if worker_kind == "warm":
            started = warm_worker(pool, worker, work / "worker.log", limit=1, poll=poll)
        else:
            started = prefect_worker(pool, worker, work / "worker.log", limit=1)
        with started, _serve(env, work) as base:
            runs = _measure(base, key, jobs)
        for run in runs:
            run.update(asyncio.run(_prefect_split(run["job_id"])))
        return runs


async def _prefect_split(job_id: int) -> dict[str, Any]:
    """Where a deployment run's start went, from Prefect's state history of the job's flow
    run: created (``run_deployment`` in the API's request) → Pending (a worker polled and
    took it) → Running (its flow-run process started and began the flow)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentTaskRunId

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=True)
            ),
            limit=200,
        )
        run = next(r for r in runs if r.parameters.get("job_id") == job_id)
        states = await client.read_flow_run_states(run.id)
    at = {}
    for state in sorted(states, key=lambda s: s.timestamp):
        at.setdefault(state.type.value, state.timestamp)
    created = run.created
    if created is None or "PENDING" not in at or "RUNNING" not in at:
        return {}
    return {
        "to_pickup": (at["PENDING"] - created).total_seconds(),
        "process_start": (at["RUNNING"] - at["PENDING"]).total_seconds(),
    }


def _median(runs: list[dict[str, Any]], kind: str) -> float:
    return statistics.median(r["completed"] for r in runs if r["kind"] == kind)


def _cells(runs: list[dict[str, Any]], kind: str, key: str) -> str:
    values = [r[key] for r in runs if r["kind"] == kind and r.get(key) is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    global ROWS  # (--rows: every job of the run is this size; the tables say so)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["local", "deployment", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=5, help="measured jobs of each kind")
    parser.add_argument(
        "--worker",
        choices=["process", "warm", "both"],
        default="process",
        help="deployment mode's worker: Prefect's process worker, verimail's warm worker, both",
    )
    parser.add_argument(
        "--poll", type=float, default=10.0, help="the worker's poll interval (deployment)"
    )
    parser.add_argument("--rows", type=int, default=ROWS, help="addresses of every job")
    add_output_args(parser)
    args = parser.parse_args(argv)
    ROWS = args.rows
    workers = ["process", "warm"] if args.worker == "both" else [args.worker]
    deployment = [WORKER_MODES[w] for w in workers]
    modes = {"local": ["local"], "deployment": deployment}.get(args.mode, ["local", *deployment])
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="verimail-bench-start-") as tmp:
        root = Path(tmp)
        world = root / "world.yaml"
        world.write_text(WORLD_YAML, encoding="utf-8")
        with RemoteTestbed(world_yaml=str(world)) as tb:
            for mode in modes:
                work = root / mode
                work.mkdir()
                if mode == "local":
                    results[mode] = _local(tb, work, args.jobs)
                else:
                    kind = "warm" if mode == WORKER_MODES["warm"] else "process"
                    results[mode] = _deployment(tb, work, args.jobs, args.poll, kind)
    table = Table(
        f"Submit → processing and submit → completed of a {ROWS}-row job, s (median / worst "
        f"of {args.jobs})",
        ["runner", "job", "submit → processing", "submit → completed", "target (processing)"],
    )
    for mode, runs in results.items():
        target = "< 1 s" if mode == "local" else f"< {args.poll + 1:g} s (poll {args.poll:g} s + 1)"
        for kind, label in KINDS:
            table.add(
                mode,
                label,
                _cells(runs, kind, "processing"),
                _cells(runs, kind, "completed"),
                target,
            )
    split = Table(
        "Deployment mode: where a run's start went, s (median / worst), from Prefect's states",
        ["worker", "job", "submit request (run_deployment)", "created → Pending (worker's poll)",
         "Pending → Running (flow-run process or thread start)", "submit → processing"],
    )  # fmt: skip
    for mode in (m for m in modes if m != "local"):
        runs = results[mode]
        for kind, label in KINDS:
            split.add(
                mode,
                label,
                _cells(runs, kind, "submit_request"),
                _cells(runs, kind, "to_pickup"),
                _cells(runs, kind, "process_start"),
                _cells(runs, kind, "processing"),
            )
    reading = [
        f"`verimail serve` (uvicorn, SQLite store) against a testbed process with one fast "
        f"mail host; each job {ROWS} addresses, of which user0, user2, …, user8 are real "
        "mailboxes. Times from just "
        f"before the submitting request; the job polled every {POLL * 1000:g} ms. The "
        "first job is submitted as soon as `GET /api/health` answers (the local runner's "
        "Prefect server is still starting then: it is warmed at the API's start-up, in the "
        f"background); the CSV and JSON rows are the {args.jobs} jobs of each kind after it, "
        "one at a time.",
    ]
    local = results.get("local")
    for mode in (m for m in results if m != "local" and local):
        for kind, label in KINDS[1:]:
            ratio = _median(results[mode], kind) / _median(local, kind)  # type: ignore[arg-type]
            reading.append(
                f"{mode}, {label}: submit → completed {ratio:.2f}x the local runner's "
                "(target ≤ 1.3x, issue 43)."
            )
    publish(
        args,
        title=f"Job start: a {ROWS}-row job, submit to processing and to completed",
        command=command_text("bench.job_start", argv),
        tables=[table, split] if set(results) - {"local"} else [table],
        reading=reading,
        extra={"results": results},
    )
    return {"results": results, "tables": [table]}


if __name__ == "__main__":
    main()
