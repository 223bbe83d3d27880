"""A big job's shards: one row each (``job_shards``), so that any worker can verify one and
the job can tell which are done.

A shard belongs to a run number (``attempt``) the way a job does: a shard is *assigned*
to its next run before that run is started (:func:`assign`), the run *claims* it when it
starts (:func:`claim`) and beats it while it works (:func:`beat`); a run whose shard was
assigned to a later run meanwhile (it was taken for dead) finds that out at its next beat
and stops, and its writes are refused. A shard's progress adds up into the job's row (the
sums of every shard's, written under the job's lock), so the job reads as one.

The job's ``options["shards"]`` says how many there are and how many are done:
``{"total": 8, "done": 3}`` (the job JSON's ``shards_total``/``shards_done``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection, Engine, Row, and_, case, insert, not_, select, tuple_, update

from verimail.store.db import utcnow, write_tx
from verimail.store.job_lock import lock_job, options_of, run_owns, store_options
from verimail.store.jobs import count_values
from verimail.store.tables import job_shards, jobs

ShardBeat = Literal["beaten", "superseded", "finished"]


@dataclass(frozen=True)
class Shard:
    job_id: int
    shard: int
    status: str
    attempt: int
    addresses: int
    rows: int
    processed: int
    counts: dict[str, int]
    flow_run_id: str | None
    heartbeat_at: datetime | None
    completed_at: datetime | None

    @property
    def key(self) -> tuple[int, int]:
        return self.job_id, self.shard


def _shard(row: Row[Any]) -> Shard:
    values = dict(row._mapping)
    values["counts"] = json.loads(values["counts"]) if values["counts"] else {}
    return Shard(**values)


def _where(job_id: int, shard: int) -> Any:
    return and_(job_shards.c.job_id == job_id, job_shards.c.shard == shard)


def _live_shard(conn: Connection, job_id: int, shard: int) -> tuple[Any, Any | None]:
    """The job's row and the shard's, under the job's lock; the shard's is None when the job
    is no longer processing (every change to a shard takes the job's lock first, so a merge
    never races it)."""
    job = lock_job(conn, job_id)
    if job is None or job.status != "processing":
        return job, None
    return job, conn.execute(select(job_shards).where(_where(job_id, shard))).one_or_none()


def create_shards(
    engine: Engine, job_id: int, attempt: int, sizes: Sequence[tuple[int, int]]
) -> bool:
    """The job's shards, ``sizes`` giving each one's (addresses, rows), all pending for
    their first run; False unless the job is processing and still run ``attempt``'s. A
    job that has its shards already keeps them (a resumed run finds and reuses them)."""
    now = utcnow()
    with write_tx(engine) as conn:
        job = lock_job(conn, job_id)
        if job is None or job.status != "processing" or not run_owns(job, attempt):
            return False
        if conn.execute(select(job_shards.c.shard).where(job_shards.c.job_id == job_id)).first():
            return True
        conn.execute(
            insert(job_shards),
            [
                {"job_id": job_id, "shard": n, "addresses": a, "rows": r, "heartbeat_at": now}
                for n, (a, r) in enumerate(sizes)
            ],
        )
        options = options_of(job)
        store_options(conn, job_id, {**options, "shards": {"total": len(sizes), "done": 0}})
    return True


def shards_of(engine: Engine, job_id: int) -> list[Shard]:
    """The job's shards, in order (none: the job is not sharded)."""
    query = select(job_shards).where(job_shards.c.job_id == job_id).order_by(job_shards.c.shard)
    with engine.connect() as conn:
        return [_shard(row) for row in conn.execute(query)]


def assign(
    engine: Engine, job_id: int, shard: int, *, seen_heartbeat: datetime | None = None
) -> int | None:
    """Give a shard that is not done to its next run: the new run number, or None (it is
    done, the job is over, or — given ``seen_heartbeat`` — somebody beat it meanwhile:
    another process took it over first)."""
    now = utcnow()
    with write_tx(engine) as conn:
        _job, row = _live_shard(conn, job_id, shard)
        if row is None or row.status == "done":
            return None
        if seen_heartbeat is not None and row.heartbeat_at != seen_heartbeat:
            return None
        attempt = row.attempt + 1
        conn.execute(
            update(job_shards)
            .where(_where(job_id, shard))
            .values(status="pending", attempt=attempt, heartbeat_at=now, flow_run_id=None)
        )
    return attempt


def claim(engine: Engine, job_id: int, shard: int, attempt: int) -> Shard | None:
    """Start run ``attempt`` of a shard: the shard, or None when it is not that run's (done,
    assigned to a later run, or the job is over)."""
    now = utcnow()
    with write_tx(engine) as conn:
        _job, row = _live_shard(conn, job_id, shard)
        if row is None or row.status == "done" or row.attempt != attempt:
            return None
        conn.execute(
            update(job_shards)
            .where(_where(job_id, shard))
            .values(status="running", heartbeat_at=now)
        )
        row = conn.execute(select(job_shards).where(_where(job_id, shard))).one()
    return _shard(row)


def beat(engine: Engine, job_id: int, shard: int, attempt: int) -> ShardBeat:
    """A shard run's heartbeat: "beaten" while the shard is still run ``attempt``'s;
    "superseded" once it was assigned to a later run or the job ended; "finished" once
    this run marked it done."""
    with write_tx(engine) as conn:
        _job, row = _live_shard(conn, job_id, shard)
        if row is None:
            return "superseded"
        if row.attempt != attempt:
            return "superseded"
        if row.status == "done":
            return "finished"
        conn.execute(update(job_shards).where(_where(job_id, shard)).values(heartbeat_at=utcnow()))
    return "beaten"


