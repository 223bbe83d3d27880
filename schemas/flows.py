"""The flows verimail registers with Prefect, in one place.

Everything that names a flow reads this table: ``verimail deploy`` (``runners/deploy.py``)
registers one deployment per entry, ``prefect.yaml`` is generated from it (a test compares),
the warm worker loads the flows it may run from it, the run planner (``flows/planner.py``)
finds the deployment or flow of a run by it, and the job service finds the flow that works
each kind of job. A new flow is one entry here.

Pure data (no Prefect): the flow objects are loaded by module and attribute where they run.
The flow's name is also its deployment's name, as data teams see both in the Prefect UI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RegisteredFlow:
    """One of verimail's flows and its deployment."""

    key: str
    """How verimail's code names the flow: ``bulk``, ``finder``, ``shard``, ``reverify``."""
    name: str
    """The flow's name in Prefect, and its deployment's."""
    module: str
    attr: str
    description: str
    job_kinds: tuple[str, ...] = ()
    """The kinds of job row (``store/jobs.py``) whose runs this flow works."""
    cron: str | None = None
    """A standing schedule of its deployment (UTC), if any."""

    @property
    def deployment(self) -> str:
        """``<flow name>/<deployment name>``, as Prefect names a deployment."""
        return f"{self.name}/{self.name}"

    @property
    def module_entrypoint(self) -> str:
        """The entrypoint ``verimail deploy`` registers (the installed package)."""
        return f"verimail.{self.module}:{self.attr}"

    @property
    def file_entrypoint(self) -> str:
        """The entrypoint of ``prefect.yaml`` (a file of this checkout)."""
        return f"{self.module.replace('.', '/')}.py:{self.attr}"


REVERIFY_CRON = "0 3 * * 1"  # Mondays 03:00 UTC: stale addresses (older than 30 days)
RETENTION_CRON = "30 2 * * *"  # daily 02:30 UTC: jobs ended more than retention_days ago

FLOWS: tuple[RegisteredFlow, ...] = (
    RegisteredFlow(
        "bulk",
        "bulk-verify",
        "flows.bulk",
        "bulk_verify",
        "Verify a bulk job (CSV upload or JSON list); or a file for an account.",
        job_kinds=("bulk_csv", "bulk_json"),
    ),
    RegisteredFlow(
        "finder",
        "find-emails",
        "flows.finder",
        "find_emails",
        "Email Finder CSV job.",
        job_kinds=("finder_csv",),
    ),
    RegisteredFlow(
        "shard",
        "verify-shard",
        "flows.shard",
        "verify_shard",
        "One shard of a big bulk job (bulk-verify hands them out).",
    ),
    RegisteredFlow(
        "reverify",
        "reverify-stored",
        "flows.reverify",
        "reverify_stored",
        "Re-verify a stored list and write a change report.",
        cron=REVERIFY_CRON,
    ),
    RegisteredFlow(
        "retention",
        "purge-expired-jobs",
        "flows.retention",
        "purge_expired_jobs",
        "Delete the data of jobs ended more than VERIMAIL_RETENTION_DAYS ago (0 keeps all).",
        cron=RETENTION_CRON,
    ),
)

BY_KEY: dict[str, RegisteredFlow] = {entry.key: entry for entry in FLOWS}
DEPLOYMENTS: dict[str, str] = {entry.key: entry.deployment for entry in FLOWS}
"""Registry key → ``<flow>/<deployment>`` name."""


def flow_of_job(job_kind: str) -> RegisteredFlow:
    """The flow that works jobs of ``job_kind``; ``KeyError`` for a kind no flow works."""
    for entry in FLOWS:
        if job_kind in entry.job_kinds:
            return entry
    raise KeyError(f"no flow works {job_kind!r} jobs")
