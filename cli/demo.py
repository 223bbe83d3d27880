"""``verimail demo`` (what ``make demo`` runs): the whole service on one machine, shown working.

It starts the simulated mail world (``data/worlds/demo.yaml``: real DNS and SMTP servers on
loopback addresses), points a fresh API at it with its own data dir (``.verimail/demo``,
SQLite), creates or reuses a demo account, serves the API, and then calls it itself — a
``valid``, an ``invalid`` and a ``catchall`` address, then a bulk CSV upload, its polling
and download — printing before each request the ``curl`` line that repeats it. Then it
keeps serving until Ctrl-C (``--once`` exits instead).

The raw demo key is kept in ``<data dir>/demo-api-key`` (the store only has its hash) so a
second run prints the same key; if it no longer works a new one is issued.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from verimail.cli.jobs import quiet_prefect
from verimail.schemas.status_groups import groups
from verimail.testbed.cli import DEFAULT_WORLD, DnsPortOption, SmtpPortOption, start_or_exit

if TYPE_CHECKING:
    import httpx

    from verimail.config import Settings
    from verimail.store.db import Store

# The store, the runners, httpx and the testbed's servers are imported where the demo runs:
# ``verimail --help`` loads this module too (tests/test_cli_help.py).

DEMO_EMAIL = "demo@verimail.localhost"
DEMO_PLAN = "business"
DEMO_TOP_UP = 100
KEY_FILE = "demo-api-key"
DEMO_PREFECT_UI_PORT = 4200  # Prefect's own default port

# (address, what the demo world makes of it)
SHOWCASE = [
    ("alice@acme.test", "a mailbox the server confirms"),
    ("nobody@acme.test", "a mailbox the server says does not exist"),
    ("anyone@catchall.test", "a domain that accepts every address"),
]
MORE = [
    "john.doe@catchall.test",
    "info@acme.test",
    "hello@implicit.test",
    "x@nullmx.test",
    "eve@blocked.test",
    "someone@nowhere.test",
    "not-an-address",
]


DEMO_RETRIES = {"job_retry_delay": 5.0, "job_retry_max_wait": 15.0}
"""The demo world's greylisting clears at the second try: a job's deferred retry comes after
5 s (then 10 s), not the production 15 min (docs/greylisting.md). (20 s and 40 s held the
demo's 10-row job a minute on its one blocked address.)"""


def cli_line(settings: Settings) -> str:
    """The ``export`` line that points the CLI at the demo: its testbed, its store and its
    retry pace (the CLI's own store is ``.verimail/``: its jobs were not the demo's)."""
    pairs = {
        "VERIMAIL_DATA_DIR": str(settings.data_dir),
        "VERIMAIL_DNS_NAMESERVERS": ",".join(settings.dns_nameservers),
        "VERIMAIL_SMTP_PORT": str(settings.smtp_port),
        "VERIMAIL_SMTP_ALLOW_NETWORKS": ",".join(str(n) for n in settings.smtp_allow_networks),
        "VERIMAIL_JOB_RETRY_DELAY": f"{settings.job_retry_delay:g}",
        "VERIMAIL_JOB_RETRY_MAX_WAIT": f"{settings.job_retry_max_wait:g}",
    }
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in pairs.items())


def demo_key(store: Store, data_dir: Path) -> str:
    """The demo account's raw key: the saved one if it still works, else a new one."""
    from verimail.store.accounts import (
        authenticate,
        create_account,
        create_api_key,
        get_account_by_email,
    )

    key_path = data_dir / KEY_FILE
    if key_path.exists():
        saved = key_path.read_text().strip()
        if authenticate(store.engine, saved) is not None:
            _top_up(store, saved)
            return saved
    account = get_account_by_email(store.engine, DEMO_EMAIL) or create_account(
        store.engine, store.settings, plan=DEMO_PLAN, email=DEMO_EMAIL
    )
    key, _info = create_api_key(store.engine, account.id, name="demo")
    key_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    _top_up(store, key)
    return key


def _top_up(store: Store, key: str) -> None:
    """Keep the demo account able to run the showcase however often the demo is run."""
    from verimail.store.accounts import authenticate
    from verimail.store.billing import balance, grant

    account = authenticate(store.engine, key)
    assert account is not None
    have = balance(store.engine, account.id).total
    if have < DEMO_TOP_UP // 2:
        grant(store.engine, account.id, DEMO_TOP_UP - have, reason="demo top-up")


