"""Email Finder: a domain's learned local-part pattern and how well it is established.

Pure data, no I/O: the counts come from the store (``store/patterns.py``) through a
:class:`PatternMemory` the caller hands to ``find_email`` (the API and the flows own the
database; this layer does not import it).

Confidence of a learned pattern: ``share × finds / (finds + 1)``, where ``share`` is the
pattern's part of all finds at the domain. One find gives 0.5, five 0.83, twenty 0.95; a
domain whose finds split 10/10 between two patterns gives each 0.48. It says how sure we
are that the *next* person at the domain uses the pattern, not that an address exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


def learned_confidence(finds: int, total: int) -> float:
    """``finds / total × finds / (finds + 1)``, two decimals; 0 without finds."""
    if finds <= 0 or total <= 0:
        return 0.0
    return round(finds / total * finds / (finds + 1), 2)


@dataclass(frozen=True)
class DomainPattern:
    """What a domain's finds so far say about its local-part pattern."""

    domain: str
    counts: Mapping[str, int] = field(default_factory=dict)  # base pattern -> finds

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def ranked(self) -> list[str]:
        """Patterns by finds, most first (ties: by name, so the order is stable)."""
        return sorted(self.counts, key=lambda p: (-self.counts[p], p))

    @property
    def pattern(self) -> str | None:
        """The domain's most found pattern, or None before any find."""
        ranked = self.ranked
        return ranked[0] if ranked else None

    @property
    def finds(self) -> int:
        """Finds of :attr:`pattern`."""
        return self.counts.get(self.pattern or "", 0)

    @property
    def confidence(self) -> float:
        return self.confidence_of(self.pattern or "")

    def confidence_of(self, pattern: str) -> float:
        return learned_confidence(self.counts.get(pattern, 0), self.total)

    def with_find(self, pattern: str) -> DomainPattern:
        counts = dict(self.counts)
        counts[pattern] = counts.get(pattern, 0) + 1
        return DomainPattern(self.domain, counts)


class PatternMemory(Protocol):
    """Where a lookup reads a domain's learned pattern and records a find's pattern."""

    async def load(self, domain: str) -> DomainPattern: ...

    async def known_valid(self, domain: str) -> frozenset[str]:
        """Local parts at ``domain`` the caller's account has verified as valid."""
        ...

    async def record(self, domain: str, pattern: str) -> None: ...
