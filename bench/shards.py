"""One job across many workers (issue 37): the same bulk job with 1, 2 and 4 Prefect worker
processes, end to end — upload, shards on the pool, merge, download.

``python -m bench.shards`` runs three parts, each through a real ``verimail serve`` (the
deployment runner), ``prefect worker`` processes (``--limit 1`` each: one flow run at a time),
PostgreSQL, Redis (the session slots fleet-wide) and the testbed in its own process:

1. a CPU-bound world (no reply or DNS delay, many servers): ``--addresses`` (200,000) in
   shards of an eighth of it, with each of ``--workers`` (1,2,4) — wall, speedup;
2. a latency-bound world (20 ms per SMTP reply): ``--latency-addresses`` (20,000), same
   workers — wall against one worker's, and the most sessions any server saw at once
   against the per-server cap;
3. ``--million`` addresses (1,000,000) as one CSV, the default shard size, the most
   workers — wall from upload to downloaded file, peak RSS of each kind of process, disk.

``--skip-million`` leaves part 3 out. Every figure is of this machine (2 cores): the testbed,
the API, Prefect's server, PostgreSQL and the workers share them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from bench.api import VERIMAIL, _account, _env, _wait_healthy
from bench.common import (
    Table,
    add_output_args,
    command_text,
    fmt_float,
    fmt_int,
    publish,
    stop_process,
)
from bench.world import RemoteTestbed, WorldSpec, build_world
from verimail.runners.testing import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"
POLITENESS = {  # production defaults (bench_settings), written out for the processes
    "VERIMAIL_SMTP_MAX_SESSIONS_PER_HOST": "5",
    "VERIMAIL_SMTP_RCPTS_PER_SESSION": "100",
    "VERIMAIL_SMTP_MAX_REJECTIONS_PER_SESSION": "9",
}
EXPECTED_STATUSES = {
    "valid": {"valid"},
    "invalid": {"invalid"},
    "catchall": {"catchall", "likely_valid"},
}


# --- processes and what they use ----------------------------------------------------------


class Sampler:
    """Peak RSS of each process under ``roots`` (and their children: a worker's flow-run
    processes), by kind, and the data dir's size, sampled every 0.25 s while a run goes."""

    def __init__(self, roots: dict[int, str], data_dir: Path) -> None:
        self.roots = roots
        self.data_dir = data_dir
        self.peak_kib: dict[int, tuple[str, int]] = {}
        self.disk_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        from verimail.runners.testing import descendants

        last_disk = 0.0
        while not self._stop.wait(0.25):
            for root, kind in self.roots.items():
                pids = [(root, kind)] + [(p, "flow run") for p in descendants(root)]
                for pid, what in pids:
                    hwm = _status_kib(pid, "VmHWM")
                    if hwm is not None:
                        known = self.peak_kib.get(pid, (what, 0))[1]
                        self.peak_kib[pid] = (what, max(known, hwm))
            if time.monotonic() - last_disk > 2:
                last_disk = time.monotonic()
                self.disk_peak = max(self.disk_peak, disk_bytes(self.data_dir))

    def peaks_mib(self) -> dict[str, float]:
        """The highest peak RSS of each kind of process (MiB)."""
        by_kind: dict[str, float] = {}
        for kind, kib in self.peak_kib.values():
            by_kind[kind] = max(by_kind.get(kind, 0.0), kib / 1024)
        return by_kind


def _status_kib(pid: int, field: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def disk_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


@contextlib.contextmanager
def _workers(pool: str, env: dict[str, str], work: Path, n: int) -> Iterator[list[int]]:
    from verimail.runners.testing import prefect_worker

    with contextlib.ExitStack() as stack:
        pids = [
            stack.enter_context(prefect_worker(pool, env, work / f"worker-{i}.log", limit=1)).pid
            for i in range(n)
        ]
        yield pids


def _wait_workers(pool: str, n: int, timeout: float = 180) -> None:
    import asyncio

    from prefect.client.orchestration import get_client

    async def online() -> int:
        async with get_client() as client:
            workers = await client.read_workers_for_work_pool(work_pool_name=pool)
        return sum(1 for w in workers if w.status.value == "ONLINE")

    deadline = time.monotonic() + timeout
    while asyncio.run(online()) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} workers did not come online on {pool}")
        time.sleep(0.5)


# --- one run ------------------------------------------------------------------------------


