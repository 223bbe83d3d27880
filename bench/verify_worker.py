"""One measured verification run in a fresh process (cold caches, its own peak RSS).

``python -m bench.verify_worker --side engine|engine-stream|flow --addresses FILE
--nameserver IP:PORT --smtp-port N --data-dir DIR --statuses FILE`` verifies the addresses of
FILE (one a line)

- ``engine``: ``Engine(settings).verify_many(addresses)``, the call the API and CLI make;
- ``engine-stream``: ``Engine(settings).stream(...)`` fed line by line from FILE, each result
  written out as it comes (``[address, status]`` JSON lines), as a job writing to disk would;
- ``flow``: a bulk job (upload CSV + job row, as the API creates them) run by the
  ``bulk-verify`` flow through ``LocalRunner`` on a Prefect test server (the server's
  start-up is timed apart: the API warms it at start-up, so no job waits for it).

and prints one ``BENCH-RESULT`` JSON line: wall time (verification only), phases, the
engine's counters, process CPU and peak RSS. Each address's status goes to ``--statuses``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import current_rss_mib, emit_result, peak_rss_mib
from verimail.config import Settings


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        data_dir=args.data_dir,
        prefect_warm_up=False,
        dns_nameservers=[args.nameserver],
        smtp_port=args.smtp_port,
        smtp_allow_networks=["127.0.0.0/8"],
        smtp_max_sessions_per_host=5,
        smtp_rcpts_per_session=100,
        smtp_max_rejections_per_session=9,
        signup_credits=args.count + 10,
    )


def _timed(fn: Callable[..., Any], into: dict[str, float], name: str) -> Callable[..., Any]:
    if asyncio.iscoroutinefunction(fn):

        async def async_wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                into[name] = into.get(name, 0.0) + time.perf_counter() - t

        return async_wrapper

    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            into[name] = into.get(name, 0.0) + time.perf_counter() - t

    return wrapper


def run_engine(settings: Settings, addresses: list[str]) -> tuple[dict[str, Any], list[str]]:
    from verimail.engine.core import Engine

    engine = Engine(settings)
    phases: dict[str, float] = {}
    # Instance attributes shadow the methods verify_many calls: timing without changing it.
    engine.prepare = _timed(engine.prepare, phases, "prepare_s")  # type: ignore[method-assign]
    engine.verdict = _timed(engine.verdict, phases, "verdicts_s")  # type: ignore[method-assign]
    started = time.perf_counter()
    batch = asyncio.run(engine.verify_many(addresses))
    wall = time.perf_counter() - started
    phases["smtp_s"] = wall - phases.get("prepare_s", 0.0) - phases.get("verdicts_s", 0.0)
    statuses = [r.status.value for r in batch.results]
    return {"wall_s": wall, "phases": phases, "engine": batch.stats.as_dict()}, statuses


def run_engine_stream(settings: Settings, source: Path, out: Path) -> dict[str, Any]:
    from verimail.engine.core import Engine, EngineStats

    engine = Engine(settings)
    phases: dict[str, float] = {}
    engine.prepare = _timed(engine.prepare, phases, "prepare_s")  # type: ignore[method-assign]
    engine.verdict = _timed(engine.verdict, phases, "verdicts_s")  # type: ignore[method-assign]
    stats = EngineStats()

    async def run() -> None:
        with source.open(encoding="utf-8") as given, out.open("w", encoding="utf-8") as sink:
            addresses = (line.strip() for line in given if line.strip())
            async for raw, result in engine.stream(addresses, stats=stats):
                sink.write(json.dumps([raw, result.status.value]) + "\n")

    started = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - started
    phases["smtp_s"] = wall - phases.get("prepare_s", 0.0) - phases.get("verdicts_s", 0.0)
    return {"wall_s": wall, "phases": phases, "engine": stats.as_dict()}


def run_flow(settings: Settings, addresses: list[str]) -> tuple[dict[str, Any], list[str]]:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    import polars as pl

    from verimail.jobs.context import store_for
    from verimail.jobs.create import create_verify_job
    from verimail.runners.local import LocalRunner
    from verimail.runners.testing import prefect_server
    from verimail.store import accounts
    from verimail.store import jobs as job_store

    harness_started = time.perf_counter()
    # A server already named by PREFECT_API_URL (the test suite's own) is used as it is.
    server = contextlib.nullcontext() if os.environ.get("PREFECT_API_URL") else prefect_server()
    with server:
        harness_s = time.perf_counter() - harness_started
        store = store_for(settings)
        account = accounts.create_account(store.engine, settings, plan="enterprise")
        upload = Path(settings.data_dir) / "upload.csv"
        upload.write_text("email\n" + "\n".join(addresses) + "\n", encoding="utf-8")
        n = len(addresses)
        job = create_verify_job(store, account.id, n, upload=upload)
        runner = LocalRunner(settings)
        started = time.perf_counter()
        runner.submit("bulk", job.id)
        runner.wait()
        wall = time.perf_counter() - started
        runner.shutdown()
        done = job_store.get_job_any(store.engine, job.id)
        assert done is not None
        if done.status != "completed":
            raise RuntimeError(f"job {job.id} ended {done.status}: {done.failed_reason}")
        results = Path(done.result_path).parent / "results.parquet"
        frame = pl.read_parquet(results, columns=["row", "status"]).sort("row")
        statuses = frame.get_column("status").to_list()
    return {"wall_s": wall, "phases": {"prefect_server_start_s": harness_s}}, statuses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["engine", "engine-stream", "flow"], required=True)
    parser.add_argument("--addresses", type=Path, required=True)
    parser.add_argument("--nameserver", required=True)
    parser.add_argument("--smtp-port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--statuses", type=Path, required=True)
    args = parser.parse_args()
    if args.side == "engine-stream":
        # The input is read as the engine goes, not held as a list: only the engine's own
        # memory grows with the addresses.
        args.count = 0
        settings = _settings(args)
        rss_before = current_rss_mib()
        cpu0 = time.process_time()
        figures = run_engine_stream(settings, args.addresses, args.statuses)
        count = figures["engine"]["addresses"]
    else:
        addresses = args.addresses.read_text(encoding="utf-8").split()
        args.count = count = len(addresses)
        settings = _settings(args)
        rss_before = current_rss_mib()
        cpu0 = time.process_time()
        if args.side == "engine":
            figures, statuses = run_engine(settings, addresses)
        else:
            figures, statuses = run_flow(settings, addresses)
        args.statuses.write_text(json.dumps(statuses), encoding="utf-8")
    figures.update(
        addresses=count,
        cpu_s=time.process_time() - cpu0,
        rss_before_mib=rss_before,
        peak_rss_mib=peak_rss_mib(),
    )
    emit_result(figures)


if __name__ == "__main__":
    main()