def curl_line(
    base_url: str,
    key: str,
    path: str,
    *,
    body: dict[str, object] | None = None,
    upload: Path | None = None,
) -> str:
    """A ready-to-paste shell command making the same request as the demo just made: a GET,
    a JSON POST (``body``) or a multipart file upload (``upload``)."""
    words = ["curl", "-s"]
    if body is not None or upload is not None:
        words += ["-X", "POST"]
    words += [f"{base_url}{path}", "-H", f"Authorization: Bearer {key}"]
    if body is not None:
        words += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    if upload is not None:
        words += ["-F", f"file=@{upload}"]
    return shlex.join(words)


def metrics_line(settings: Settings, base_url: str) -> str:
    """Where the Prometheus metrics are, or how to switch them on: ``/metrics`` answers 404
    until ``VERIMAIL_METRICS_TOKEN`` is set, which surprised a first user. The token itself
    is never printed (the one who set it knows it)."""
    if settings.metrics_token is None:
        return (
            f"Metrics: off ({base_url}/metrics answers 404); start the demo with "
            "VERIMAIL_METRICS_TOKEN=<a secret> set to serve them (docs/metrics.md)."
        )
    return (
        f"Metrics: curl -H 'Authorization: Bearer <your VERIMAIL_METRICS_TOKEN>' {base_url}/metrics"
    )


DEMO_CSV = (
    "name,email\n"
    + "".join(f"{address.split('@')[0]},{address}\n" for address, _ in SHOWCASE)
    + "".join(f"{address.split('@')[0]},{address}\n" for address in MORE)
)


async def _show_bulk(
    console: Console, client: httpx.AsyncClient, key: str, base_url: str, data_dir: Path
) -> bool:
    """Upload a small CSV as a bulk job, follow it to the end, print the results CSV, with
    the curl line of each request (the CSV is saved in the data dir for the upload's).

    Returns True when something went wrong. The job runs as a Prefect flow in this process
    (the local runner); the first one waits for Prefect's embedded server to start.
    """
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    headers = {"Authorization": f"Bearer {key}"}
    console.rule("a bulk job: upload a CSV, poll, download")
    upload = data_dir / "demo.csv"
    upload.write_text(DEMO_CSV, encoding="utf-8")
    console.print("$ " + curl_line(base_url, key, "/api/bulk", upload=upload), **plain)
    created = await client.post(
        "/api/bulk", headers=headers, files={"file": ("demo.csv", DEMO_CSV.encode(), "text/csv")}
    )
    console.print(f"POST /api/bulk -> HTTP {created.status_code}", **plain)
    if created.status_code != 200:
        console.print(created.text, **plain)
        return True
    job_id = created.json()["job_id"]
    console.print(
        f"job {job_id}: {created.json()['total_emails']} addresses; polling every 0.25 s "
        "until it is completed (the first job waits for Prefect's embedded server, ~20 s):",
        **plain,
    )
    console.print("$ " + curl_line(base_url, key, f"/api/bulk/{job_id}"), **plain)
    last = None
    for _ in range(1200):
        job = (await client.get(f"/api/bulk/{job_id}", headers=headers)).json()
        state = (job["status"], job["processed_emails"], job.get("phase"))
        if state != last:
            phase = f" ({job['phase']})" if job.get("phase") else ""
            console.print(
                f"  {job['status']}{phase}: {job['processed_emails']}/{job['total_emails']}",
                **plain,
            )
            last = state
        if job["status"] in ("completed", "failed"):
            break
        await asyncio.sleep(0.25)
    if job["status"] != "completed":
        console.print(f"job {job_id} did not complete: {job.get('failed_reason')}", **plain)
        return True
    # One count per status group, as the dashboard's chart and list and `verimail bulk`
    # show them (schemas/status_groups.py); the API's fields are sums of these.
    counts = groups(job)
    console.print(f"BULK job={job_id} status=completed {json.dumps(counts)}", **plain)
    console.print("$ " + curl_line(base_url, key, f"/api/bulk/{job_id}/download"), **plain)
    download = await client.get(f"/api/bulk/{job_id}/download", headers=headers)
    console.print(f"GET /api/bulk/{job_id}/download -> HTTP {download.status_code}", **plain)
    console.print(download.text, **plain)
    return download.status_code != 200


