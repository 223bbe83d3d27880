"""Unit tests for the Email Finder's name normalisation and candidate ordering."""

from __future__ import annotations

from itertools import pairwise

import pytest

from verimail.config import Settings
from verimail.engine.finder_patterns import (
    EARLY,
    MAX_LOCAL_LENGTH,
    PATTERNS,
    VARIANTS,
    Candidate,
    NameParts,
    candidate_addresses,
    most_likely,
    normalise_name,
    pattern_confidence,
)

ROLES = frozenset({"info", "sales", "support", "admin", "contact"})
DOMAIN = "acme.test"


def is_role(local: str) -> bool:
    return local in ROLES


def never_role(local: str) -> bool:
    return False


def locals_of(first: str, last: str, **kwargs: object) -> list[str]:
    return [c.local for c in candidate_addresses(first, last, DOMAIN, is_role=is_role, **kwargs)]


# --- pattern order -------------------------------------------------------------------------


def test_exact_pattern_order_for_john_smith() -> None:
    found = candidate_addresses("John", "Smith", DOMAIN, is_role=is_role)
    assert [(c.pattern, c.local) for c in found] == [
        ("first.last", "john.smith"),
        ("first", "john"),
        ("flast", "jsmith"),
        ("firstlast", "johnsmith"),
        ("f.last", "j.smith"),
        ("first_last", "john_smith"),
        ("firstl", "johns"),
        ("first.l", "john.s"),
        ("last.first", "smith.john"),
        ("lastf", "smithj"),
        ("last.f", "smith.j"),
        ("last", "smith"),
        ("first-last", "john-smith"),
        ("last_first", "smith_john"),
        ("lastfirst", "smithjohn"),
        ("l.first", "s.john"),
        ("fl", "js"),
        ("f_last", "j_smith"),
        ("last-first", "smith-john"),
    ]
    assert [c.rank for c in found] == list(range(19))
    assert all(c.email == f"{c.local}@{DOMAIN}" for c in found)


ISSUE_26_PATTERNS = (
    "first.last", "flast", "first", "firstl", "f.last", "first_last", "first-last",
    "last.first", "lastf", "last.f", "last_first", "last", "fl",
)  # fmt: skip


def test_pattern_table_names_are_unique_and_start_with_first_dot_last() -> None:
    names = [name for name, _ in PATTERNS]
    assert len(names) == len(set(names)) == 19
    assert names[0] == "first.last"
    assert set(ISSUE_26_PATTERNS) <= set(names)


def test_the_default_probes_reach_every_base_pattern() -> None:
    """Sean O'Connor's oconnor.s (last.f) was candidate 11, behind the 8 default probes."""
    default = Settings.model_fields["finder_max_probes"].default
    found = candidate_addresses("Sean", "O'Connor", DOMAIN, is_role=is_role, limit=default)
    assert {name for name, _ in PATTERNS} <= {c.pattern for c in found}
    assert "oconnor.s" in [c.local for c in found]


def test_preferred_patterns_go_first_with_their_variants_and_keep_their_rank() -> None:
    plain = candidate_addresses("Jürgen", "Müller", DOMAIN, is_role=is_role)
    found = candidate_addresses(
        "Jürgen", "Müller", DOMAIN, is_role=is_role, prefer=["flast", "last.f"], limit=3
    )
    assert [c.pattern for c in found] == ["flast", "flast[umlaut]", "last.f"]
    assert [c.local for c in found] == ["jmuller", "jmueller", "muller.j"]
    natural = {c.local: c.rank for c in plain}
    assert all(c.rank == natural[c.local] for c in found)  # the name's own likelihood
    assert [c.base_pattern for c in found] == ["flast", "flast", "last.f"]


def test_a_preferred_pattern_the_name_cannot_fill_changes_nothing() -> None:
    plain = candidate_addresses("John", "Smith", DOMAIN, is_role=is_role)
    assert candidate_addresses("John", "Smith", DOMAIN, is_role=is_role, prefer=["x"]) == plain


