"""Reference lists: disposable domains, free providers, role local parts, typo suggestions.

Pure look-ups, no network. The lists are loaded once and shared: ``from_settings`` caches
one ``ReferenceLists`` per distinct combination of the list settings, so every job in a
process reuses the same sets while tests can still build differently-configured ones.

Sources:

* disposable domains: the ``disposable-email-domains`` package (its ``blocklist`` minus its
  ``allowlist``), plus ``settings.disposable_extra``, minus ``settings.disposable_allow``;
* free providers: ``data/free_providers.txt`` or ``settings.free_providers_file``;
* role names: ``data/role_names.txt`` or ``settings.role_names_file``;
* typo targets: ``data/popular_domains.txt``.

List files hold one entry a line; ``#`` starts a comment (each shipped file names its
sources in its header).
"""

from __future__ import annotations

import contextlib
import re
from functools import lru_cache
from pathlib import Path

import idna
from disposable_email_domains import allowlist as _PKG_ALLOW
from disposable_email_domains import blocklist as _PKG_BLOCK

import verimail
from verimail.config import Settings

DATA_DIR = Path(verimail.__file__).parent / "data"
FREE_PROVIDERS_FILE = DATA_DIR / "free_providers.txt"
ROLE_NAMES_FILE = DATA_DIR / "role_names.txt"
POPULAR_DOMAINS_FILE = DATA_DIR / "popular_domains.txt"

_SEPARATORS = re.compile(r"[._\-]")
SUGGESTION_CACHE_SIZE = 100_000  # domains whose typo suggestion is remembered


def normalise_domain(domain: str) -> str:
    """Lower-case ASCII form of a domain, so list look-ups match however it was typed."""
    text = domain.strip().lower().rstrip(".")
    for prefix in ("@", "*."):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if not text.isascii():
        with contextlib.suppress(idna.IDNAError):
            text = idna.encode(text, uts46=True).decode("ascii")
    return text


def _role_key(name: str) -> str:
    return _SEPARATORS.sub("", name)


_LONGEST_ROLE = 64  # (a local part is at most 64 octets: no role name is longer)


@lru_cache(maxsize=32)
def read_list(path: Path) -> frozenset[str]:
    """Entries of a list file (lower-cased, comments and blanks dropped), read once."""
    entries: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        item = line.split("#", 1)[0].strip().lower()
        if item:
            entries.add(item)
    return frozenset(entries)


@lru_cache(maxsize=1)
def _popular_domains() -> tuple[str, ...]:
    """Typo targets in file order (earlier = more popular, wins ties)."""
    seen: dict[str, None] = {}
    for line in POPULAR_DOMAINS_FILE.read_text(encoding="utf-8").splitlines():
        item = line.split("#", 1)[0].strip().lower()
        if item:
            seen.setdefault(item, None)
    return tuple(seen)


def osa_distance(a: str, b: str, limit: int | None = None) -> int:
    """Damerau–Levenshtein distance (optimal string alignment: adjacent swaps cost 1).

    With ``limit``, returns ``limit + 1`` as soon as the distance must exceed it.
    """
    if limit is not None and abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if limit is not None and min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