async def _serve_and_show(
    console: Console,
    settings: Settings,
    host: str,
    port: int,
    key: str,
    once: bool,
    bulk: bool = True,
    prefect_url: str | None = None,
) -> int:
    import httpx
    import uvicorn

    from verimail.api.app import create_app
    from verimail.api.http_edge import server_options

    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        log_level="warning",
        **server_options(settings),
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # uvicorn offers no event to await; its own flag is polled
        if serving.done():
            await serving
            console.print(f"[red]The API did not start on {host}:{port}.[/red]")
            return 1
        await asyncio.sleep(0.02)

    base_url = f"http://{host}:{port}"
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    console.print(f"\n[bold]API[/bold] {base_url}  (docs: {base_url}/docs)")
    console.print("[bold]API key[/bold] ", end="")
    console.print(key, **plain)
    failed = False
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for email, what in SHOWCASE:
            console.rule(f"{email} — {what}")
            line = curl_line(base_url, key, "/api/verify/single", body={"email": email})
            console.print("$ " + line, **plain)
            response = await client.post(
                "/api/verify/single",
                json={"email": email},
                headers={"Authorization": f"Bearer {key}"},
            )
            console.print(f"POST /api/verify/single -> HTTP {response.status_code}", **plain)
            try:
                console.print_json(data=response.json())
            except ValueError:
                console.print(response.text, **plain)
            if response.status_code == 200:
                result = response.json()
                console.print(f"RESULT {email} status={result['status']}", **plain)
            else:
                failed = True
        if bulk:
            failed = await _show_bulk(console, client, key, base_url, settings.data_dir) or failed
    console.rule()
    console.print("More addresses of the demo world to try: " + ", ".join(MORE), **plain)
    console.print(f"Dashboard: {base_url}/dashboard (sign up there, or use the key above)")
    console.print(
        "The CLI on this demo's testbed and store, in another shell (its jobs are then in "
        "this store, under cli@verimail.localhost, and its put-off addresses retried "
        "after seconds, as here):",
        **plain,
    )
    console.print(cli_line(settings), **plain)
    console.print(metrics_line(settings, base_url), **plain)
    if prefect_url is not None:
        console.print(
            f"Prefect UI: {prefect_url} (flow runs, job summaries, and the deployments: "
            "Run → Custom run on one, and the demo's worker runs it)"
        )

    if once:
        server.should_exit = True
        await serving
        return 1 if failed else 0
    console.print(f"Serving on {base_url}; press Ctrl-C to stop.", **plain)
    await serving
    return 1 if failed else 0


def _start_prefect_ui(
    console: Console, stack: contextlib.ExitStack, port: int, data_dir: Path
) -> str | None:
    """Start the Prefect server with its UI (stopped with ``stack``); its URL, or None (and
    a line saying why) when it cannot start: the demo then runs on Prefect's temporary
    server, without a UI."""
    from verimail.runners.prefect_ui import PrefectUIError, prefect_ui

    try:
        with console.status(f"starting the Prefect UI on 127.0.0.1:{port} (~15 s)…"):
            server = stack.enter_context(prefect_ui(port, data_dir))
    except PrefectUIError as exc:
        console.print(
            f"[yellow]No Prefect UI: {exc}; choose another port with --prefect-ui-port.[/yellow]"
        )
        return None
    console.print(f"[bold]Prefect UI[/bold] {server.url}")
    return server.url


def _deployments_and_worker(
    console: Console,
    stack: contextlib.ExitStack,
    api_url: str,
    settings: Settings,
    env: dict[str, str],
) -> bool:
    """Register the deployments on the demo's work pool and start one worker on it (stopped
    with ``stack``), so a run started from a deployment's form in the UI runs; False (and
    a line saying why) when that fails: the demo goes on, its own jobs need neither."""
    import httpx

    from verimail.runners.deploy import register_deployments
    from verimail.runners.worker import WorkerError, process_worker

    pool = settings.prefect_work_pool
    try:
        with console.status(f"registering the deployments and a worker on pool {pool!r}…"):
            names = register_deployments(pool, schedule=False)
            log = settings.data_dir / "prefect-worker.log"
            stack.enter_context(process_worker(api_url, pool, env, log))
    except (WorkerError, httpx.HTTPError, OSError) as exc:
        console.print(f"[yellow]No deployments' worker: {exc}[/yellow]")
        return False
    console.print(f"[bold]Deployments[/bold] {', '.join(names)}; a worker on pool {pool!r}")
    return True