def test_variants_only_name_patterns_of_the_table() -> None:
    names = {name for name, _ in PATTERNS}
    for _tag, wanted in VARIANTS:
        assert set(wanted) <= names


def test_domain_is_used_as_given() -> None:
    found = candidate_addresses("John", "Smith", "Mail.Example.COM", is_role=is_role)
    assert found[0].email == "john.smith@Mail.Example.COM"


# --- normalisation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "last", "want_first", "want_last"),
    [
        ("José", "Müller", "jose", "muller"),
        ("Łukasz", "Żółć", "lukasz", "zolc"),
        ("Zoë", "Ångström", "zoe", "angstrom"),
        ("Søren", "Øst", "soren", "ost"),
        ("  JOHN ", " SMITH  ", "john", "smith"),
        ("Conan", "O'Brien", "conan", "obrien"),
        ("Conan", "O\u2019Brien", "conan", "obrien"),  # typographic apostrophe
        ("D'Angelo", "Russell", "dangelo", "russell"),
        ("Dr. Jane", "Doe PhD", "jane", "doe"),
        ("Dr Jane", "Doe, Ph.D.", "jane", "doe"),
        ("Martin Luther", "King Jr.", "martinluther", "king"),
        ("Prof. Ada", "Lovelace III", "ada", "lovelace"),
        ("Robert (Bob)", "Jones", "robert", "jones"),
        ("Anna", "Prof", "anna", "prof"),  # a surname that looks like a title stays
        ("Sir", "Jones", "sir", "jones"),  # a lone word is never stripped
        ("John", "Sr", "john", "sr"),
        ("Md", "Rahman", "md", "rahman"),  # "MD" is only a suffix at the end of the last name
        ("Straße", "Groß", "strasse", "gross"),
    ],
)
def test_normalise_name(first: str, last: str, want_first: str, want_last: str) -> None:
    parts = normalise_name(first, last)
    assert parts is not None
    assert (parts.first, parts.last) == (want_first, want_last)


def test_hyphenated_first_name_tokens() -> None:
    parts = normalise_name("Jean-Luc", "Picard")
    assert parts == NameParts(
        first="jeanluc",
        last="picard",
        first_tokens=("jean", "luc"),
        last_tokens=("picard",),
        first_hyphenated="jean-luc",
        last_hyphenated="picard",
    )


def test_compound_last_name_tokens() -> None:
    parts = normalise_name("Pieter", "van der Berg")
    assert parts is not None
    assert parts.last_tokens == ("van", "der", "berg")
    assert parts.last == "vanderberg"
    assert parts.last_hyphenated == "vanderberg"  # no hyphen was written


def test_only_ascii_alnum_survives() -> None:
    parts = normalise_name("Ann.", "Lee (née Park)!")
    assert parts is not None
    for text in (parts.first, parts.last, *parts.first_tokens, *parts.last_tokens):
        assert text.isascii() and text.isalnum() and text == text.lower()


@pytest.mark.parametrize(
    ("first", "last"),
    [
        ("", "Smith"),
        ("John", ""),
        ("   ", "Smith"),
        ("😀", "Smith"),
        ("John", "🚀🚀"),
        ("😀", "🙂"),
        ("---", "'''"),
        ("Dr.", ""),
    ],
)
def test_empty_after_normalisation_is_none(first: str, last: str) -> None:
    assert normalise_name(first, last) is None
    assert candidate_addresses(first, last, DOMAIN, is_role=is_role) == []
    assert most_likely(first, last, DOMAIN, is_role) is None


# --- accents, hyphens, apostrophes, titles in candidates ------------------------------------


