"""What a job leaves in Prefect for the people who look at runs: a run name that says what
the run does, and a summary table artifact once the job has ended.

Artifact keys carry a short installation id (``verimail-<id>-bulk-job-12``): several
installations (a laptop, staging, production) may share one Prefect database, and job 12 of
each must not land on the same artifact. The id is random, made once and kept in
``<data_dir>/installation-id`` (the data dir is shared by every API process and worker of
one installation).

Everything here is a view: a Prefect API that is slow or down costs the job nothing (each
call has a short timeout and its failure is logged, not raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verimail.config import Settings
from verimail.schemas.status_groups import groups
from verimail.store import jobs as job_store
from verimail.store.db import Store

log = logging.getLogger(__name__)

PREFECT_CALL_TIMEOUT = 5.0
"""Seconds a Prefect API call of this module may take (the client itself waits up to 60 s)."""
SUMMARY_TIMEOUT = 30.0
"""Seconds the summary of an ended job may take to publish: the job is settled already, so
only the run's own end waits for it (5 s lost summaries on a busy machine)."""
INSTALLATION_FILE = "installation-id"

_FINDER_ROWS = (
    ("found", "found_count"),
    ("catch-all", "catch_all_count"),
    ("not found", "invalid_count"),
    ("invalid input", "risky_count"),
    ("skipped (no credits)", "unknown_count"),
)
_KIND_WORD = {"bulk_csv": "bulk", "bulk_json": "bulk", "finder_csv": "finder"}


def installation_id(settings: Settings) -> str:
    """This installation's short random id (8 hex digits), made once in the data dir.

    Race-free between processes: written to a private file and hard-linked into place, so a
    process sees no file or a whole one."""
    path = Path(settings.data_dir) / INSTALLATION_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{INSTALLATION_FILE}.{uuid.uuid4().hex}")
        tmp.write_text(secrets.token_hex(4) + "\n", encoding="ascii")
        with contextlib.suppress(FileExistsError):  # (another process made it first)
            os.link(tmp, path)
        tmp.unlink()
    return path.read_text(encoding="ascii").strip()


def artifact_key(settings: Settings, what: str) -> str:
    """A Prefect artifact key unique to this installation (lower case, digits, dashes)."""
    return f"verimail-{installation_id(settings)}-{what}"


def job_words(job: job_store.Job) -> str:
    """``bulk job 12``: the start of the name of every run of the job."""
    return f"{_KIND_WORD.get(job.kind, job.kind)} job {job.id}"


def run_name(job: job_store.Job) -> str:
    """A flow run's name for a job: ``bulk job 12 · leads.csv``."""
    name = job_words(job)
    source = "JSON list" if job.kind == "bulk_json" else (job.options or {}).get("filename")
    return f"{name} · {source}" if source else name


async def name_unnamed_run(job: job_store.Job) -> None:
    """Name the run in progress for its job (``bulk job 12 · leads.csv``) unless it has a
    name of the job's already: the run planner names the runs it makes ("… · retry pass 1
    of 2", "… · merge"); a run started by hand in the Prefect UI has a random one."""
    try:
        from prefect.context import get_run_context

        current = get_run_context().flow_run.name  # type: ignore[union-attr]
    except Exception:  # (no run here)
        return
    if not current.startswith(job_words(job) + " "):
        await name_this_run(run_name(job))


async def name_this_run(name: str) -> None:
    """Rename the flow run in progress (no-op outside one, or when Prefect does not answer)."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.context import get_run_context

        run_id = get_run_context().flow_run.id  # type: ignore[union-attr]
        async with asyncio.timeout(PREFECT_CALL_TIMEOUT), get_client() as client:
            await client.update_flow_run(run_id, name=name)
    except Exception as exc:  # (a view: the job goes on)
        log.warning("could not name the flow run %r: %s", name, exc)


def download_url(settings: Settings, job: job_store.Job) -> str:
    """Where the API serves the job's results."""
    base = (settings.public_url or f"http://{settings.api_host}:{settings.api_port}").rstrip("/")
    if job.kind == "finder_csv":
        return f"{base}/api/find-email/csv/{job.public_id}/download"
    if job.kind == "bulk_json":
        return f"{base}/api/verify/bulk/{job.id}"
    return f"{base}/api/bulk/{job.id}/download"


