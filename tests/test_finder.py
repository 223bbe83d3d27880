"""The Email Finder engine (``engine/finder.py``) against the loopback testbed: real DNS
packets, real SMTP sessions, one session per lookup."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from api_helpers import clean_env, env_for_testbed
from cli_helpers import folded, run_verimail

from verimail.config import Settings
from verimail.engine.core import Engine
from verimail.engine.finder import (
    CATCH_ALL_FACTOR,
    FinderInputError,
    check_names,
    find_email,
    normalise_finder_domain,
)
from verimail.engine.finder_patterns import pattern_confidence
from verimail.engine.smtp.domain_session import DomainSession
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

MAX_PROBES = 8
JOHN_SMITH_FIRST_THREE = ["john.smith", "john", "jsmith"]  # rank order of finder_patterns
STAFF = ("ann.lee", "bob.stone", "carla.diaz", "dan.wu")  # mx.staff.test's mailboxes


def _world() -> World:
    """One domain per situation the finder must tell apart."""
    hosts = [
        HostSpec("mx.people.test", HostBehaviour(mailboxes={"john.smith", "info"})),
        HostSpec("mx.jsmith.test", HostBehaviour(mailboxes={"jsmith"})),
        HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
        HostSpec("mx.infoonly.test", HostBehaviour(mailboxes={"info", "sales"})),
        HostSpec("mx.nobody.test", HostBehaviour(mailboxes={"someone.else"})),
        HostSpec("mx.grey.test", HostBehaviour(mailboxes={"john.smith"}, greylist_tries=99)),
        HostSpec("mx.block.test", HostBehaviour(mailboxes={"john.smith"}, block=True)),
        HostSpec("mx.idn.test", HostBehaviour(mailboxes={"john.smith"})),
        HostSpec("mx.throwaway.test", HostBehaviour(accept_all=True)),
        HostSpec("internal.evil.test", address="10.0.0.1"),
        HostSpec("mx.reset.test", HostBehaviour(hostile="reset_mid_rcpt")),
        # Postfix-like: it hangs up on the 10th refused recipient of a session.
        HostSpec(
            "mx.staff.test",
            HostBehaviour(mailboxes=set(STAFF), disconnect_after_rejections=10),
        ),
        HostSpec("mx.teams.test", HostBehaviour(mailboxes={"salesteam", "techsupport"})),
        # Stricter: the 3rd refusal of a session, then 421 and it hangs up.
        HostSpec(
            "mx.drop.test", HostBehaviour(mailboxes={"jsmith"}, disconnect_after_rejections=3)
        ),
    ]
    domains = [
        DomainSpec("people.test", mx=[(10, "mx.people.test")]),
        DomainSpec("jsmith.test", mx=[(10, "mx.jsmith.test")]),
        DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
        DomainSpec("infoonly.test", mx=[(10, "mx.infoonly.test")]),
        DomainSpec("nobody.test", mx=[(10, "mx.nobody.test")]),
        DomainSpec("grey.test", mx=[(10, "mx.grey.test")]),
        DomainSpec("block.test", mx=[(10, "mx.block.test")]),
        DomainSpec("xn--bcher-kva.test", mx=[(10, "mx.idn.test")]),  # bücher.test
        DomainSpec("throwaway.test", mx=[(10, "mx.throwaway.test")]),
        DomainSpec("null.test", mx=[(0, ".")]),
        DomainSpec("broken.test", servfail=True),
        DomainSpec("private.test", mx=[(10, "internal.evil.test")]),
        DomainSpec("staff.test", mx=[(10, "mx.staff.test")]),
        DomainSpec("reset.test", mx=[(10, "mx.reset.test")]),
        DomainSpec("drop.test", mx=[(10, "mx.drop.test")]),
        DomainSpec("teams.test", mx=[(10, "mx.teams.test")]),
    ]
    return World.of(hosts, domains)


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    return testbed_factory(_world())


@pytest.fixture
def settings(tb, tmp_path, testbed_settings) -> Settings:
    return testbed_settings(tb, tmp_path, disposable_extra=["throwaway.test"])


@pytest.fixture
def engine(settings) -> Engine:
    return Engine(settings)


def _locals(rcpts: list[str]) -> list[str]:
    return [r.rpartition("@")[0] for r in rcpts]


# --- found -----------------------------------------------------------------------------


async def test_finds_first_last_in_one_session_with_one_probe_and_one_candidate(
    engine: Engine, tb: Testbed
) -> None:
    result = await find_email(engine, "John", "Smith", "people.test", max_probes=MAX_PROBES)

    assert result.found is True and result.status == "found"
    assert result.email == "john.smith@people.test"
    assert result.pattern == "first.last"
    assert result.alternatives == []
    assert result.verification_status == "valid"
    assert result.confidence == round(pattern_confidence(0) * 0.97, 2) == 0.92
    assert result.reason and "people.test" in result.reason
    assert result.elapsed_ms >= 0
    stats = tb.host_stats("mx.people.test")
    assert stats.sessions == 1
    assert stats.data == 0
    locals_ = _locals(stats.rcpts)
    assert len(locals_) == 2 and locals_[0].startswith("vm-probe-")  # catch-all probe first
    assert locals_[1] == "john.smith"


async def test_finds_a_later_pattern_after_trying_the_earlier_ones(
    engine: Engine, tb: Testbed
) -> None:
    result = await find_email(engine, "John", "Smith", "jsmith.test", max_probes=MAX_PROBES)

    assert result.status == "found" and result.email == "jsmith@jsmith.test"
    assert result.pattern == "flast"
    assert result.alternatives == ["john.smith@jsmith.test", "john@jsmith.test"]
    # The rank prior lowers confidence: jsmith could as well be Jane Smith's mailbox.
    assert result.confidence == round(pattern_confidence(2) * 0.97, 2)
    assert result.confidence < 0.92
    stats = tb.host_stats("mx.jsmith.test")
    assert stats.sessions == 1
    assert _locals(stats.rcpts)[1:] == JOHN_SMITH_FIRST_THREE


async def test_domain_input_is_normalised_before_lookup(engine: Engine, tb: Testbed) -> None:
    pasted = await find_email(
        engine, "John", "Smith", "  https://WWW.People.TEST/about?x=1 ", max_probes=MAX_PROBES
    )
    assert pasted.email == "john.smith@people.test" and pasted.domain == "people.test"

    idn = await find_email(engine, "John", "Smith", "Bücher.test", max_probes=MAX_PROBES)
    assert idn.status == "found" and idn.email == "john.smith@xn--bcher-kva.test"
    assert tb.host_stats("mx.idn.test").sessions == 1


async def test_max_probes_bounds_the_candidates_and_the_rcpts(engine: Engine, tb: Testbed) -> None:
    result = await find_email(engine, "John", "Smith", "jsmith.test", max_probes=2)

    assert result.status == "not_found" and result.email is None and result.confidence == 0
    assert result.alternatives == ["john.smith@jsmith.test", "john@jsmith.test"]
    stats = tb.host_stats("mx.jsmith.test")
    assert stats.sessions == 1
    assert stats.rcpt_to == 2 + 1  # the candidates plus the catch-all probe


# --- catch-all and not found -------------------------------------------------------------


async def test_catch_all_returns_the_most_likely_guess_after_only_the_probe(
    engine: Engine, tb: Testbed
) -> None:
    result = await find_email(engine, "John", "Smith", "catchall.test", max_probes=MAX_PROBES)

    assert result.status == "catch_all" and result.found is False
    assert result.email == "john.smith@catchall.test" and result.pattern == "first.last"
    assert result.confidence == round(pattern_confidence(0) * CATCH_ALL_FACTOR, 2) <= 0.6
    assert result.alternatives == []
    assert "any address" in result.reason
    stats = tb.host_stats("mx.catchall.test")
    assert stats.sessions == 1
    assert stats.rcpt_to == 1 and _locals(stats.rcpts)[0].startswith("vm-probe-")


async def test_nobody_matches_after_every_candidate_in_one_session(
    engine: Engine, tb: Testbed
) -> None:
    result = await find_email(engine, "John", "Smith", "nobody.test", max_probes=MAX_PROBES)

    assert result.status == "not_found" and result.found is False
    assert result.email is None and result.pattern is None and result.confidence == 0
    assert len(result.alternatives) == MAX_PROBES
    assert result.alternatives[:3] == [f"{x}@nobody.test" for x in JOHN_SMITH_FIRST_THREE]
    assert "refused all 8" in result.reason
    stats = tb.host_stats("mx.nobody.test")
    assert stats.sessions == 1
    assert stats.rcpt_to == MAX_PROBES + 1


# --- several people at one domain (a CSV job's rows) -------------------------------------


async def test_people_at_one_domain_share_one_session_and_one_probe(
    engine: Engine, tb: Testbed
) -> None:
    people = [name.split(".") for name in STAFF]
    async with DomainSession(engine.prober) as session:
        results = [
            await find_email(engine, first, last, dom, max_probes=MAX_PROBES, session=session)
            for (first, last), dom in zip(
                people,
                ["staff.test", "https://www.staff.test/team", "STAFF.test", "staff.test"],
                strict=True,
            )
        ]
    assert [r.email for r in results] == [f"{name}@staff.test" for name in STAFF]
    assert {r.status for r in results} == {"found"}
    assert {r.verification_status for r in results} == {"valid"}
    stats = tb.host_stats("mx.staff.test")
    assert (stats.sessions, stats.mail_from) == (1, 1)  # one connection, one transaction
    locals_ = _locals(stats.rcpts)
    assert locals_[0].startswith("vm-probe-") and locals_[1:] == list(STAFF)  # one probe


async def test_a_shared_session_is_renewed_before_the_server_hangs_up(
    engine: Engine, tb: Testbed, settings: Settings
) -> None:
    """Three people with no mailbox cost 24 refused candidates plus the refused probe: the
    session is replaced after every ``smtp_max_rejections_per_session`` (9) refusals, so the
    server's own limit (it hangs up at 10) is never reached, and the last person, who does
    exist, is still found."""
    people = [("Nora", "Nobody"), ("Otto", "Other"), ("Pia", "Person"), ("Ann", "Lee")]
    async with DomainSession(engine.prober) as session:
        results = [
            await find_email(engine, first, last, "staff.test", max_probes=8, session=session)
            for first, last in people
        ]
    assert [r.status for r in results] == ["not_found"] * 3 + ["found"]
    assert all("refused all 8" in (r.reason or "") for r in results[:3])
    assert results[3].email == "ann.lee@staff.test"
    stats = tb.host_stats("mx.staff.test")
    assert stats.rejections == 1 + 3 * 8
    assert stats.hangups == 0
    limit = settings.smtp_max_rejections_per_session
    assert stats.sessions == math.ceil(stats.rejections / limit) == 3
    assert sum(r.startswith("vm-probe-") for r in stats.rcpts) == 1


async def test_a_candidate_met_by_the_servers_421_is_asked_again_in_a_new_session(
    engine: Engine, tb: Testbed
) -> None:
    """The probe, john.smith and john are refused; the server then sends 421 and hangs up,
    and the prober reads that 421 as the reply to jsmith. It was recorded as jsmith's answer
    (John Smith "not found" though his mailbox exists); now jsmith is asked again in a new
    session."""
    async with DomainSession(engine.prober) as session:
        john = await find_email(engine, "John", "Smith", "drop.test", max_probes=8, session=session)
        ann = await find_email(engine, "Ann", "Lee", "drop.test", max_probes=8, session=session)
    assert (john.status, john.email) == ("found", "jsmith@drop.test")
    assert ann.status == "not_found" and "refused all 8" in (ann.reason or "")
    stats = tb.host_stats("mx.drop.test")
    locals_ = _locals(stats.rcpts)  # (what the server read: not the RCPT it hung up on)
    assert locals_.count("jsmith") == 1 and len(locals_) == len(set(locals_)) == 1 + 3 + 8


async def test_a_catch_all_domain_is_probed_once_for_everyone(engine: Engine, tb: Testbed) -> None:
    async with DomainSession(engine.prober) as session:
        results = [
            await find_email(engine, first, "Smith", "catchall.test", max_probes=8, session=session)
            for first in ("John", "Jane", "Jim")
        ]
    assert [r.email for r in results] == [
        f"{first}.smith@catchall.test" for first in ("john", "jane", "jim")
    ]
    assert {r.status for r in results} == {"catch_all"} and not any(r.found for r in results)
    stats = tb.host_stats("mx.catchall.test")
    assert stats.sessions == 1 and len(stats.rcpts) == 1  # the probe, nothing else


async def test_a_server_that_breaks_every_session_is_given_up_for_the_rest(
    engine: Engine, tb: Testbed
) -> None:
    """It resets the connection at every RCPT: after three broken sessions in a row the
    domain is given up for the other rows too (each person used to reopen a session)."""
    people = [("Ann", "Lee"), ("Bob", "Stone"), ("Cy", "Dee"), ("Di", "Eve"), ("Ed", "Fox")]
    async with DomainSession(engine.prober) as session:
        results = [
            await find_email(engine, first, last, "reset.test", max_probes=8, session=session)
            for first, last in people
        ]
    assert {r.status for r in results} == {"not_found"}
    assert all("try again later" in (r.reason or "") for r in results), results
    assert tb.host_stats("mx.reset.test").sessions == 3  # MAX_ATTEMPTS, then no more


async def test_a_session_serves_one_domain_only(engine: Engine, tb: Testbed) -> None:
    async with DomainSession(engine.prober) as session:
        await find_email(engine, "John", "Smith", "people.test", max_probes=8, session=session)
        with pytest.raises(ValueError, match=r"people\.test"):
            await find_email(engine, "John", "Smith", "jsmith.test", max_probes=8, session=session)


@pytest.mark.parametrize(
    ("domain", "words"),
    [
        ("doesnotexist.test", "does not exist"),
        ("null.test", "null MX"),
        ("broken.test", "unknown"),
    ],
)
async def test_dns_failures_are_not_found_without_smtp(
    engine: Engine, tb: Testbed, domain: str, words: str
) -> None:
    result = await find_email(engine, "John", "Smith", domain, max_probes=MAX_PROBES)

    assert result.status == "not_found" and result.email is None and result.confidence == 0
    assert words in result.reason
    assert tb.total_stats().sessions == 0


async def test_private_mx_is_not_found_without_any_connection(engine: Engine, tb: Testbed) -> None:
    result = await find_email(engine, "John", "Smith", "private.test", max_probes=MAX_PROBES)

    assert result.status == "not_found" and result.email is None
    assert "private" in result.reason
    assert tb.total_stats().sessions == 0


@pytest.mark.parametrize(
    ("domain", "host", "words"),
    [
        ("grey.test", "mx.grey.test", "greylisting"),
        ("block.test", "mx.block.test", "refused our sending IP"),  # (a block list)
    ],
)
async def test_unreadable_servers_are_not_found_and_say_so(
    engine: Engine, tb: Testbed, domain: str, host: str, words: str
) -> None:
    """Greylisting is not waited out in an interactive lookup: one session, then a reason."""
    result = await find_email(engine, "John", "Smith", domain, max_probes=MAX_PROBES)

    assert result.status == "not_found" and result.email is None and result.confidence == 0
    assert words in result.reason and "could not be checked" in result.reason
    assert tb.host_stats(host).sessions == 1


async def test_disposable_and_free_domains_are_refused_without_network(
    engine: Engine, tb: Testbed
) -> None:
    disposable = await find_email(engine, "John", "Smith", "throwaway.test", max_probes=8)
    assert disposable.status == "not_found" and "disposable" in disposable.reason

    free = await find_email(engine, "John", "Smith", "Gmail.com", max_probes=8)
    assert free.status == "not_found" and "free email provider" in free.reason
    assert free.domain == "gmail.com"

    assert not tb.dns_queries
    assert tb.total_stats().sessions == 0


# --- never a role inbox --------------------------------------------------------------------


async def test_a_person_called_info_sales_never_gets_a_role_inbox(
    engine: Engine, tb: Testbed
) -> None:
    is_role = engine.lists.is_role

    only_roles = await find_email(engine, "Info", "Sales", "infoonly.test", max_probes=8)
    assert only_roles.status == "not_found" and only_roles.email is None
    probed = _locals(tb.host_stats("mx.infoonly.test").rcpts)
    assert "info" not in probed and "sales" not in probed and "info.sales" not in probed
    assert not any(is_role(local) for local in probed)
    assert not any(is_role(a.rpartition("@")[0]) for a in only_roles.alternatives)

    catch_all = await find_email(engine, "Info", "Sales", "catchall.test", max_probes=8)
    assert catch_all.status == "catch_all" and catch_all.email is not None
    assert not is_role(catch_all.email.rpartition("@")[0])
    assert tb.host_stats("mx.catchall.test").rcpt_to == 1

    # On a domain where the person's role-like name exists as a role inbox, still none.
    people = await find_email(engine, "Info", "Sales", "people.test", max_probes=8)
    assert people.email is None
    assert "info" not in _locals(tb.host_stats("mx.people.test").rcpts)

    # Role names written together ("firstlast" of "Sales Team") are role inboxes too.
    for first, last in (("Sales", "Team"), ("Tech", "Support")):
        team = await find_email(engine, first, last, "teams.test", max_probes=8)
        assert team.status == "not_found" and team.email is None, team
    assert not any(is_role(local) for local in _locals(tb.host_stats("mx.teams.test").rcpts))
    assert "salesteam" not in _locals(tb.host_stats("mx.teams.test").rcpts)


# --- input errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "last", "domain", "field", "words"),
    [
        ("John", "Smith", "", "domain", "empty"),
        ("John", "Smith", "127.0.0.1", "domain", "IP address"),
        ("John", "Smith", "[127.0.0.1]", "domain", "IP address"),
        ("John", "Smith", "acme", "domain", "no dot"),
        ("John", "Smith", "localhost", "domain", "no dot"),
        ("John", "Smith", "acme..test", "domain", "two dots"),
        ("John", "Smith", "john@acme.test", "domain", "not an email address"),
        ("John", "Smith", "ac me.test", "domain", "space"),
        ("!!!", "Smith", "people.test", "first_name", "first name"),
        ("John", " - ", "people.test", "last_name", "last name"),
        ("   ", "Smith", "people.test", "first_name", "first name"),
    ],
)
async def test_bad_input_raises_finder_input_error_before_any_network(
    engine: Engine, tb: Testbed, first: str, last: str, domain: str, field: str, words: str
) -> None:
    with pytest.raises(FinderInputError) as caught:
        await find_email(engine, first, last, domain, max_probes=8)
    assert caught.value.field == field
    assert words in caught.value.detail, caught.value.detail
    assert not tb.dns_queries


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("@example.com", "example.com"),
        ("http://example.com:8080/path", "example.com"),
        ("www.example.com", "example.com"),
        ("mail.example.com", "mail.example.com"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("www.www.example.com", "example.com"),  # normalising twice gives the same domain
        ("example.com\u200b", "example.com"),  # an invisible space pasted with it
    ],
)
def test_domain_normalisation(raw: str, expected: str) -> None:
    assert normalise_finder_domain(raw) == expected
    assert normalise_finder_domain(expected) == expected


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        ("-acme.test", "A domain cannot have a hyphen at its start."),
        ("acme-.test", "A domain cannot have a period and a hyphen next to each other."),
        ("xn--zz.test", "The domain is not valid IDNA (Invalid A-label)."),
    ],
)
def test_a_bad_domain_is_explained_as_a_domain(raw: str, detail: str) -> None:
    """The syntax module's sentences are about addresses and their "@"; the caller gave a
    domain, and was told about "an email address" and an "@" it never typed."""
    with pytest.raises(FinderInputError) as caught:
        normalise_finder_domain(raw)
    assert caught.value.detail == detail


def test_a_name_is_too_long_the_same_way_for_a_lookup_and_a_job_row() -> None:
    """Only the API's model limited names to 100 characters: a CSV row with a longer one
    was looked up and charged, where the same request got a 422."""
    check_names("J" * 100, "Smith")
    with pytest.raises(FinderInputError) as caught:
        check_names("J" * 101, "Smith")
    assert (caught.value.field, caught.value.detail) == (
        "first_name",
        "The first name is longer than 100 characters.",
    )


# --- the command line ------------------------------------------------------------------------


def _run_cli(tb: Testbed, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_verimail(["find", *args], clean_env(env_for_testbed(tb)), cwd=tmp_path)


def test_cli_find_prints_json(tb: Testbed, tmp_path: Path) -> None:
    done = _run_cli(tb, tmp_path, "John", "Smith", "jsmith.test", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["status"] == "found" and body["email"] == "jsmith@jsmith.test"
    assert body["alternatives"] == ["john.smith@jsmith.test", "john@jsmith.test"]
    assert tb.host_stats("mx.jsmith.test").sessions == 1

    table = _run_cli(tb, tmp_path, "John", "Smith", "catchall.test")
    assert table.returncode == 0, table.stderr
    assert "catch_all" in table.stdout and "john.smith@catchall.test" in table.stdout


def test_cli_find_refuses_a_bad_domain(tb: Testbed, tmp_path: Path) -> None:
    done = _run_cli(tb, tmp_path, "John", "Smith", "10.0.0.1")
    assert done.returncode == 2
    assert "IP address" in folded(done.stderr)
    assert tb.total_stats().sessions == 0


VARIANT_MAILBOXES = [
    ("Jürgen", "Müller", "juergen.mueller"),  # umlauts spelled out
    ("José", "García Márquez", "jose.garcia"),  # first of two surnames
    ("Ludwig", "van der Berg", "ludwig.berg"),  # particles dropped
    ("Jean-Luc", "Picard", "jean-luc.picard"),  # hyphen kept
    ("Mary Ann", "Smith", "mary.smith"),  # first of two given names
]


@pytest.mark.parametrize(("first", "last", "mailbox"), VARIANT_MAILBOXES)
async def test_a_variant_of_the_name_is_found_within_the_default_probes(
    testbed_factory, tmp_path, testbed_settings, first, last, mailbox
):
    """Every variant ranked behind the 15 base patterns, so with the default 8 probes none
    was ever tried and these people were not_found."""
    host = HostSpec("mx.corp.test", HostBehaviour(mailboxes={m for *_, m in VARIANT_MAILBOXES}))
    tb = testbed_factory(World.of([host], [DomainSpec("corp.test", mx=[(10, "mx.corp.test")])]))
    settings = testbed_settings(tb, tmp_path)
    assert settings.finder_max_probes == Settings.model_fields["finder_max_probes"].default
    result = await find_email(
        Engine(settings), first, last, "corp.test", max_probes=settings.finder_max_probes
    )
    assert (result.status, result.email) == ("found", f"{mailbox}@corp.test")


async def test_a_server_that_puts_every_recipient_off_is_not_asked_again_by_later_rows(
    testbed_factory, tmp_path, testbed_settings
):
    """A greylisting server answers 450 to every new recipient: a CSV job's rows at that
    domain sent the catch-all probe and 8 candidates each (180 RCPTs for 20 people). The
    first 4xx now answers every candidate and every later row, which say: try later."""
    host = HostSpec("mx.grey.test", HostBehaviour(mailboxes={"john.smith"}, greylist_tries=99))
    tb = testbed_factory(World.of([host], [DomainSpec("grey.test", mx=[(10, "mx.grey.test")])]))
    settings = testbed_settings(tb, tmp_path)
    engine = Engine(settings)
    async with DomainSession(engine.prober) as session:
        results = [
            await find_email(
                engine, f"Person{i}", "Smith", "grey.test", max_probes=8, session=session
            )
            for i in range(20)
        ]
    assert {r.status for r in results} == {"not_found"}
    assert all("try again later" in r.reason for r in results), results[-1].reason
    assert tb.host_stats("mx.grey.test").rcpt_to == 1  # the catch-all probe only


async def test_a_full_mailbox_is_the_persons_address(testbed_factory, tmp_path, testbed_settings):
    """552 5.2.2 says the mailbox is there, only full. It was counted as a refusal: the
    lookup went on and answered jsmith (perhaps someone else), or said every address was
    refused. Now it stops at the full mailbox and answers it, as risky as the verifier
    calls it, and a full mailbox after the made-up address was refused is charged."""
    hosts = [
        HostSpec("mx.full.test", HostBehaviour(full_mailboxes={"john.smith"}, mailboxes={"jsmith"}))
    ]
    tb = testbed_factory(World.of(hosts, [DomainSpec("full.test", mx=[(10, "mx.full.test")])]))
    result = await find_email(
        Engine(testbed_settings(tb, tmp_path)), "John", "Smith", "full.test", max_probes=8
    )
    assert (result.status, result.email) == ("found", "john.smith@full.test")
    assert result.verification_status == "risky" and "full" in result.reason
    assert 0 < result.confidence < pattern_confidence(0)
    assert "jsmith@full.test" not in tb.host_stats("mx.full.test").rcpts


async def test_a_pass_that_a_retry_follows_asks_a_greylisting_server_every_candidate(
    testbed_factory, tmp_path, testbed_settings
):
    """Greylisting passes a (sender, recipient) pair only when it is asked again, so a job's
    retry could only find an address its first pass asked. With ``open_greylist`` the first
    lookup asks the catch-all probe and every candidate once (all put off: not_found, and
    ``unchecked`` says greylisted); a later lookup in a new session then finds jsmith."""
    host = HostSpec("mx.grey.test", HostBehaviour(mailboxes={"jsmith"}, greylist_tries=1))
    tb = testbed_factory(World.of([host], [DomainSpec("grey.test", mx=[(10, "mx.grey.test")])]))
    engine = Engine(testbed_settings(tb, tmp_path))
    async with DomainSession(engine.prober, open_greylist=True) as session:
        first = await find_email(
            engine, "John", "Smith", "grey.test", max_probes=MAX_PROBES, session=session
        )
    assert (first.status, first.unchecked) == ("not_found", "greylisted")
    assert "try again later" in first.reason
    assert len(first.alternatives) == MAX_PROBES  # every candidate asked, none stopped at
    assert tb.host_stats("mx.grey.test").rcpt_to == 1 + MAX_PROBES
    async with DomainSession(engine.prober) as session:
        again = await find_email(
            engine, "John", "Smith", "grey.test", max_probes=MAX_PROBES, session=session
        )
    assert (again.status, again.email, again.unchecked) == ("found", "jsmith@grey.test", None)
    without = await find_email(engine, "Jane", "Doe", "grey.test", max_probes=MAX_PROBES)
    assert (without.status, without.unchecked) == ("not_found", "greylisted")
    assert without.alternatives == ["jane.doe@grey.test"]  # (its 4xx ended it, as before)
