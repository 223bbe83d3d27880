"""Email Finder: RCPTs per find before and after learning, and pattern coverage (issue 26).

``python -m bench.finder [--people 50]`` runs the finder in this process against an
in-process testbed whose hosts have Postfix's error limits (from the 10th rejection of a
session every reply waits a second; at the 20th, 421 and hang-up):

- a company of ``--people`` people who all use ``last.f`` (the first is Sean O'Connor),
  looked up as a finder CSV job does (one session for the domain, rows in order): before
  (8 probes, nothing learned), with the new pattern table only, and with learning; then as
  single lookups (each its own session, as the API makes them) with learning;
- a company with one person per pattern of ``testbed.people.LOCAL_PATTERNS``, each looked
  up once with the default settings and nothing learned.

RCPTs are counted by the testbed host (what the server saw), per lookup.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Table, add_output_args, command_text, publish
from verimail.config import Settings
from verimail.engine.core import Engine
from verimail.engine.finder import FinderResult, find_email
from verimail.engine.smtp.domain_session import DomainSession
from verimail.jobs.learned_patterns import StoredPatterns
from verimail.store.accounts import create_account
from verimail.store.db import init_store
from verimail.testbed.people import Person, company, finder_world, one_per_pattern
from verimail.testbed.server import Testbed
from verimail.testbed.world import POSTFIX_HARD_ERROR_LIMIT, POSTFIX_SOFT_ERROR_LIMIT

BEFORE_PROBES = 8  # finder_max_probes before issue 26


@dataclass
class Run:
    """One way of looking a company up: results and what the server saw per lookup."""

    name: str
    results: list[FinderResult] = field(default_factory=list)
    rcpts: list[int] = field(default_factory=list)
    sessions: int = 0
    peak_rejections: int = 0
    hangups: int = 0


async def _lookups(
    tb: Testbed,
    settings: Settings,
    people: list[Person],
    *,
    name: str,
    max_probes: int,
    patterns: StoredPatterns | None,
    shared_session: bool,
) -> Run:
    domain = people[0].email.rpartition("@")[2]
    host = f"mx.{domain}"
    tb.reset_stats()
    engine = Engine(settings)
    run = Run(name)
    session = DomainSession(engine.prober) if shared_session else None
    try:
        for person in people:
            before = tb.host_stats(host).rcpt_to
            result = await find_email(
                engine, person.first, person.last, domain,
                max_probes=max_probes, session=session, patterns=patterns,
            )  # fmt: skip
            run.results.append(result)
            run.rcpts.append(tb.host_stats(host).rcpt_to - before)
    finally:
        if session is not None:
            await session.close()
    tb.wait_idle(timeout=30)
    stats = tb.host_stats(host)
    run.sessions, run.peak_rejections, run.hangups = (
        stats.sessions,
        stats.peak_session_rejections,
        stats.hangups,
    )
    return run


def _found(run: Run, people: list[Person]) -> int:
    return sum(r.found and r.email == p.email for r, p in zip(run.results, people, strict=True))


async def _measure(people_n: int, tmp: Path) -> dict[str, Any]:
    people = company("lastf.test", "last.f", people_n)
    coverage = one_per_pattern("patterns.test")
    with Testbed(finder_world([*people, *coverage])) as tb:
        settings = Settings(data_dir=tmp, prefect_warm_up=False, **tb.settings_overrides())
        store = init_store(settings)
        try:
            own = settings.model_copy(update={"finder_pattern_scope": "account"})

            def memory() -> StoredPatterns:  # a fresh account, its own finds only: from zero
                account = create_account(store.engine, settings)
                return StoredPatterns(store, account.id, own)

            cap = settings.finder_max_probes
            ways = [  # (name, probes, learning, one session for the domain)
                (f"before: {BEFORE_PROBES} probes (the old default), no learning (CSV job)",
                 BEFORE_PROBES, False, True),
                (f"new table, {cap} probes, no learning (CSV job)", cap, False, True),
                (f"after: {cap} probes, learning (CSV job)", cap, True, True),
                (f"after: {cap} probes, learning (single lookups)", cap, True, False),
            ]  # fmt: skip
            company_runs = [
                await _lookups(
                    tb,
                    settings,
                    people,
                    name=name,
                    max_probes=probes,
                    patterns=memory() if learning else None,
                    shared_session=shared,
                )
                for name, probes, learning, shared in ways
            ]
            per_pattern = await _lookups(
                tb, settings, coverage, name="one person per pattern", max_probes=cap,
                patterns=None, shared_session=False,
            )  # fmt: skip
        finally:
            store.close()
    return {"people": people, "coverage": coverage, "runs": company_runs,
            "per_pattern": per_pattern, "cap": cap}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=50, help="people at the company (≤ 50)")
    add_output_args(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="verimail-bench-finder-") as tmp:
        data = asyncio.run(_measure(args.people, Path(tmp)))
    people, cap = data["people"], data["cap"]
    n = len(people)

    learning = Table(
        f"{n} people at a last.f company (RCPTs as the server counted them)",
        ["run", "found", "RCPTs, first person", "RCPTs per person after (mean, max)",
         "RCPTs in all", "sessions", "most rejections in a session", "hang-ups"],
    )  # fmt: skip
    for run in data["runs"]:
        rest = run.rcpts[1:]
        learning.add(
            run.name,
            f"{_found(run, people)}/{n}",
            run.rcpts[0],
            f"{sum(rest) / len(rest):.2f}, {max(rest)}" if rest else "–",
            sum(run.rcpts),
            run.sessions,
            run.peak_rejections,
            run.hangups,
        )

    per = data["per_pattern"]
    coverage_table = Table(
        "One person per pattern, default settings, nothing learned",
        ["pattern", "person", "found", "RCPTs (incl. the catch-all probe)"],
    )
    for person, result, rcpts in zip(data["coverage"], per.results, per.rcpts, strict=True):
        ok = result.found and result.email == person.email
        coverage_table.add(
            person.pattern, f"{person.first} {person.last}", "yes" if ok else "**no**", rcpts
        )
    found_all = _found(per, data["coverage"])
    every_run = [*data["runs"], per]
    max_rcpts = max(max(r.rcpts) for r in every_run)
    peak = max(r.peak_rejections for r in every_run)
    hangups = sum(r.hangups for r in every_run)
    after, single = data["runs"][2], data["runs"][3]
    reading = [
        f"Before: with {BEFORE_PROBES} probes and no `last.f` in reach, nobody at the company "
        f"was found ({_found(data['runs'][0], people)}/{n}); each person cost "
        f"{data['runs'][0].rcpts[1]} RCPTs. The new table alone finds everyone, at "
        f"{data['runs'][1].rcpts[1]} RCPTs a person (`last.f` is the 11th candidate).",
        f"After, as a CSV job: the first person costs {after.rcpts[0]} RCPTs (the catch-all "
        f"probe and 11 candidates), every other {max(after.rcpts[1:])} — "
        f"{sum(after.rcpts)} RCPTs for {n} finds instead of {sum(data['runs'][1].rcpts)}. "
        f"As single lookups (the API), each later person costs the catch-all probe and one "
        f"candidate ({max(single.rcpts[1:])}). (Both runs learn from zero: each account counts "
        "its own finds here; with the default scope `all`, a domain another account has "
        "already taught costs that from the first person on.)",
        f"One person per pattern: {found_all}/{len(data['coverage'])} found with the default "
        f"cap of {cap} probes and nothing learned.",
        f"The cap holds: the most RCPTs one lookup sent in any run was {max_rcpts} (cap "
        f"{cap} candidates + 1 catch-all probe). No session reached the server's soft error "
        f"limit ({POSTFIX_SOFT_ERROR_LIMIT}) let alone its hard limit "
        f"({POSTFIX_HARD_ERROR_LIMIT}): at most {peak} rejections in a session, {hangups} "
        "hang-ups.",
    ]
    publish(
        args,
        title="Email Finder: patterns and learning",
        command=command_text("bench.finder", argv),
        tables=[learning, coverage_table],
        reading=reading,
        extra={"max_rcpts_per_lookup": max_rcpts, "peak_session_rejections": peak},
    )
    return {"max_rcpts": max_rcpts, "peak": peak}


if __name__ == "__main__":
    main()
