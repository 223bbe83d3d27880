"""People with known addresses, for Email Finder worlds: a company where everyone follows
one local-part pattern, and a company with one person per pattern.

The addresses are written here from the pattern's meaning, independently of the finder's
own pattern table (``engine/finder_patterns.py``), so a world built from them tests the
finder rather than repeating it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from verimail.testbed.world import (
    _FIRST,
    _LAST,
    DomainSpec,
    HostBehaviour,
    HostSpec,
    World,
    _words,
    postfix_limits,
)

# What each pattern makes of (first, surname), both lower-case ASCII already.
LOCAL_PATTERNS: dict[str, Callable[[str, str], str]] = {
    "first.last": lambda f, s: f"{f}.{s}",
    "flast": lambda f, s: f"{f[0]}{s}",
    "first": lambda f, s: f,
    "firstl": lambda f, s: f"{f}{s[0]}",
    "f.last": lambda f, s: f"{f[0]}.{s}",
    "first_last": lambda f, s: f"{f}_{s}",
    "first-last": lambda f, s: f"{f}-{s}",
    "last.first": lambda f, s: f"{s}.{f}",
    "lastf": lambda f, s: f"{s}{f[0]}",
    "last.f": lambda f, s: f"{s}.{f[0]}",
    "last_first": lambda f, s: f"{s}_{f}",
    "last": lambda f, s: s,
    "fl": lambda f, s: f"{f[0]}{s[0]}",
    "firstlast": lambda f, s: f"{f}{s}",
    "first.l": lambda f, s: f"{f}.{s[0]}",
    "lastfirst": lambda f, s: f"{s}{f}",
    "l.first": lambda f, s: f"{s[0]}.{f}",
    "f_last": lambda f, s: f"{f[0]}_{s}",
    "last-first": lambda f, s: f"{s}-{f}",
}


_FIRSTS = _FIRST
_LASTS = _LAST + _words(  # (50 distinct surnames: a company of 50)
    "abbott barton carver dalton ellis fowler garner hayes ingram jensen keller lawson "
    "mercer norris oakley parker quincy rhodes sutton thorne upton vaughn warren yates "
    "zeller hobbs"
)


@dataclass(frozen=True)
class Person:
    """A person as a finder is given them, and the address they really have."""

    first: str
    last: str
    email: str
    pattern: str


def company(domain: str, pattern: str, size: int) -> list[Person]:
    """``size`` people (at most 50, distinct surnames) whose addresses follow ``pattern``;
    the first is Sean O'Connor, whose apostrophe the finder must drop."""
    if not 1 <= size <= len(_LASTS):
        raise ValueError(f"size must be 1..{len(_LASTS)}")
    build = LOCAL_PATTERNS[pattern]
    people = [Person("Sean", "O'Connor", f"{build('sean', 'oconnor')}@{domain}", pattern)]
    for i in range(size - 1):
        first, last = _FIRSTS[i % len(_FIRSTS)], _LASTS[i]
        people.append(
            Person(first.title(), last.title(), f"{build(first, last)}@{domain}", pattern)
        )
    return people


def one_per_pattern(domain: str) -> list[Person]:
    """One person per pattern of :data:`LOCAL_PATTERNS`, each the only one with that
    pattern (and with a name no other person shares)."""
    people = []
    for i, (pattern, build) in enumerate(LOCAL_PATTERNS.items()):
        first, last = _FIRSTS[i], _LASTS[-1 - i]
        email = f"{build(first, last)}@{domain}"
        people.append(Person(first.title(), last.title(), email, pattern))
    return people


def finder_world(
    people: Iterable[Person], behaviour: Callable[..., HostBehaviour] = postfix_limits
) -> World:
    """A world where each domain of ``people`` has its own host (Postfix's error limits by
    default) holding exactly their mailboxes."""
    boxes: dict[str, set[str]] = {}
    for person in people:
        boxes.setdefault(person.email.rpartition("@")[2], set()).add(person.email)
    hosts = [HostSpec(f"mx.{d}", behaviour(mailboxes=b)) for d, b in boxes.items()]
    domains = [DomainSpec(d, mx=[(10, f"mx.{d}")]) for d in boxes]
    return World.of(hosts, domains)