class ReferenceLists:
    """The look-up sets of one configuration. Build with ``from_settings``."""

    __slots__ = ("_allow", "_block", "_free", "_popular", "_roles", "_suggestions")

    def __init__(
        self,
        *,
        disposable: frozenset[str],
        disposable_allow: frozenset[str],
        free: frozenset[str],
        roles: frozenset[str],
        popular: tuple[str, ...],
    ) -> None:
        self._block = disposable - disposable_allow
        self._allow = disposable_allow
        self._free = free
        self._roles = frozenset(_role_key(r) for r in roles if _role_key(r))
        self._popular = popular
        # did_you_mean by domain: one distance scan per domain, not per address (a bulk
        # job repeats each domain many times; the scan is ~0.3 ms of pure Python).
        self._suggestions: dict[str, str | None] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> ReferenceLists:
        """The lists for these settings; one shared instance per distinct list settings."""
        return _build(
            tuple(sorted({normalise_domain(d) for d in settings.disposable_extra} - {""})),
            tuple(sorted({normalise_domain(d) for d in settings.disposable_allow} - {""})),
            settings.free_providers_file or FREE_PROVIDERS_FILE,
            settings.role_names_file or ROLE_NAMES_FILE,
        )

    # --- disposable --------------------------------------------------------------

    def is_disposable(self, domain: str) -> bool:
        """True for a listed disposable domain or any subdomain of one.

        The most specific match wins: walking from the full domain up to its
        registrable parents, the first name found in the allow list makes it not
        disposable, the first found in the block list makes it disposable. A likely typo
        of a major provider (:meth:`typo_of`) is never disposable: the bundled list holds
        such domains (``gmial.com``, ``hotmial.com``), and calling them throwaway services
        hid the typo from the person who made it.
        """
        if self.typo_of(domain) is not None:
            return False
        labels = normalise_domain(domain).split(".")
        for start in range(len(labels) - 1):  # never the bare TLD
            candidate = ".".join(labels[start:])
            if candidate in self._allow:
                return False
            if candidate in self._block:
                return True
        return False

    # --- free providers ---------------------------------------------------------

    def is_free(self, domain: str) -> bool:
        """True when the domain itself is a free mailbox provider (exact match: a
        company's subdomain of a provider is not a free mailbox)."""
        return normalise_domain(domain) in self._free

    # --- role names ---------------------------------------------------------------

    def is_role(self, local: str) -> bool:
        """True for a role local part such as ``info``, ``No-Reply`` or ``sales+eu``.

        Case-insensitive; a ``+tag`` and surrounding quotes are ignored, and the
        separators ``.`` ``_`` ``-`` do not count (``no.reply`` = ``noreply``). Also true
        when trailing digits follow a role (``support2``) or when every separated part
        is itself a role (``info.team``, ``sales-support``), written together too
        (``salesteam``, ``itsupport``: the finder's ``firstlast`` pattern joins "Sales
        Team" so), but not for a person plus a role (``john.sales``).
        """
        text = local.strip()
        if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
            text = text[1:-1]
        text = text.casefold().split("+", 1)[0]
        key = _role_key(text)
        if not key:
            return False
        if key in self._roles or key.rstrip("0123456789") in self._roles:
            return True
        parts = [p for p in _SEPARATORS.split(text) if p]
        if len(parts) > 1 and all(_role_key(p) in self._roles for p in parts):
            return True
        return self._joined_roles(key.rstrip("0123456789"))

    def _joined_roles(self, key: str) -> bool:
        """``key``, not a role itself, is role names written together (a word break over
        the list), one of them at least 4 letters long: short roles alone (``pr`` + ``it``,
        ``hi`` + ``all``) spell names too often (Prit, Hiall)."""
        n = len(key)
        # spelt[i]: None when no roles spell key[:i]; else whether a 4+ letter one was used
        spelt: list[bool | None] = [False] + [None] * n
        for end in range(1, n + 1):
            for start in range(max(0, end - _LONGEST_ROLE), end):
                before = spelt[start]
                if before is None or key[start:end] not in self._roles:
                    continue
                long_ = before or end - start >= 4
                spelt[end] = long_ or bool(spelt[end])
        return n > 0 and spelt[n] is True

    # --- typo suggestions -----------------------------------------------------------

    def did_you_mean(self, email_or_domain: str) -> str | None:
        """A corrected address (or domain, if given a domain) for a likely typo.

        Compares the domain with the popular list by Damerau–Levenshtein distance:
        at most 1 edit, or 2 for targets of 10+ characters. For short provider names
        (``aol``, ``me``, ``live``, ``gmx``...) the name must match exactly and only the
        rest may differ, since one edit there usually lands on a different real domain.
        Never suggests for a domain that is itself popular or a free provider. Ties go
        to the more popular domain.
        """
        text = email_or_domain.strip()
        local, at, domain = text.rpartition("@")
        domain = domain.lower().rstrip(".")
        try:
            target = self._suggestions[domain]
        except KeyError:
            target = self._suggest(domain)
            if len(self._suggestions) >= SUGGESTION_CACHE_SIZE:
                self._suggestions.clear()  # a long-lived process meets endless domains
            self._suggestions[domain] = target
        if target is None:
            return None
        return f"{local}@{target}" if at else target

    def typo_of(self, domain: str) -> str | None:
        """The major provider's domain that ``domain`` is one edit away from (a letter
        added, dropped, changed or two swapped), or None: :meth:`did_you_mean`'s
        suggestion when it is that close. (Two edits, which it allows for long names, hit
        real services: ``yopmail.com`` is two from ``hotmail.com``.)"""
        target = self.did_you_mean(domain)
        if target is None:
            return None
        name = normalise_domain(domain)
        return target if osa_distance(name, target, 1) == 1 else None

    def _suggest(self, domain: str) -> str | None:
        """The popular domain ``domain`` is likely a typo of (see :meth:`did_you_mean`)."""
        if not domain or domain in self._popular or self.is_free(domain):
            return None
        best: tuple[int, str] | None = None
        for target in self._popular:
            limit = 2 if len(target) >= 10 else 1
            name, _, _ = target.partition(".")
            if len(name) <= 4 and domain.partition(".")[0] != name:
                continue
            distance = osa_distance(domain, target, limit)
            if 0 < distance <= limit and (best is None or distance < best[0]):
                best = (distance, target)
        return None if best is None else best[1]


@lru_cache(maxsize=16)
def _build(
    extra: tuple[str, ...], allow: tuple[str, ...], free_file: Path, role_file: Path
) -> ReferenceLists:
    return ReferenceLists(
        disposable=frozenset(_PKG_BLOCK - _PKG_ALLOW) | frozenset(extra),
        disposable_allow=frozenset(allow),
        free=frozenset(normalise_domain(d) for d in read_list(free_file)),
        roles=read_list(role_file),
        popular=_popular_domains(),
    )