def test_accented_names_fold_to_ascii() -> None:
    assert locals_of("José", "Müller")[0] == "jose.muller"
    assert locals_of("Łukasz", "Żółć")[0] == "lukasz.zolc"
    assert locals_of("Zoë", "Ångström")[0] == "zoe.angstrom"
    for local in locals_of("Łukasz", "Żółć") + locals_of("Zoë", "Ångström"):
        assert local.isascii()


def test_german_umlaut_spelling_is_a_lower_ranked_variant() -> None:
    got = locals_of("José", "Müller")
    assert got.index("jose.muller") < got.index("jose.mueller")
    # first.last on the variant right after the base table's EARLY patterns, well within
    # the finder's default 8 probes; the variant's other patterns after the base table
    assert got.index("jose.mueller") == EARLY
    assert got.index("muller.jose") < got.index("mueller.jose")


def test_hyphenated_first_name() -> None:
    got = locals_of("Jean-Luc", "Picard")
    assert got[:5] == ["jeanluc.picard", "jeanluc", "jpicard", "jean-luc.picard", "jean.picard"]
    assert got[5] == "jeanlucpicard"  # the base table goes on
    for variant in ("jlpicard", "jl.picard"):  # variant patterns past first.last: at the end
        assert got.index(variant) >= len(PATTERNS) - 1


def test_hyphenated_first_and_last_name() -> None:
    got = locals_of("Mary-Kate", "Olsen-Smith")
    assert got[0] == "marykate.olsensmith"
    for variant in (
        "mary-kate.olsen-smith",
        "mary.olsensmith",
        "marykate.olsen",
        "marykate.smith",
        "mary.olsen",
        "mary.smith",
        "molsensmith",
    ):
        assert variant in got
    # pattern-major: first.last on every variant before first alone on any variant
    assert got.index("mary.smith") < got.index("mary")


def test_apostrophes() -> None:
    assert locals_of("Conan", "O'Brien")[:3] == ["conan.obrien", "conan", "cobrien"]
    assert locals_of("D'Angelo", "Russell")[0] == "dangelo.russell"
    assert all("'" not in local for local in locals_of("Conan", "O'Brien"))


def test_titles_and_suffixes_are_not_in_candidates() -> None:
    assert locals_of("Dr. Jane", "Doe PhD")[:3] == ["jane.doe", "jane", "jdoe"]
    got = locals_of("Martin Luther", "King Jr.")
    assert got[0] == "martinluther.king"
    assert "martin.king" in got
    assert "mlking" in got
    assert not any("jr" in local or "phd" in local for local in got)


# --- compound last names -------------------------------------------------------------------


def test_compound_last_name_with_particle() -> None:
    got = locals_of("Ludwig", "van Beethoven")
    assert got[0] == "ludwig.vanbeethoven"
    core = got.index("ludwig.beethoven")
    assert core == EARLY  # the first variant: first.last, after first.last, first and flast
    assert "ludwig.van.beethoven" in got
    assert "lbeethoven" in got
    assert got.index("beethoven") > core


def test_compound_last_name_with_two_particles() -> None:
    got = locals_of("Maria", "de la Cruz")
    assert got[0] == "maria.delacruz"
    assert got[EARLY] == "maria.cruz"
    assert "maria.de.la.cruz" in got
    assert "mcruz" in got


def test_mac_is_not_dropped_as_a_particle() -> None:
    got = locals_of("Ronald", "Mac Donald")
    assert got[0] == "ronald.macdonald"
    assert "ronald.donald" in got  # as the second half of a double surname, not as core
    assert got.index("ronald.mac") < got.index("ronald.donald")


# --- deduplication, roles, limits ----------------------------------------------------------


def test_single_letter_first_name_is_deduplicated() -> None:
    found = candidate_addresses("J", "Smith", DOMAIN, is_role=is_role)
    got = [c.local for c in found]
    assert len(got) == len(set(got))
    assert got[:3] == ["j.smith", "j", "jsmith"]
    # "firstlast" equals "flast" and keeps the first (better) rank and pattern name
    assert [c.pattern for c in found if c.local == "jsmith"] == ["flast"]
    assert "firstlast" not in {c.pattern for c in found}
    assert [c.rank for c in found] == list(range(len(found)))