def record_progress(
    engine: Engine,
    job_id: int,
    shard: int,
    attempt: int,
    processed: int,
    counts: dict[str, int],
    *,
    done: bool = False,
) -> int | None:
    """Run ``attempt``'s progress on its shard (absolute numbers, its rows), added up into
    the job's row; with ``done`` the shard is marked done. Returns the shards not done yet
    (0: this was the last), or None when the shard is not this run's any more."""
    now = utcnow()
    with write_tx(engine) as conn:
        job, row = _live_shard(conn, job_id, shard)
        if row is None or row.attempt != attempt or row.status == "done":
            return None
        values: dict[str, Any] = {
            "processed": processed,
            "counts": json.dumps(counts),
            "heartbeat_at": now,
        }
        if done:
            values.update(status="done", completed_at=now)
        conn.execute(update(job_shards).where(_where(job_id, shard)).values(**values))
        left = _add_up(conn, job, now)
    return left


def _add_up(conn: Connection, job: Row[Any], now: datetime) -> int:
    """The job's progress and counts as the sums of its shards'; its shards done in its
    options. Returns the shards not done yet."""
    rows = conn.execute(
        select(job_shards.c.processed, job_shards.c.counts, job_shards.c.status).where(
            job_shards.c.job_id == job.id
        )
    ).all()
    counts: Counter[str] = Counter()
    for row in rows:
        counts.update(json.loads(row.counts) if row.counts else {})
    done = sum(1 for row in rows if row.status == "done")
    options = options_of(job)
    options["shards"] = {"total": len(rows), "done": done}
    store_options(
        conn,
        job.id,
        options,
        processed_emails=sum(row.processed for row in rows),
        heartbeat_at=now,
        **count_values(dict(counts)),
    )
    return len(rows) - done


def set_flow_run(engine: Engine, job_id: int, shard: int, flow_run_id: str, attempt: int) -> None:
    """The flow run that does run ``attempt`` of a shard; nothing once a later run was
    assigned (a run handed to the pool late must not stand for the run that replaced it:
    the reaper would watch the wrong run)."""
    with write_tx(engine) as conn:
        conn.execute(
            update(job_shards)
            .where(_where(job_id, shard), job_shards.c.attempt == attempt)
            .values(flow_run_id=flow_run_id)
        )


def stale_shards(
    engine: Engine, older_than: timedelta, *, now: datetime | None = None
) -> list[Shard]:
    """Shards of open jobs that are not done and whose run went quiet: no beat (and no
    assignment) for ``older_than``. A shard not handed to a run yet (pending, no flow run)
    is its job's run's while that run beats: it is handing the shards to the work pool,
    a Prefect call each, which on a busy server takes longer than ``older_than``."""
    cutoff = (now or utcnow()) - older_than
    being_handed_out = and_(
        job_shards.c.status == "pending",
        job_shards.c.flow_run_id.is_(None),
        jobs.c.heartbeat_at >= cutoff,
    )
    query = (
        select(job_shards)
        .join(jobs, jobs.c.id == job_shards.c.job_id)
        .where(
            jobs.c.status == "processing",
            job_shards.c.status != "done",
            job_shards.c.heartbeat_at < cutoff,
            not_(being_handed_out),
        )
        .order_by(job_shards.c.job_id, job_shards.c.shard)
    )
    with engine.connect() as conn:
        return [_shard(row) for row in conn.execute(query)]


def unfinished_flow_runs(engine: Engine) -> dict[tuple[int, int], str]:
    """Shards not done that name a flow run: (job, shard) → flow run id (the deployment
    runner asks Prefect which of those runs still wait for a worker)."""
    query = select(job_shards.c.job_id, job_shards.c.shard, job_shards.c.flow_run_id).where(
        job_shards.c.status != "done", job_shards.c.flow_run_id.is_not(None)
    )
    with engine.connect() as conn:
        return {(row.job_id, row.shard): row.flow_run_id for row in conn.execute(query)}


def keep_alive(
    engine: Engine, keys: Sequence[tuple[int, int]], *, now: datetime | None = None
) -> int:
    """Beat the shards a live runner holds (queued for a worker); how many were beaten."""
    if not keys:
        return 0
    return _beat(engine, tuple_(job_shards.c.job_id, job_shards.c.shard).in_(list(keys)), now)


def keep_alive_of_jobs(
    engine: Engine, job_ids: Sequence[int], *, now: datetime | None = None
) -> int:
    """Beat every shard of the jobs a live runner holds: the local runner runs a job's
    shards inside the job's own run, so the process that holds the job holds its
    shards too — a shard slow to start is not a shard whose runner died."""
    if not job_ids:
        return 0
    return _beat(engine, job_shards.c.job_id.in_(list(job_ids)), now)


def _beat(engine: Engine, which: Any, now: datetime | None) -> int:
    now = now or utcnow()
    beat_at = case((job_shards.c.heartbeat_at > now, job_shards.c.heartbeat_at), else_=now)
    with write_tx(engine) as conn:
        result = conn.execute(
            update(job_shards)
            .where(which, job_shards.c.status != "done")
            .values(heartbeat_at=beat_at)
        )
    return result.rowcount
