"""``verimail doctor``: can this machine verify over SMTP? One line a check, ok or fail, and
on failure one sentence on what to do (the checks: ``engine/smtp/egress_check.py``)."""

from __future__ import annotations

import asyncio
import json

import typer
from rich.console import Console


def doctor_command(
    as_json: bool = typer.Option(False, "--json", help="Print the checks as one JSON document."),
) -> None:
    """Check DNS, the HELO name and port 25 through each egress; exit 1 when an SMTP egress
    fails (VERIMAIL_DOCTOR_DOMAIN: the domain whose mail server must greet us)."""
    from verimail.config import get_settings  # (here: --help loads no settings or engine)
    from verimail.engine import run_checks

    settings = get_settings()
    checks = asyncio.run(run_checks(settings))
    failed_smtp = any(not c.ok and c.egress is not None for c in checks)
    if as_json:
        print(json.dumps({"ok": not failed_smtp, "checks": [c.as_dict() for c in checks]}))
    else:
        console = Console(soft_wrap=True, highlight=False)
        for check in checks:
            mark = "[green]ok  [/green]" if check.ok else "[red]fail[/red]"
            console.print(f"{mark} {check.name}: ", end="")
            line = check.detail if check.ok else f"{check.detail} — {check.advice or ''}"
            console.print(line.strip(), markup=False)
    if failed_smtp:
        raise typer.Exit(1)
