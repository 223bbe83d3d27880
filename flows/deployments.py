"""The flows' deployments, as ``prefect.yaml`` and ``verimail deploy`` define them, and
whether the run at hand is a deployment's.

A run that plans another run (a job's deferred pass, a re-verification's next date) plans
it on the deployment when workers run the flows, and for the local runner otherwise.
"""

from __future__ import annotations

# Deployment names as prefect.yaml defines them ("<flow name>/<deployment name>").
DEPLOYMENTS = {
    "bulk": "bulk-verify/bulk-verify",
    "finder": "find-emails/find-emails",
    "reverify": "reverify-stored/reverify-stored",
    "shard": "verify-shard/verify-shard",
    "retention": "purge-expired-jobs/purge-expired-jobs",
}


def from_deployment() -> bool:
    """The flow run this code runs in is a deployment's (a worker took it from the work pool),
    not the local runner's or a direct call. A run it plans for later belongs to that
    deployment too, whatever the worker's own ``runner`` setting says."""
    try:
        from prefect.context import get_run_context

        return get_run_context().flow_run.deployment_id is not None  # type: ignore[union-attr]
    except Exception:  # (no run here)
        return False
