"""verimail.runners: how the flows are started and served — one interface, two modes
(setting ``runner``), and what goes with them.

- ``local`` (default, ``runners/local.py``): the API process runs the flows itself on
  Prefect's embedded server; nothing else to install or start.
- ``deployment`` (``runners/deployment.py``): each run goes to a work pool; workers on any
  number of machines run it against the shared store and data dir. ``runners/deploy.py``
  registers the deployments (``verimail deploy``).

Also here: the planned runs' sweep (``sweep.py``), the Prefect server with its UI for the
demo and ``verimail serve`` (``prefect_ui.py``), and worker processes for tests and
benchmarks (``testing.py``). The runners start flows; the flows never import a runner.
"""

from __future__ import annotations

from verimail import flows as _flows  # noqa: F401  (Prefect's analytics off before Prefect loads)
from verimail.config import Settings
from verimail.jobs.create import JobRunner
from verimail.runners.deployment import DeploymentRunner
from verimail.runners.local import LocalRunner


def make_runner(settings: Settings) -> JobRunner:
    """The runner the settings ask for."""
    if settings.runner == "deployment":
        return DeploymentRunner(settings)
    return LocalRunner(settings)
