"""The finder that learns (issue 26), against the loopback testbed's Postfix-like hosts:
every common pattern is reached within the probe cap, a domain's pattern is learned from
its finds and tried first, and a block or a 421 ends a lookup at once."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from api_helpers import VERIMAIL_BIN, clean_env, env_for_testbed

from verimail.config import Settings
from verimail.engine.core import Engine
from verimail.engine.finder import CATCH_ALL_FACTOR, find_email
from verimail.engine.finder_learned import DomainPattern, learned_confidence
from verimail.engine.finder_patterns import PATTERNS, pattern_confidence
from verimail.engine.smtp.domain_session import DomainSession
from verimail.files.bulk_io import RESULT_SCHEMA, append_history
from verimail.jobs.learned_patterns import StoredPatterns
from verimail.store.accounts import create_account
from verimail.store.db import Store, init_store
from verimail.store.patterns import pattern_counts, record_find
from verimail.testbed.people import company, finder_world, one_per_pattern
from verimail.testbed.server import Testbed
from verimail.testbed.world import (
    POSTFIX_SOFT_ERROR_LIMIT,
    DomainSpec,
    HostBehaviour,
    HostSpec,
    World,
)

PATTERN_NAMES = [name for name, _ in PATTERNS]
BLOCK_REPLY = "554 5.7.1 Service unavailable; Client host [127.0.0.1] blocked using a DNSBL"
GO_AWAY_421 = "421 4.7.0 Too many connections from your address, try again later"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = init_store(Settings(data_dir=tmp_path))
    yield store
    store.close()


def _account(store: Store) -> int:
    return create_account(store.engine, store.settings).id


def _rcpts(tb: Testbed, host: str) -> int:
    return tb.host_stats(host).rcpt_to


# --- 1. pattern coverage and the probe cap ------------------------------------------------


async def test_one_person_per_pattern_is_found_within_the_cap_and_the_error_limits(
    testbed_factory, tmp_path, testbed_settings
) -> None:
    """Every pattern of the issue's list (and the four more the table has) is found with the
    default settings; no lookup sends more than the cap plus the catch-all probe, and no
    session of the Postfix-like host reaches even its soft error limit."""
    people = one_per_pattern("patterns.test")
    tb = testbed_factory(finder_world(people))
    settings = testbed_settings(tb, tmp_path)
    cap = settings.finder_max_probes
    engine = Engine(settings)
    for person in people:
        before = _rcpts(tb, "mx.patterns.test")
        result = await find_email(
            engine, person.first, person.last, "patterns.test", max_probes=cap
        )
        assert (result.status, result.email) == ("found", person.email), person
        assert result.pattern == person.pattern
        assert _rcpts(tb, "mx.patterns.test") - before <= cap + 1, person
    stats = tb.host_stats("mx.patterns.test")
    assert stats.hangups == 0
    assert stats.peak_session_rejections < POSTFIX_SOFT_ERROR_LIMIT


async def test_a_person_not_there_costs_the_cap_and_several_sessions_but_no_hang_up(
    testbed_factory, tmp_path, testbed_settings
) -> None:
    tb = testbed_factory(finder_world(company("few.test", "first.last", 3)))
    settings = testbed_settings(tb, tmp_path)
    result = await find_email(
        Engine(settings),
        "Jean-Luc",
        "van der Berg",
        "few.test",
        max_probes=settings.finder_max_probes,
    )  # fmt: skip (a name with more candidates than the cap)
    assert result.status == "not_found"
    assert f"refused all {settings.finder_max_probes}" in result.reason
    stats = tb.host_stats("mx.few.test")
    assert stats.rcpt_to == settings.finder_max_probes + 1  # + the catch-all probe
    assert stats.hangups == 0 and stats.sessions >= 2
    assert stats.peak_session_rejections <= settings.smtp_max_rejections_per_session


# --- 2. learned domain patterns ------------------------------------------------------------


def test_learned_confidence_grows_with_the_finds_and_falls_with_a_split() -> None:
    assert learned_confidence(0, 0) == 0
    assert learned_confidence(1, 1) == 0.5
    assert learned_confidence(20, 20) == 0.95
    assert learned_confidence(10, 20) < learned_confidence(1, 1)
    learned = DomainPattern("x.test").with_find("last.f").with_find("flast").with_find("last.f")
    assert (learned.pattern, learned.finds, learned.total) == ("last.f", 2, 3)
    assert learned.ranked == ["last.f", "flast"]


async def test_a_csv_session_learns_from_its_earlier_rows(
    testbed_factory, tmp_path, testbed_settings, store
) -> None:
    """50 people at a `last.f` company over one session: the first find walks the
    candidates, every later row costs one RCPT; found 50/50, confidence rising."""
    people = company("lastf.test", "last.f", 50)
    tb = testbed_factory(finder_world(people))
    settings = testbed_settings(tb, tmp_path)
    engine = Engine(settings)
    patterns = StoredPatterns(store, _account(store), settings)
    costs, results = [], []
    async with DomainSession(engine.prober) as session:
        for person in people:
            before = _rcpts(tb, "mx.lastf.test")
            result = await find_email(
                engine, person.first, person.last, "lastf.test",
                max_probes=settings.finder_max_probes, session=session, patterns=patterns,
            )  # fmt: skip
            costs.append(_rcpts(tb, "mx.lastf.test") - before)
            results.append(result)
    assert [r.email for r in results] == [p.email for p in people]
    assert {r.status for r in results} == {"found"}
    assert costs[0] > 2 and costs[1:] == [1] * 49  # (costs[0]: the probe and the walk)
    assert results[1].confidence < results[10].confidence < results[49].confidence
    assert "earlier find" in results[1].reason
    assert pattern_counts(store.engine, "lastf.test", None) == {"last.f": 50}
    assert tb.host_stats("mx.lastf.test").hangups == 0


async def test_later_lookups_try_the_stored_pattern_first(
    testbed_factory, tmp_path, testbed_settings, store
) -> None:
    """Single lookups (each its own session, as the API makes them): the second person
    costs the catch-all probe and one candidate; what a lookup learnt is in the store."""
    people = company("lastf.test", "last.f", 3)
    tb = testbed_factory(finder_world(people))
    settings = testbed_settings(tb, tmp_path)
    engine = Engine(settings)
    account = _account(store)
    costs = []
    for person in people:
        before = _rcpts(tb, "mx.lastf.test")
        result = await find_email(
            engine, person.first, person.last, "lastf.test",
            max_probes=settings.finder_max_probes,
            patterns=StoredPatterns(store, account, settings),  # a fresh read, as per request
        )  # fmt: skip
        assert result.email == person.email
        costs.append(_rcpts(tb, "mx.lastf.test") - before)
    assert costs[0] > 2 and costs[1:] == [2, 2]


async def test_a_catch_all_guess_follows_the_learned_pattern(
    testbed_factory, tmp_path, testbed_settings, store
) -> None:
    world = World.of(
        [HostSpec("mx.any.test", HostBehaviour(accept_all=True))],
        [DomainSpec("any.test", mx=[(10, "mx.any.test")])],
    )
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path)
    account = _account(store)
    patterns = StoredPatterns(store, account, settings)
    plain = await find_email(Engine(settings), "Ann", "Lee", "any.test", max_probes=20)
    for _ in range(5):
        record_find(store.engine, account, "any.test", "lastf")
    guess = await find_email(
        Engine(settings), "Ann", "Lee", "any.test", max_probes=20, patterns=patterns
    )
    assert (plain.email, guess.email) == ("ann.lee@any.test", "leea@any.test")
    assert guess.status == "catch_all" and not guess.found
    unlearned = pattern_confidence(PATTERN_NAMES.index("lastf")) * CATCH_ALL_FACTOR
    assert unlearned + 0.1 < guess.confidence <= CATCH_ALL_FACTOR
    assert pattern_counts(store.engine, "any.test", None) == {"lastf": 5}  # (no find: no count)


async def test_an_address_the_account_verified_as_valid_is_tried_first_and_teaches(
    testbed_factory, tmp_path, testbed_settings, store
) -> None:
    """The account verified quincy.j@hist.test as valid in a bulk job: looking up Jonas
    Quincy tries that candidate first (one RCPT after the probe), and the find teaches the
    domain's pattern. Another account's lookup gets nothing from that history."""
    people = company("hist.test", "last.f", 3)
    tb = testbed_factory(finder_world(people))
    settings = testbed_settings(tb, tmp_path, finder_pattern_scope="account")
    engine = Engine(settings)
    mine, theirs = _account(store), _account(store)
    verified = pl.DataFrame(
        {"verified_email": [people[1].email, people[2].email], "status": ["valid", "invalid"]}
    )
    results = pl.concat([RESULT_SCHEMA.to_frame(), verified], how="diagonal_relaxed")
    results = results.with_columns(normalised=pl.col("verified_email"), domain=pl.lit("hist.test"))
    append_history(settings.data_dir, results, job_id=1, account_id=mine, source="bulk")

    costs = []
    for account, person in ((mine, people[1]), (theirs, people[1]), (mine, people[2])):
        before = _rcpts(tb, "mx.hist.test")
        result = await find_email(
            engine, person.first, person.last, "hist.test", max_probes=20,
            patterns=StoredPatterns(store, account, settings),
        )  # fmt: skip
        assert result.email == person.email
        costs.append(_rcpts(tb, "mx.hist.test") - before)
        if (account, person) == (mine, people[1]):
            assert "verified as valid before" in result.reason
    assert costs[0] == 2 and costs[1] > 2  # (the other account walked the candidates)
    assert costs[2] == 2  # an invalid verification is no hint, but the learned pattern is
    assert pattern_counts(store.engine, "hist.test", mine) == {"last.f": 2}


def test_the_scope_setting_says_whose_finds_count(store: Store, tmp_path: Path) -> None:
    mine, theirs = _account(store), _account(store)
    record_find(store.engine, theirs, "acme.test", "flast")
    record_find(store.engine, theirs, "acme.test", "flast")
    record_find(store.engine, mine, "acme.test", "first.last")
    assert pattern_counts(store.engine, "acme.test", None) == {"flast": 2, "first.last": 1}
    assert pattern_counts(store.engine, "acme.test", mine) == {"first.last": 1}
    assert pattern_counts(store.engine, "other.test", None) == {}


# --- 3. stop on blocks -------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "words"), [(BLOCK_REPLY, "blocked"), (GO_AWAY_421, "")])
async def test_a_block_or_421_on_the_first_candidate_ends_the_lookup(
    testbed_factory, tmp_path, testbed_settings, reply, words
) -> None:
    """The first candidate is refused by policy (or the server says 421): the other 19
    candidates were probed anyway (a 421 even asked the first again in two more sessions);
    now the lookup ends there, not found, and later rows get the answer without a RCPT."""
    host = HostSpec(
        "mx.wall.test", HostBehaviour(mailboxes={"jsmith"}, rcpt_replies={"john.smith": reply})
    )
    tb = testbed_factory(World.of([host], [DomainSpec("wall.test", mx=[(10, "mx.wall.test")])]))
    settings = testbed_settings(tb, tmp_path)
    engine = Engine(settings)
    async with DomainSession(engine.prober) as session:
        john = await find_email(
            engine, "John", "Smith", "wall.test", max_probes=20, session=session
        )
        ann = await find_email(engine, "Ann", "Lee", "wall.test", max_probes=20, session=session)
    assert john.status == "not_found" and not john.found and john.email is None
    assert "stopped there instead of probing the other candidates" in john.reason
    assert words in john.reason
    assert john.alternatives == ["john.smith@wall.test"]
    stats = tb.host_stats("mx.wall.test")
    assert [r.partition("@")[0] for r in stats.rcpts][1:] == ["john.smith"]  # after the probe
    assert stats.sessions == 1
    assert ann.status == "not_found" and "try again later" in ann.reason


# --- the CLI --------------------------------------------------------------------------------


def test_the_cli_learns_and_uses_the_pattern(testbed_factory, tmp_path: Path) -> None:
    """``verimail find`` (each run its own process) reads and teaches the store's patterns."""
    people = company("lastf.test", "last.f", 2)
    tb = testbed_factory(finder_world(people))
    env = clean_env({**env_for_testbed(tb), "VERIMAIL_DATA_DIR": str(tmp_path)})
    costs = []
    for person in people:
        before = _rcpts(tb, "mx.lastf.test")
        done = subprocess.run(
            [str(VERIMAIL_BIN), "find", person.first, person.last, "lastf.test", "--json"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["email"] == person.email
        costs.append(_rcpts(tb, "mx.lastf.test") - before)
    assert costs == [12, 2]  # the probe + last.f as 11th candidate; then the probe + last.f