def run_job(
    tb: RemoteTestbed,
    addresses: list[Any],
    workers: int,
    shard_size: int | None,
    work: Path,
) -> dict[str, Any]:
    """Upload ``addresses`` as a CSV to a fresh ``verimail serve`` with ``workers`` workers,
    poll the job to its end and download its results; the figures of it."""
    from verimail.runners.deploy import register_deployments
    from verimail.store.testing import temporary_database_url

    pool = f"verimail-bench-shards-{os.getpid()}-{workers}-{len(addresses)}"
    register_deployments(pool, schedule=False)
    data = work / "data"
    data.mkdir(parents=True)
    upload = work / "list.csv"
    upload.write_text("email\n" + "\n".join(a.address for a in addresses) + "\n")
    with temporary_database_url("postgres", work) as url:
        env = {
            **_env(tb, data),
            **POLITENESS,
            "VERIMAIL_DATABASE_URL": url,
            "VERIMAIL_REDIS_URL": REDIS_URL,
            "VERIMAIL_RUNNER": "deployment",
            "VERIMAIL_PREFECT_WORK_POOL": pool,
            "PREFECT_API_URL": os.environ["PREFECT_API_URL"],
            "PREFECT_WORKER_QUERY_SECONDS": "1",
        }
        if shard_size is not None:
            env["VERIMAIL_JOB_SHARD_SIZE"] = str(shard_size)
        key = _account(env, work, credits=len(addresses) + 10)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = (work / "serve.log").open("wb")
        server = subprocess.Popen(
            [str(VERIMAIL), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_healthy(server, base, work / "serve.log", timeout=120)
            with _workers(pool, env, work, workers) as pids:
                _wait_workers(pool, workers)  # (their start-up is not part of the figures)
                tb.reset()
                roots = {server.pid: "API", **dict.fromkeys(pids, "worker")}
                with Sampler(roots, data) as sampler:
                    figures = _upload_and_wait(base, key, upload, work)
                figures["peak_rss_mib"] = sampler.peaks_mib()
                figures["disk_peak_mib"] = sampler.disk_peak / 2**20
                figures["disk_end_mib"] = disk_bytes(data) / 2**20
                figures["testbed"] = tb.stats()
        finally:
            stop_process(server)
    statuses = figures.pop("statuses")
    hits = sum(
        1
        for a, got in zip(addresses, statuses, strict=True)
        if got in EXPECTED_STATUSES[a.expected]
    )
    figures["agreement"] = hits / max(1, len(addresses))
    figures["workers"] = workers
    figures["addresses"] = len(addresses)
    return figures


def _upload_and_wait(base: str, key: str, upload: Path, work: Path) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=300) as client:
        t0 = time.monotonic()
        with upload.open("rb") as fh:
            created = client.post("/api/bulk", files={"file": ("list.csv", fh, "text/csv")})
        created.raise_for_status()
        job_id = created.json()["job_id"]
        uploaded = time.monotonic() - t0
        started = None
        while True:
            body = client.get(f"/api/bulk/{job_id}").json()
            if body["status"] == "processing" and started is None:
                started = time.monotonic() - t0
            if body["status"] in ("completed", "failed"):
                break
            time.sleep(0.5)
        completed = time.monotonic() - t0
        if body["status"] != "completed":
            raise RuntimeError(f"job {job_id} failed: {body.get('failed_reason')}")
        out = work / "results.parquet"
        with client.stream(
            "GET", f"/api/bulk/{job_id}/download", params={"format": "parquet"}
        ) as r:
            r.raise_for_status()
            with out.open("wb") as fh:
                for chunk in r.iter_bytes():
                    fh.write(chunk)
        downloaded = time.monotonic() - t0
    frame = pl.read_parquet(out, columns=["status"])
    return {
        "uploaded_s": uploaded,
        "processing_at_s": started,
        "completed_s": completed,
        "wall_s": downloaded,
        "shards": body.get("shards_total"),
        "counts": {
            k: body[k] for k in ("valid_count", "invalid_count", "catch_all_count", "unknown_count")
        },
        "statuses": frame.get_column("status").to_list(),
    }


# --- the parts ------------------------------------------------------------------------------


def _part(spec: WorldSpec, workers: list[int], shard_size: int | None) -> list[dict[str, Any]]:
    _, addresses = build_world(spec)
    runs = []
    with RemoteTestbed(spec) as tb:
        for n in workers:
            with tempfile.TemporaryDirectory(prefix="verimail-bench-shards-") as tmp:
                started = time.monotonic()
                run = run_job(tb, addresses, n, shard_size, Path(tmp))
                run["elapsed_s"] = time.monotonic() - started
                runs.append(run)
                print(
                    f"  {len(addresses):,} addresses, {n} worker(s): {run['wall_s']:.1f} s",
                    file=sys.stderr,
                )
    return runs


@contextlib.contextmanager
def _prefect(work: Path) -> Iterator[None]:
    """A Prefect server of its own for the runs, on a PostgreSQL database of its own as a
    deployment's would be (on SQLite, several workers' runs wait on its lock), or the one
    PREFECT_API_URL names."""
    from verimail.runners.prefect_ui import prefect_ui
    from verimail.runners.testing import prefect_database
    from verimail.store.testing import postgres_test_url

    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    with prefect_database(postgres_test_url()) as url:
        os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] = url
        with prefect_ui(free_port(), work / "prefect"):
            yield


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addresses", type=int, default=200_000)
    parser.add_argument("--latency-addresses", type=int, default=20_000)
    parser.add_argument("--million", type=int, default=1_000_000)
    parser.add_argument("--skip-million", action="store_true")
    parser.add_argument("--workers", default="1,2,4")
    add_output_args(parser)
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]

    cpu_spec = WorldSpec(addresses=args.addresses, reply_delay=0.0, dns_delay=0.0)
    latency_spec = WorldSpec(addresses=args.latency_addresses)
    million_spec = WorldSpec(
        addresses=args.million,
        domains=args.million // 10,
        hosts=2_000,
        reply_delay=0.0,
        dns_delay=0.0,
    )
    with tempfile.TemporaryDirectory(prefix="verimail-bench-prefect-") as tmp, _prefect(Path(tmp)):
        cpu = _part(cpu_spec, workers, max(1, args.addresses // 8))
        latency = _part(latency_spec, workers, max(1, args.latency_addresses // 8))
        million = None if args.skip_million else _part(million_spec, [max(workers)], None)[0]
    tables, reading = _tables(cpu_spec, cpu, latency_spec, latency, million_spec, million)
    publish(
        args,
        title="One job across many workers: shards on the pool (1, 2, 4 worker processes)",
        command=command_text("bench.shards", argv),
        tables=tables,
        reading=reading,
        extra={"cpu": cpu, "latency": latency, "million": million},
    )
    return {"cpu": cpu, "latency": latency, "million": million, "tables": tables}


def _tables(
    cpu_spec: WorldSpec,
    cpu: list[dict[str, Any]],
    latency_spec: WorldSpec,
    latency: list[dict[str, Any]],
    million_spec: WorldSpec,
    million: dict[str, Any] | None,
) -> tuple[list[Table], list[str]]:
    columns = [
        "worker processes",
        "shards",
        "upload → completed s",
        "upload → downloaded s",
        "addresses/s",
        "speedup vs 1",
        "most sessions on one server at once",
        "SMTP sessions",
        "agreement with the world",
    ]
    tables = []
    for title, runs in (
        (f"CPU-bound world: {cpu_spec.describe()}", cpu),
        (f"Latency-bound world: {latency_spec.describe()} (cap 5 sessions per server)", latency),
    ):
        table = Table(title, columns)
        one = runs[0]["wall_s"] if runs else None
        for run in runs:
            table.add(
                run["workers"],
                fmt_int(run["shards"]),
                fmt_float(run["completed_s"], 1),
                fmt_float(run["wall_s"], 1),
                fmt_int(run["addresses"] / run["wall_s"]),
                f"{one / run['wall_s']:.2f}×" if one else "–",
                run["testbed"]["max_host_peak"],
                fmt_int(run["testbed"]["sessions"]),
                f"{100 * run['agreement']:.2f}%",
            )
        tables.append(table)
    reading = []
    if million is not None:
        table = Table(
            f"{million['addresses']:,} addresses as one CSV, {million['workers']} worker "
            f"processes: {million_spec.describe()}",
            ["figure", "value"],
        )
        table.add("shards", fmt_int(million["shards"]))
        table.add("upload s", fmt_float(million["uploaded_s"], 1))
        table.add("upload → completed s", fmt_float(million["completed_s"], 1))
        table.add("upload → downloaded s", fmt_float(million["wall_s"], 1))
        for kind, mib in sorted(million["peak_rss_mib"].items()):
            table.add(f"peak RSS, {kind} (MiB)", fmt_int(mib))
        table.add("data dir at its largest (MiB)", fmt_int(million["disk_peak_mib"]))
        table.add("data dir at the end (MiB)", fmt_int(million["disk_end_mib"]))
        table.add("agreement with the world", f"{100 * million['agreement']:.2f}%")
        tables.append(table)
    return tables, reading


if __name__ == "__main__":
    main()
