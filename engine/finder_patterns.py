"""Email Finder candidate addresses: name normalisation and the local-part pattern table.

Pure functions, no I/O. The finder probes the candidates in rank order over SMTP, so the order
matters twice: the first accepted address wins, and every rejected probe costs a strike against
the mail host's per-session error limit (Postfix slows down after 10). Most likely first.

Ranking rules:

* The base table ``PATTERNS`` is applied to the full normalised name, in table order.
* Name variants (``VARIANTS``: first given name only, last name without particles or one half
  of a double-barrelled name, hyphens kept, initials, German umlauts spelled out, ...) are
  tried *pattern-major*: ``first.last`` for every variant, then ``first`` for every variant,
  and so on, because a popular pattern on a variant name beats an obscure pattern on the
  plain name. ``first.last`` on the variants comes right after the base table's first
  :data:`EARLY` patterns, the other variant patterns after the whole base table: the finder
  probes only its first few candidates (``finder_max_probes``), and with every variant
  behind the base patterns "Jürgen Müller" never reached ``juergen.mueller``.
* A local part is kept at its first (best) rank; later duplicates are dropped. Locals over 64
  characters (RFC 5321) and role locals (``is_role``) are never returned.
* ``prefer`` (the domain's learned patterns, most established first) moves every candidate
  of those patterns, variants included, to the front; the rest keep their order behind.
* ``Candidate.rank`` is the 0-based position in the name's own order, before ``prefer``
  moved anything (it is the position in the returned list when nothing is preferred): the
  rank prior says how likely a pattern is in general, the learned pattern adds what the
  domain has shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from nameparser.config import CONSTANTS
from unidecode import unidecode

MAX_LOCAL_LENGTH = 64  # RFC 5321 §4.5.3.1.1
MAX_ADDRESS_LENGTH = 254  # RFC 5321 path limit minus the angle brackets

# Leading tokens of the first name that are honorifics, not names. Deliberately short:
# nameparser's 800-word title list holds real given names (King, Major, Judge, Dean).
TITLES: frozenset[str] = frozenset(
    {
        "dr", "mr", "mrs", "ms", "miss", "mx", "mstr", "master", "prof", "professor", "sir",
        "dame", "rev", "revd", "reverend", "fr", "hon", "lord", "lady", "herr", "frau", "mme",
        "mlle", "dipl", "ing",
    }
)  # fmt: skip

# Trailing tokens of the last name that are generational suffixes or post-nominals. Also
# curated: nameparser's acronym list contains real surnames (Ba, Ma, Do, Ch).
SUFFIXES: frozenset[str] = frozenset(
    {
        "jr", "jnr", "junior", "sr", "snr", "senior", "ii", "iii", "iv", "v", "vi", "vii",
        "viii", "ix", "x", "2nd", "3rd", "4th", "phd", "md", "dds", "dmd", "dvm", "esq",
        "esquire", "mba", "cpa", "rn", "jd", "llm", "msc", "bsc", "mbe", "obe", "cbe", "kbe",
        "frcs", "facs", "ret",
    }
)  # fmt: skip

# Surname particles ("van der Berg", "de la Cruz"): taken from nameparser, minus words that
# start ordinary surnames (Mac, Mc, St, San, Santa, Abu, Bar, Do ...), whose removal would
# turn "Mac Donald" into "donald".
PARTICLES: frozenset[str] = frozenset(
    p for p in CONSTANTS.prefixes if re.fullmatch(r"[a-z]+", p)
) - {"mac", "mc", "st", "ste", "san", "santa", "abu", "bar", "bat", "bon", "do", "heer", "ua"}

_APOSTROPHES = re.compile(r"['`\u2018\u2019\u02bb\u02bc\u00b4]")
_BRACKETED = re.compile(r"\([^)]*\)|\"[^\"]*\"|\u201c[^\u201d]*\u201d")  # nicknames
_WORD_SPLIT = re.compile(r"[\s,;/]+")
_NOT_ALNUM = re.compile(r"[^a-z0-9]")
_GERMAN = str.maketrans({"ä": "ae", "ö": "oe", "ü": "ue", "Ä": "Ae", "Ö": "Oe", "Ü": "Ue"})


@dataclass(frozen=True)
class NameParts:
    """A person's name reduced to what can appear in a local part: ``[a-z0-9]`` tokens.

    ``first``/``last`` join the tokens with nothing ("jeanluc", "vanderberg");
    ``first_hyphenated``/``last_hyphenated`` keep the hyphens the person wrote ("jean-luc") and
    equal ``first``/``last`` when there were none.
    """

    first: str
    last: str
    first_tokens: tuple[str, ...]
    last_tokens: tuple[str, ...]
    first_hyphenated: str
    last_hyphenated: str


@dataclass(frozen=True)
class Candidate:
    """One address to probe; ``rank`` 0 is the most likely by the name alone."""

    email: str
    local: str
    pattern: str
    rank: int

    @property
    def base_pattern(self) -> str:
        """The pattern without its name-variant tag: ``first.last[umlaut]`` -> ``first.last``
        (what a domain uses; the variant depends on the person)."""
        return base_pattern(self.pattern)


def base_pattern(pattern: str) -> str:
    """``first.last[umlaut]`` -> ``first.last``."""
    return pattern.partition("[")[0]


@dataclass(frozen=True)
class _Name:
    """The strings a pattern is built from; variants swap some of them."""

    first: str
    last: str
    f: str  # first initial(s)
    l: str  # last initial  # noqa: E741


Pattern = Callable[[_Name], str]

# Local-part patterns, most common in company mail systems first. Read as a table. The
# issue's list of "the patterns companies really use" plus ``lastfirst``, ``l.first``,
# ``f_last`` and ``last-first``; see docs/finder.md for the order and why each is there.
PATTERNS: tuple[tuple[str, Pattern], ...] = (
    ("first.last", lambda n: f"{n.first}.{n.last}"),
    ("first", lambda n: n.first),
    ("flast", lambda n: f"{n.f}{n.last}"),
    ("firstlast", lambda n: f"{n.first}{n.last}"),
    ("f.last", lambda n: f"{n.f}.{n.last}"),
    ("first_last", lambda n: f"{n.first}_{n.last}"),
    ("firstl", lambda n: f"{n.first}{n.l}"),
    ("first.l", lambda n: f"{n.first}.{n.l}"),
    ("last.first", lambda n: f"{n.last}.{n.first}"),
    ("lastf", lambda n: f"{n.last}{n.f}"),
    ("last.f", lambda n: f"{n.last}.{n.f}"),
    ("last", lambda n: n.last),
    ("first-last", lambda n: f"{n.first}-{n.last}"),
    ("last_first", lambda n: f"{n.last}_{n.first}"),
    ("lastfirst", lambda n: f"{n.last}{n.first}"),
    ("l.first", lambda n: f"{n.l}.{n.first}"),
    ("fl", lambda n: f"{n.f}{n.l}"),
    ("f_last", lambda n: f"{n.f}_{n.last}"),
    ("last-first", lambda n: f"{n.last}-{n.first}"),
)

_TOP = ("first.last", "first", "flast", "firstlast", "f.last", "first_last", "last.first", "last")
_LAST_CHANGED = ("first.last", "flast", "firstlast", "f.last", "first_last", "last.first", "last")

# Name variants for compound, hyphenated and umlauted names, and the patterns worth trying on
# each (a variant that only changes the first name gains nothing from ``flast``).
# Emitted pattern-major after the base table; the tag is appended to the pattern name.
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hyphenated", ("first.last", "first", "flast", "f.last", "last.first", "last")),
    ("first-word", ("first.last", "first", "firstlast", "first_last", "firstl", "first.l")),
    ("last-core", _LAST_CHANGED),  # particles dropped: van der Berg -> berg
    ("last-first-word", _LAST_CHANGED),  # Olsen-Smith -> olsen, García Márquez -> garcia
    ("last-last-word", _LAST_CHANGED),  # Olsen-Smith -> smith
    ("first-word+last-core", ("first.last",)),
    ("first-word+last-first-word", ("first.last",)),
    ("first-word+last-last-word", ("first.last",)),
    ("initials", ("flast", "f.last")),  # Jean-Luc -> jlpicard
    ("dotted", ("first.last",)),  # ludwig.van.beethoven
    ("umlaut", _TOP),  # Müller -> mueller
)


def _words(raw: str, fold: Callable[[str], str]) -> list[str]:
    """Fold to ASCII, lower-case, drop nicknames and apostrophes; split into words."""
    without_nick = _BRACKETED.sub(" ", raw)
    if without_nick.strip():
        raw = without_nick
    text = _APOSTROPHES.sub("", fold(raw).lower())
    return [w for w in _WORD_SPLIT.split(text) if _NOT_ALNUM.sub("", w)]


def _key(word: str) -> str:
    return _NOT_ALNUM.sub("", word)


def _strip(words: list[str], drop: frozenset[str], *, leading: bool) -> list[str]:
    """Drop titles (leading) or suffixes (trailing), but never the last remaining word.

    Keeping one word means a surname that happens to be "Prof" or "Sr" survives.
    """
    words = list(words)
    while len(words) > 1 and _key(words[0 if leading else -1]) in drop:
        words.pop(0 if leading else -1)
    return words


def _tokens(words: list[str]) -> tuple[tuple[str, ...], str]:
    """Split words on hyphens into ``[a-z0-9]+`` tokens; also return the hyphen-kept form."""
    tokens: list[str] = []
    hyphenated: list[str] = []
    for word in words:
        pieces = [_NOT_ALNUM.sub("", p) for p in re.split(r"[-_\u2010-\u2015]+", word)]
        pieces = [p for p in pieces if p]
        tokens.extend(pieces)
        hyphenated.append("-".join(pieces))
    return tuple(tokens), "".join(hyphenated)


def _normalise(first: str, last: str, fold: Callable[[str], str]) -> NameParts | None:
    first_words = _strip(_words(first, fold), TITLES, leading=True)
    last_words = _strip(_words(last, fold), SUFFIXES, leading=False)
    first_tokens, first_hyphenated = _tokens(first_words)
    last_tokens, last_hyphenated = _tokens(last_words)
    if not first_tokens or not last_tokens:
        return None
    return NameParts(
        first="".join(first_tokens),
        last="".join(last_tokens),
        first_tokens=first_tokens,
        last_tokens=last_tokens,
        first_hyphenated=first_hyphenated,
        last_hyphenated=last_hyphenated,
    )


def normalise_name(first: str, last: str) -> NameParts | None:
    """Reduce a split name to ASCII tokens; None when either part has nothing usable left.

    Titles are stripped from the front of ``first``, suffixes from the end of ``last``;
    accents are folded with unidecode (José -> jose, Łukasz -> lukasz); apostrophes vanish
    (O'Brien -> obrien); hyphens and spaces split tokens.
    """
    return _normalise(first, last, unidecode)


def _german_fold(text: str) -> str:
    """Spell umlauts the German way (ü -> ue) before folding the rest: Müller -> mueller."""
    return unidecode(text.translate(_GERMAN))


def _name(first: str, last: str) -> _Name:
    return _Name(first=first, last=last, f=first[0], l=last[0])


def _variant_names(parts: NameParts, first: str, last: str) -> dict[str, _Name]:
    """The alternative (first, last) spellings worth trying, keyed by variant tag."""
    f_tokens, l_tokens = parts.first_tokens, parts.last_tokens
    firsts: dict[str, str] = {}
    if len(f_tokens) > 1:
        firsts["first-word"] = f_tokens[0]
    lasts: dict[str, str] = {}
    if len(l_tokens) > 1:
        if l_tokens[0] in PARTICLES:
            core = [t for t in l_tokens if t not in PARTICLES] or [l_tokens[-1]]
            lasts["last-core"] = "".join(core)
        else:
            lasts["last-first-word"] = l_tokens[0]
            lasts["last-last-word"] = l_tokens[-1]

    names: dict[str, _Name] = {}
    for tag, value in firsts.items():
        names[tag] = _name(value, last)
    for tag, value in lasts.items():
        names[tag] = _name(first, value)
    for f_tag, f_value in firsts.items():
        for l_tag, l_value in lasts.items():
            names[f"{f_tag}+{l_tag}"] = _name(f_value, l_value)
    if (parts.first_hyphenated, parts.last_hyphenated) != (first, last):
        names["hyphenated"] = _name(parts.first_hyphenated, parts.last_hyphenated)
    if len(f_tokens) > 1:
        names["initials"] = _Name(
            first=first, last=last, f="".join(t[0] for t in f_tokens), l=last[0]
        )
    if len(l_tokens) > 1 and l_tokens[0] in PARTICLES:
        names["dotted"] = _name(first, ".".join(l_tokens))
    return names


EARLY = 3
"""Base patterns (``first.last``, ``first``, ``flast``) ranked before any variant name."""


def _raw_candidates(parts: NameParts, umlaut: NameParts | None) -> Iterator[tuple[str, str]]:
    """Yield (pattern name, local) in rank order, duplicates and all."""
    base = _name(parts.first, parts.last)
    variants = _variant_names(parts, parts.first, parts.last)
    if umlaut is not None and (umlaut.first, umlaut.last) != (parts.first, parts.last):
        variants["umlaut"] = _name(umlaut.first, umlaut.last)

    def on_variants(patterns: tuple[tuple[str, Pattern], ...]) -> Iterator[tuple[str, str]]:
        for name, build in patterns:
            for tag, wanted in VARIANTS:
                if tag in variants and name in wanted:
                    yield f"{name}[{tag}]", build(variants[tag])

    for name, build in PATTERNS[:EARLY]:
        yield name, build(base)
    yield from on_variants(PATTERNS[:1])
    for name, build in PATTERNS[EARLY:]:
        yield name, build(base)
    yield from on_variants(PATTERNS[1:])


def candidate_addresses(
    first: str,
    last: str,
    domain: str,
    *,
    is_role: Callable[[str], bool],
    limit: int | None = None,
    prefer: Sequence[str] = (),
    known: Collection[str] = (),
) -> list[Candidate]:
    """Candidate addresses for a person at ``domain``, most likely first.

    Empty when the name normalises to nothing. ``domain`` is used as given (the caller has
    validated it). ``is_role`` keeps shared inboxes out: the finder promises a person's
    address, so a person called "Info Sales" must never yield ``info@``. ``prefer``: base
    pattern names to try first, in that order (the domain's learned patterns); ``known``:
    local parts known to exist (the account's verified addresses), whose candidates go
    before even those. ``limit`` applies after the moves, so none of them is cut off.
    """
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    parts = normalise_name(first, last)
    if parts is None:
        return []
    umlaut = _normalise(first, last, _german_fold)

    out: list[Candidate] = []
    seen: set[str] = set()
    for pattern, local in _raw_candidates(parts, umlaut):
        if limit is not None and not (prefer or known) and len(out) >= limit:
            break
        if local in seen:
            continue
        seen.add(local)
        email = f"{local}@{domain}"
        if len(local) > MAX_LOCAL_LENGTH or len(email) > MAX_ADDRESS_LENGTH or is_role(local):
            continue
        out.append(Candidate(email=email, local=local, pattern=pattern, rank=len(out)))
    if prefer or known:
        order = {name: i for i, name in enumerate(prefer)}
        out.sort(key=lambda c: (c.local not in known, order.get(c.base_pattern, len(order))))
    return out if limit is None else out[:limit]


# Prior that the address at a given rank is the person's, before any SMTP evidence.
CONFIDENCE_TOP = 0.95
CONFIDENCE_FLOOR = 0.5
CONFIDENCE_DECAY = 0.85


def pattern_confidence(rank: int) -> float:
    """Prior confidence for a candidate's rank: 0.95 at rank 0, decaying toward 0.5.

    ``FLOOR + (TOP - FLOOR) * DECAY**rank``: 0.95, 0.88, 0.83, 0.78, ... 0.59 at rank 10.
    A heuristic, not a measured distribution: it only encodes that ``first.last`` dominates and
    that later patterns are ever less likely. The finder mixes it with the SMTP verdict; on a
    catch-all domain it is all the evidence there is, hence a floor that stays well below a
    verified find.
    """
    if rank < 0:
        raise ValueError("rank must be >= 0")
    return CONFIDENCE_FLOOR + (CONFIDENCE_TOP - CONFIDENCE_FLOOR) * CONFIDENCE_DECAY**rank


def most_likely(
    first: str, last: str, domain: str, is_role: Callable[[str], bool]
) -> Candidate | None:
    """The single best guess, for catch-all domains where probing cannot tell candidates apart."""
    found = candidate_addresses(first, last, domain, is_role=is_role, limit=1)
    return found[0] if found else None
