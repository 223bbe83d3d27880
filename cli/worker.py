"""``verimail worker``: the warm worker (``runners/warm_worker.py``) in the foreground."""

from __future__ import annotations

import os
import signal

import typer
from rich.console import Console

console = Console(stderr=True)


def worker_command(
    pool: str | None = typer.Option(
        None, help="Work pool (default: VERIMAIL_PREFECT_WORK_POOL, else 'verimail')."
    ),
    limit: int = typer.Option(4, min=1, help="Flow runs at once (threads of this process)."),
    poll: float = typer.Option(2.0, min=0.05, help="Seconds between polls of the work pool."),
) -> None:
    """Run verimail's deployment runs in this process (imports the flows once: a run starts
    within a poll); the fast-start alternative to `prefect worker start`."""
    import logging

    import httpx
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_URL

    from verimail.config import get_settings

    url = PREFECT_API_URL.value()
    if not url:  # (Prefect would poll a throwaway server of this process)
        console.print(
            "verimail worker needs the Prefect server of the deployments: set PREFECT_API_URL "
            "(e.g. http://prefect.internal:4200/api).",
            style="red",
            highlight=False,
        )
        raise typer.Exit(2)
    from verimail.runners.warm_worker import PoolNotFound, WarmWorker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings = get_settings()
    name = pool or settings.prefect_work_pool
    worker = WarmWorker(settings, name, limit=limit, poll=poll)

    def on_signal(signum: int, _frame: object) -> None:
        if worker.stopping:  # a second signal: now, leaving the runs' jobs to the reaper
            console.print(f"stopped with {len(worker.running())} run(s) unfinished", soft_wrap=True)
            os._exit(128 + signum)
        console.print(
            f"stopping: no new runs; waiting for {len(worker.running())} run(s) to end "
            "(signal again to stop now)",
            soft_wrap=True,
        )
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    console.print(
        f"worker {worker.name} on pool {name!r} at {url}: {limit} run(s) at once, "
        f"polling every {poll:g} s",
        highlight=False,
    )
    try:
        worker.run()
    except PoolNotFound:
        console.print(
            f"No work pool {name!r} at PREFECT_API_URL={url}: run `verimail deploy` first.",
            style="red",
            highlight=False,
        )
        raise typer.Exit(1) from None
    except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
        console.print(f"Cannot reach Prefect at {url}: {exc}", style="red", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"worker {worker.name} stopped ({worker.started} run(s) taken)", soft_wrap=True)
