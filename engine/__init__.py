"""The verification engine, a plain library: syntax, lists, DNS facts, the SMTP prober
(``smtp/``), verdict and the finder. No Prefect, HTTP, database, typer or Rich: a script
verifies an address in three lines::

    from verimail.config import Settings
    from verimail.engine import Engine
    result = asyncio.run(Engine(Settings()).verify("alice@example.com"))

This module is the one place that names what code outside ``engine/`` uses
(``tests/test_architecture.py`` holds the rest of the house to it). The names load lazily
(PEP 562): importing ``verimail.engine`` imports none of the engine, so a command line
that only prints its help does not pay for the resolver, the prober or Pydantic models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the submodule that defines it.
_HOMES: dict[str, str] = {
    # verifying: one engine per process and settings
    "BatchResult": "core",
    "Engine": "core",
    "EngineStats": "prepared",
    "Prepared": "prepared",
    "SmtpShare": "prepared",
    "forget_engine": "core",
    "shared_engine": "core",
    # the prober's host groups and what it found of them
    "GroupResult": "smtp.findings",
    "HostGroup": "smtp.findings",
    # the finder
    "DomainSession": "smtp.domain_session",
    "FinderInputError": "finder",
    "FinderResult": "finder",
    "NameField": "finder",
    "check_name_part": "finder",
    "find_email": "finder",
    "find_email_within": "finder",
    "normalise_finder_domain": "finder",
    "DomainPattern": "finder_learned",
    "PatternMemory": "finder_learned",
    # SMTP politeness: a request a person waits for goes first; the one lease client
    "urgent": "smtp.host_slots",
    "LEASE_SECONDS": "leases",
    "Leases": "leases",
    # where SMTP sessions leave from (direct, SOCKS5 proxies) and their routes
    "Egress": "smtp.egress",
    "EgressFailed": "smtp.egress_kinds.failed",
    "Routes": "smtp.egress",
    "configured_egresses": "smtp.egress",
    "open_socket": "smtp.egress",
    # can this installation verify over SMTP (verimail doctor, the health's smtp_egress)
    "Check": "smtp.egress_check",
    "EgressMonitor": "smtp.egress_check",
    "run_checks": "smtp.egress_check",
    # the network guard
    "DomainResolver": "dns_facts",
    "IPNetwork": "netguard",
    "connect_allowed": "netguard",
    # counters for operators
    "ENGINE_REGISTRY": "metrics",
    "observe_queue_wait": "metrics",
}

__all__ = [
    "ENGINE_REGISTRY",
    "LEASE_SECONDS",
    "BatchResult",
    "Check",
    "DomainPattern",
    "DomainResolver",
    "DomainSession",
    "Egress",
    "EgressFailed",
    "EgressMonitor",
    "Engine",
    "EngineStats",
    "FinderInputError",
    "FinderResult",
    "GroupResult",
    "HostGroup",
    "IPNetwork",
    "Leases",
    "NameField",
    "PatternMemory",
    "Prepared",
    "Routes",
    "SmtpShare",
    "check_name_part",
    "configured_egresses",
    "connect_allowed",
    "find_email",
    "find_email_within",
    "forget_engine",
    "normalise_finder_domain",
    "observe_queue_wait",
    "open_socket",
    "run_checks",
    "shared_engine",
    "urgent",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its submodule on first use, then keep it here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from verimail.engine.core import BatchResult, Engine, forget_engine, shared_engine
    from verimail.engine.dns_facts import DomainResolver
    from verimail.engine.finder import (
        FinderInputError,
        FinderResult,
        NameField,
        check_name_part,
        find_email,
        find_email_within,
        normalise_finder_domain,
    )
    from verimail.engine.finder_learned import DomainPattern, PatternMemory
    from verimail.engine.leases import LEASE_SECONDS, Leases
    from verimail.engine.metrics import ENGINE_REGISTRY, observe_queue_wait
    from verimail.engine.netguard import IPNetwork, connect_allowed
    from verimail.engine.prepared import EngineStats, Prepared, SmtpShare
    from verimail.engine.smtp.domain_session import DomainSession
    from verimail.engine.smtp.egress import Egress, Routes, configured_egresses, open_socket
    from verimail.engine.smtp.egress_check import Check, EgressMonitor, run_checks
    from verimail.engine.smtp.egress_kinds.failed import EgressFailed
    from verimail.engine.smtp.findings import GroupResult, HostGroup
    from verimail.engine.smtp.host_slots import urgent