def test_no_duplicates_for_any_complex_name() -> None:
    for first, last in [("Mary-Kate", "Olsen-Smith"), ("Ludwig", "van Beethoven"), ("A", "B")]:
        got = locals_of(first, last)
        assert len(got) == len(set(got))


def test_role_locals_are_never_returned() -> None:
    found = candidate_addresses("Info", "Sales", DOMAIN, is_role=is_role)
    got = [c.local for c in found]
    assert "info" not in got
    assert "sales" not in got
    assert got[0] == "info.sales"
    assert [c.rank for c in found] == list(range(len(found)))
    for first, last in [("Support", "Admin"), ("Contact", "Info"), ("Sales", "Support")]:
        assert not ROLES.intersection(locals_of(first, last))


def test_is_role_is_asked_about_every_returned_local() -> None:
    asked: list[str] = []

    def spy(local: str) -> bool:
        asked.append(local)
        return local.startswith("j")

    found = candidate_addresses("John", "Smith", DOMAIN, is_role=spy)
    assert found and all(not c.local.startswith("j") for c in found)
    assert {c.local for c in found} <= set(asked)
    assert found[0].local == "smith.john" and found[0].rank == 0


def test_local_parts_never_exceed_64_chars() -> None:
    first = "a" * 40
    last = "b" * 30
    found = candidate_addresses(first, last, DOMAIN, is_role=never_role)
    assert found
    assert all(len(c.local) <= MAX_LOCAL_LENGTH for c in found)
    got = [c.local for c in found]
    assert first in got  # "first" alone fits
    assert f"{first}.{last}" not in got  # 71 chars
    assert got[0] == first  # best that fits is rank 0


def test_exactly_64_chars_is_kept() -> None:
    first, last = "a" * 31, "b" * 32
    assert locals_of(first, last)[0] == f"{first}.{last}"  # 64 chars


def test_limit() -> None:
    assert [
        c.local for c in candidate_addresses("John", "Smith", DOMAIN, is_role=is_role, limit=3)
    ] == [
        "john.smith",
        "john",
        "jsmith",
    ]
    assert candidate_addresses("John", "Smith", DOMAIN, is_role=is_role, limit=0) == []
    all_found = candidate_addresses("John", "Smith", DOMAIN, is_role=is_role)
    assert candidate_addresses("John", "Smith", DOMAIN, is_role=is_role, limit=999) == all_found
    with pytest.raises(ValueError):
        candidate_addresses("John", "Smith", DOMAIN, is_role=is_role, limit=-1)


def test_limit_counts_after_dedup_and_role_exclusion() -> None:
    found = candidate_addresses("Info", "Sales", DOMAIN, is_role=is_role, limit=2)
    assert [c.local for c in found] == ["info.sales", "isales"]


# --- confidence and most likely -------------------------------------------------------------


def test_pattern_confidence_decays_to_a_floor() -> None:
    values = [pattern_confidence(r) for r in range(60)]
    assert values[0] == pytest.approx(0.95)
    assert all(a > b for a, b in pairwise(values))
    assert all(0.5 <= v <= 0.95 for v in values)
    assert values[-1] == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError):
        pattern_confidence(-1)


def test_most_likely() -> None:
    best = most_likely("José", "Müller", DOMAIN, is_role)
    assert best == Candidate(
        email="jose.muller@acme.test", local="jose.muller", pattern="first.last", rank=0
    )


def test_most_likely_skips_role_locals() -> None:
    def role(local: str) -> bool:
        return local in {"john.smith", "john"}

    best = most_likely("John", "Smith", DOMAIN, role)
    assert best is not None
    assert (best.local, best.pattern, best.rank) == ("jsmith", "flast", 0)
