"""``verimail testbed ...``: run the simulated mail world in the foreground, to poke at by hand.

``verimail testbed up`` prints where everything listens and the ``export VERIMAIL_...`` line
that points the CLI or API of another shell at it, then serves until Ctrl-C (or SIGTERM), so
``dig @<nameserver> -p <port> acme.test MX`` and ``swaks``/``telnet`` sessions work against it.
"""

from __future__ import annotations

import shlex
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

import verimail

if TYPE_CHECKING:
    from verimail.testbed.server import Testbed
    from verimail.testbed.world import HostSpec, World

# The servers (aiosmtpd, dnspython) and the world's YAML are imported by the commands that
# use them: ``verimail --help`` loads this module too.

app = typer.Typer(
    help="The simulated mail world (DNS + SMTP on loopback) that tests and the demo use.",
    no_args_is_help=True,
    add_completion=False,
)

WORLDS_DIR = Path(verimail.__file__).parent / "data" / "worlds"
DEFAULT_WORLD = WORLDS_DIR / "demo.yaml"
READY_LINE = "testbed ready: nameserver={ns} smtp_port={port}"

# The testbed's ports, as `testbed up` and `demo` take them.
SmtpPortOption = Annotated[
    int | None,
    typer.Option(
        "--smtp-port",
        min=0,
        max=65535,
        help="SMTP port of every host (25 as root, else 2525; 0: a free one).",
    ),
]
DnsPortOption = Annotated[
    int | None,
    typer.Option(
        "--dns-port", min=0, max=65535, help="DNS port (53 as root, else 5353; 0: a free one)."
    ),
]


def start_or_exit(testbed: Testbed, console: Console, what: str) -> Testbed:
    """``testbed`` started; if it cannot be (its ports held on every loopback address), one
    line naming the ports and the options that choose others, and exit status 1."""
    from verimail.testbed.server import TestbedError

    try:
        return testbed.start()
    except TestbedError as exc:
        console.print(f"cannot start {what}: {exc} (--dns-port, --smtp-port)", markup=False)
        raise typer.Exit(1) from None


def resolve_world_path(world: Path | None) -> Path:
    """A path as given, or a shipped world's name (``demo`` -> ``data/worlds/demo.yaml``)."""
    if world is None:
        return DEFAULT_WORLD
    if world.exists():
        return world
    shipped = WORLDS_DIR / f"{world.name.removesuffix('.yaml')}.yaml"
    if shipped.exists():
        return shipped
    raise typer.BadParameter(f"no world file {world} (shipped: {sorted(_shipped())})")


def _shipped() -> list[str]:
    return [p.stem for p in WORLDS_DIR.glob("*.yaml")]


def describe_behaviour(host: HostSpec) -> str:
    """A one-line summary of what differs from a plain MTA, for the hosts table."""
    from verimail.testbed.world import HostBehaviour

    if host.address is not None:
        return "DNS only (no server)"
    b, plain = host.behaviour, HostBehaviour()
    parts: list[str] = []
    if b.mailboxes:
        boxes = sorted(b.mailboxes)
        shown = ", ".join(boxes[:6]) + (f" (+{len(boxes) - 6})" if len(boxes) > 6 else "")
        parts.append(f"mailboxes: {shown}")
    if b.full_mailboxes:
        parts.append("full: " + ", ".join(sorted(b.full_mailboxes)))
    for flag in ("accept_all", "block", "refuse_connections", "greeting_421", "starttls"):
        if getattr(b, flag):
            parts.append(flag)
    if b.pipelining:
        parts.append("pipelining")
    for key in (
        "greylist_tries",
        "greylist_delay",
        "reply_delay",
        "tarpit_delay",
        "disconnect_after_rejections",
        "max_rcpts_per_session",
    ):
        value = getattr(b, key)
        if value != getattr(plain, key):
            parts.append(f"{key}={value}")
    return "; ".join(parts) or "rejects every recipient"


def describe_domain_mx(world: World, name: str) -> str:
    dom = world.domains[name]
    if dom.servfail:
        return "SERVFAIL"
    if dom.is_null_mx:
        return "null MX (0 .)"
    if dom.mx:
        return ", ".join(f"{pref} {host}" for pref, host in sorted(dom.mx))
    if dom.a:
        return "implicit MX: A " + ", ".join(dom.a)
    return "no MX, no A"


def print_world(console: Console, tb: Testbed) -> None:
    """The hosts and domains tables, with live addresses."""
    world = tb.world
    hosts = Table(title="SMTP hosts")
    for col in ("host", "address", "port", "behaviour"):
        hosts.add_column(col, overflow="fold")
    for host in world.hosts.values():
        if host.address is not None:
            port = "-"
        elif host.behaviour.refuse_connections:
            port = f"{tb.smtp_port} (refused)"
        else:
            port = str(tb.smtp_port)
        hosts.add_row(host.name, tb.address_of(host.name), port, describe_behaviour(host))
    domains = Table(title="Domains")
    for col in ("domain", "MX", "TXT"):
        domains.add_column(col, overflow="fold")
    for name in world.domains:
        domains.add_row(name, describe_domain_mx(world, name), "; ".join(world.domains[name].txt))
    console.print(hosts)
    console.print(domains)


def export_line(tb: Testbed) -> str:
    """``export VERIMAIL_...=...`` for every setting that points verimail at ``tb``."""
    pairs = (f"{name}={shlex.quote(value)}" for name, value in tb.environment().items())
    return "export " + " ".join(pairs)


@app.command()
def up(
    world: Path | None = typer.Option(
        None, "--world", help="World YAML file or a shipped world's name (default: demo)."
    ),
    smtp_port: SmtpPortOption = None,
    dns_port: DnsPortOption = None,
) -> None:
    """Start the testbed and serve until Ctrl-C."""
    import yaml

    from verimail.testbed.server import Testbed
    from verimail.testbed.world import load_world

    path = resolve_world_path(world)
    try:
        loaded = load_world(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError, TypeError) as exc:
        # (the world's own checks raise ValueError naming the bad entry; YAML errors say where)
        raise typer.BadParameter(f"cannot use {path}: {exc}", param_hint="--world") from None
    console = Console()
    stop = threading.Event()
    testbed = Testbed(loaded, smtp_port=smtp_port, dns_port=dns_port)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with start_or_exit(testbed, console, "the testbed") as tb:
            ns_ip, ns_port = tb.nameserver
            console.print(f"[bold]World[/bold] {path}")
            console.print(f"[bold]Nameserver[/bold] {ns_ip} port {ns_port} (UDP and TCP)")
            print_world(console, tb)
            example = next(iter(loaded.domains), "example.test")
            console.print(f"Try: dig @{ns_ip} -p {ns_port} {example} MX", soft_wrap=True)
            # The addresses change on every start (a free loopback address and port), so the
            # exact line to paste into another shell is printed, plain and unwrapped.
            console.print(
                "Point verimail in another shell at this testbed (verify, bulk, serve):",
                highlight=False,
            )
            console.print(export_line(tb), soft_wrap=True, markup=False, highlight=False)
            # One plain, unwrapped line that scripts (and our tests) wait for.
            console.print(
                READY_LINE.format(ns=f"{ns_ip}:{ns_port}", port=tb.smtp_port),
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
            console.file.flush()
            stop.wait()
            console.print("stopping testbed", highlight=False)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