def _worker_environment(settings: Settings, testbed_env: dict[str, str]) -> dict[str, str]:
    """The demo's settings as ``VERIMAIL_*`` variables, for the worker's flow runs."""
    return {
        **testbed_env,
        "VERIMAIL_DATA_DIR": str(settings.data_dir),
        "VERIMAIL_DATABASE_URL": str(settings.database_url),
        "VERIMAIL_JOB_RETRY_DELAY": str(settings.job_retry_delay),
        "VERIMAIL_JOB_RETRY_MAX_WAIT": str(settings.job_retry_max_wait),
    }


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def demo_command(
    port: int = typer.Option(
        8000, "--port", min=1, max=65535, help="Port of the API (on 127.0.0.1)."
    ),
    once: bool = typer.Option(
        False, "--once", "--no-serve", help="Exit after showing the requests."
    ),
    data_dir: Path = typer.Option(
        Path(".verimail/demo"), "--data-dir", help="Where the demo keeps its database."
    ),
    bulk: bool = typer.Option(True, "--bulk/--no-bulk", help="Also show a bulk CSV job."),
    prefect_ui: bool = typer.Option(
        True, "--prefect-ui/--no-prefect-ui", help="Serve the Prefect UI (runs, artifacts)."
    ),
    prefect_ui_port: int = typer.Option(
        DEMO_PREFECT_UI_PORT, "--prefect-ui-port", min=1, max=65535, help="Port of the Prefect UI."
    ),
    smtp_port: SmtpPortOption = None,
    dns_port: DnsPortOption = None,
) -> None:
    """Start the mail testbed and the API, show three verifications, keep serving."""
    from verimail.runners.prefect_ui import port_free
    from verimail.store.db import init_store
    from verimail.testbed.server import Testbed
    from verimail.testbed.world import load_world

    quiet_prefect()
    console = Console()
    host = "127.0.0.1"
    if not port_free(port, host):
        console.print(f"[red]Port {port} on {host} is in use; choose another with --port.[/red]")
        raise typer.Exit(2)
    data_dir = data_dir.resolve()
    world = load_world(DEFAULT_WORLD)
    testbed = Testbed(world, smtp_port=smtp_port, dns_port=dns_port)
    with start_or_exit(testbed, console, "the mail testbed") as tb:
        ns_ip, ns_port = tb.nameserver
        console.print(
            f"[bold]Testbed[/bold] {DEFAULT_WORLD.name}: DNS {ns_ip}:{ns_port}, "
            f"{len(world.hosts)} SMTP hosts on port {tb.smtp_port}"
        )
        from verimail.config import Settings

        settings = Settings(
            data_dir=data_dir,
            database_url=f"sqlite:///{data_dir / 'verimail.db'}",
            redis_url=None,
            **tb.settings_overrides(),
            **DEMO_RETRIES,
        )
        store = init_store(settings)
        try:
            key = demo_key(store, data_dir)
        finally:
            store.close()
        console.print(f"[bold]Data dir[/bold] {data_dir}")
        ui = contextlib.ExitStack()
        prefect_url = None
        if prefect_ui:
            prefect_url = _start_prefect_ui(console, ui, prefect_ui_port, data_dir)
        if prefect_url is not None:
            env = _worker_environment(settings, tb.environment())
            _deployments_and_worker(console, ui, f"{prefect_url}/api", settings, env)
        # SIGTERM ends the demo as Ctrl-C does. uvicorn captures it while serving and raises
        # it again once stopped, which killed the process there: "demo stopped" was never
        # printed and the testbed never closed.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            with ui:
                code = asyncio.run(
                    _serve_and_show(console, settings, host, port, key, once, bulk, prefect_url)
                )
        except KeyboardInterrupt:
            code = 0
        finally:
            signal.signal(signal.SIGTERM, previous)
        console.print("demo stopped", highlight=False)
    raise typer.Exit(code)