def summary_rows(settings: Settings, job: job_store.Job) -> list[dict[str, str]]:
    """The summary table of an ended job: one ``{"item", "value"}`` row per fact."""
    rows = [("status", job.status)]
    if job.failed_reason:
        rows.append(("why it failed", job.failed_reason))
    rows.append(("rows", str(job.total_emails)))
    if job.unique_emails is not None:
        rows.append(("unique addresses", str(job.unique_emails)))
    rows.append(("processed", str(job.processed_emails)))
    if job.kind == "finder_csv":
        rows += [(label, str(getattr(job, column))) for label, column in _FINDER_ROWS]
    else:  # one row per status group (schemas/status_groups.py), as every surface shows them
        rows += [(status, str(n)) for status, n in groups(job).items()]
    if job.kind != "finder_csv":
        rate = job.unknown_count / job.processed_emails if job.processed_emails else 0.0
        rows.append(("unknown rate", f"{rate:.1%}"))
        blocked = (job.options or {}).get("egress_blocked") or {}
        rows += [(f"our IP refused (egress {name})", str(n)) for name, n in blocked.items()]
    rows += [
        ("credits reserved", str(job.credits_reserved)),
        ("credits used", str(job.credits_used)),
        ("credits refunded", str(job.credits_refunded)),
    ]
    if job.started_at is not None and job.completed_at is not None:
        seconds = (job.completed_at - job.started_at).total_seconds()
        rows.append(("duration", f"{seconds:.1f} s"))
    rows.append(("results path", job.result_path or "none"))
    if job.status == "completed":
        rows.append(("API download URL", download_url(settings, job)))
    return [{"item": item, "value": value} for item, value in rows]


async def publish_table(
    settings: Settings,
    what: str,
    rows: list[dict[str, str]],
    description: str,
    *,
    flow_run_id: str | None = None,
    timeout: float = PREFECT_CALL_TIMEOUT,
) -> None:
    """A table artifact under this installation's key for ``what``, on the flow run
    ``flow_run_id`` (default: the run at hand); errors logged."""
    try:
        from prefect.artifacts import TableArtifact

        artifact = TableArtifact(
            table=rows, key=artifact_key(settings, what), description=description
        )
        if flow_run_id is not None:
            artifact.flow_run_id = uuid.UUID(flow_run_id)
        async with asyncio.timeout(timeout):
            await artifact.acreate()
    except Exception as exc:  # (a view: the job's outcome stands)
        log.warning("could not publish the %s artifact: %s", what, exc)


async def publish_job_summary(settings: Settings, store: Store, job_id: int) -> None:
    """The summary artifact of an ended job, read fresh from its row, on the run that
    started the job (a retry pass or a sharded job's merge may end it)."""
    job = await asyncio.to_thread(job_store.get_job_any, store.engine, job_id)
    if job is None:
        return
    word = _KIND_WORD.get(job.kind, job.kind)
    await publish_table(
        settings,
        f"{word}-job-{job.id}",
        summary_rows(settings, job),
        f"{run_name(job)}: {job.status}",
        flow_run_id=(job.options or {}).get("first_flow_run_id"),
        timeout=SUMMARY_TIMEOUT,
    )


def transition_rows(transitions: Mapping[str, int]) -> list[dict[str, Any]]:
    """``{"valid->invalid": 3}`` as table rows (most frequent first)."""
    ordered = sorted(transitions.items(), key=lambda item: (-item[1], item[0]))
    return [
        {"from": change.split("->")[0], "to": change.split("->")[1], "addresses": count}
        for change, count in ordered
    ]
