"""``verimail doctor``: can this machine verify over SMTP? One line a check, ok or fail, and
on failure one sentence on what to do (the checks: ``engine/smtp/egress_check.py``).

Two things the checks alone got wrong for a new user:

- the HELO name left at its default (``verimail.localhost``, which resolves nowhere) failed
  with "set VERIMAIL_SMTP_HELO_NAME to this machine's public name": the advice now names
  the value — this machine's own name when it resolves, else what such a name needs;
- against the testbed (the ``export`` line of ``verimail testbed up`` or the demo), the
  probe domain ``gmail.com`` does not exist and the HELO name is nobody's: the doctor now
  says it talks to the testbed, probes the demo world's ``acme.test`` (unless
  ``VERIMAIL_DOCTOR_DOMAIN`` says otherwise) and does not fail the default HELO name there
  (the testbed's servers do not look it up).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
from typing import Any

import typer
from rich.console import Console

DEFAULT_HELO = "verimail.localhost"
TESTBED_DOMAIN = "acme.test"  # the demo world's domain whose mail servers greet normally


def doctor_command(
    as_json: bool = typer.Option(False, "--json", help="Print the checks as one JSON document."),
) -> None:
    """Check DNS, the HELO name and port 25 through each egress; exit 1 when an SMTP egress
    fails (VERIMAIL_DOCTOR_DOMAIN: the domain whose mail server must greet us)."""
    from verimail.config import get_settings  # (here: --help loads no settings or engine)

    checks, testbed = asyncio.run(_checks(get_settings()))
    failed_smtp = any(not c.ok and c.egress is not None for c in checks)
    if as_json:
        print(json.dumps({"ok": not failed_smtp, "checks": [c.as_dict() for c in checks]}))
    else:
        console = Console(soft_wrap=True, highlight=False)
        if testbed and "VERIMAIL_DOCTOR_DOMAIN" not in os.environ:
            console.print(
                f"(the DNS is the testbed's, on loopback: probing {TESTBED_DOMAIN} of its "
                "world; VERIMAIL_DOCTOR_DOMAIN chooses another)",
                markup=False,
            )
        for check in checks:
            mark = "[green]ok  [/green]" if check.ok else "[red]fail[/red]"
            console.print(f"{mark} {check.name}: ", end="")
            line = check.detail if check.ok else f"{check.detail} — {check.advice or ''}"
            console.print(line.strip(), markup=False)
    if failed_smtp:
        raise typer.Exit(1)


async def _checks(settings: Any) -> tuple[list[Any], bool]:
    """Every check (against the testbed's world when the DNS is a testbed's), and whether
    it was the testbed."""
    from verimail.engine import run_checks

    testbed = await _on_the_testbed(settings)
    if testbed and "VERIMAIL_DOCTOR_DOMAIN" not in os.environ:
        settings = settings.model_copy(update={"doctor_domain": TESTBED_DOMAIN})
    checks = await run_checks(settings)
    return [await _helo_advice(settings, check, testbed) for check in checks], testbed


async def _on_the_testbed(settings: Any) -> bool:
    """Whether the resolver is a testbed's: every nameserver on loopback, and it knows the
    demo world's mail host (``.test`` is reserved: no real resolver answers for it)."""
    from verimail.engine import DomainResolver

    hosts = [host for host, _ in settings.nameserver_addresses()]
    if not hosts or not all(ipaddress.ip_address(host).is_loopback for host in hosts):
        return False
    ours, _ = await DomainResolver(settings).addresses(f"mx1.{TESTBED_DOMAIN}")
    return bool(ours)


async def _helo_advice(settings: Any, check: Any, testbed: bool) -> Any:
    """The HELO check, with the exact value to set when the default name fails."""
    from dataclasses import replace

    if check.name != "helo" or check.ok or "VERIMAIL_SMTP_HELO_NAME" in os.environ:
        return check
    if testbed:
        return replace(
            check,
            ok=True,
            detail=f"{DEFAULT_HELO} (the testbed's servers do not look the HELO name up; "
            "on the internet set VERIMAIL_SMTP_HELO_NAME: docs/egress.md)",
        )
    from verimail.engine import DomainResolver

    name = socket.getfqdn()
    addresses: tuple[str, ...] = ()
    if "." in name and not name.endswith((".localhost", ".localdomain", ".local")):
        addresses, _ = await DomainResolver(settings).addresses(name)
    if addresses:
        advice = (
            f"set VERIMAIL_SMTP_HELO_NAME={name} (this machine's name; it resolves to "
            f"{', '.join(addresses[:3])}), ideally also the reverse DNS name of that "
            "address (docs/egress.md)."
        )
    else:
        advice = (
            f"this machine's own name ({name}) does not resolve either: set "
            "VERIMAIL_SMTP_HELO_NAME=<a name with an A record for this machine's public "
            "address, and that address's reverse DNS pointing back>, e.g. "
            "VERIMAIL_SMTP_HELO_NAME=mail.example.com (docs/egress.md)."
        )
    return replace(check, advice=advice)
