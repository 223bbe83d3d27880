"""The declarative world: YAML/dict parsing, matching rules and the big-world generator."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import verimail
from verimail.testbed.world import (
    DomainSpec,
    HostBehaviour,
    HostSpec,
    World,
    generate_world,
    load_world,
)

DEMO = Path(verimail.__file__).parent / "data" / "worlds" / "demo.yaml"


def test_demo_world_has_every_scenario() -> None:
    world = load_world(DEMO)
    acme = world.domains["acme.test"]
    assert acme.mx == [(10, "mx1.acme.test"), (20, "mx2.acme.test")]
    assert world.hosts["mx1.acme.test"].behaviour.has_mailbox("info@acme.test")
    assert world.hosts["mx1.acme.test"].behaviour.is_full("full.box@acme.test")
    assert world.hosts["mx.catchall.test"].behaviour.accept_all
    assert world.domains["nullmx.test"].is_null_mx
    implicit = world.domains["implicit.test"]
    assert implicit.mx == [] and implicit.a == ["mail.implicit.test"]
    assert world.hosts["mx.greylist.test"].behaviour.greylist_tries > 0
    assert world.hosts["mx.blocked.test"].behaviour.block
    first, second = sorted(world.domains["fallback.test"].mx)
    assert world.hosts[first[1]].behaviour.refuse_connections
    assert world.hosts[second[1]].runs_server


def test_from_dict_accepts_the_documented_spellings() -> None:
    world = World.from_dict(
        {
            "dns_delay": 0.1,
            "hosts": {
                "MX.Example.TEST.": {"mailboxes": "Solo", "greylist_tries": 2},
                "nested.example.test": {"behaviour": {"accept_all": True}},
                "ssrf.example.test": {"address": "10.0.0.1"},
                "bare.example.test": None,
            },
            "domains": [
                {"name": "example.test", "mx": ["10 mx.example.test", [20, "nested.example.test"]]},
                {"name": "dict.test", "mx": [{"preference": 5, "host": "mx.example.test"}]},
                {"name": "implicit.test", "a": "ssrf.example.test", "txt": "v=spf1 -all"},
                {"name": "slow.test", "dns_delay": 0.5, "ttl": 60, "servfail": True},
            ],
        }
    )
    host = world.hosts["mx.example.test"]
    assert host.behaviour.mailboxes == {"solo"} and host.behaviour.greylist_tries == 2
    assert world.hosts["nested.example.test"].behaviour.accept_all
    assert world.hosts["ssrf.example.test"].address == "10.0.0.1"
    assert not world.hosts["ssrf.example.test"].runs_server
    assert world.hosts["bare.example.test"].behaviour == HostBehaviour()
    assert world.domains["example.test"].mx == [
        (10, "mx.example.test"),
        (20, "nested.example.test"),
    ]
    assert world.domains["dict.test"].mx == [(5, "mx.example.test")]
    assert world.domains["implicit.test"].txt == ["v=spf1 -all"]
    slow = world.domains["slow.test"]
    assert (slow.dns_delay, slow.ttl, slow.servfail) == (0.5, 60, True)
    assert world.dns_delay == 0.1
    assert world.host("MX.EXAMPLE.test.") is host
    # to_dict is the inverse of from_dict.
    assert World.from_dict(world.to_dict()) == world


@pytest.mark.parametrize(
    "data",
    [
        {"hostz": {}},
        {"hosts": {"mx.test": {"mailbox": ["typo"]}}},
        {"domains": {"d.test": {"mxx": []}}},
        {"domains": {"d.test": {"mx": ["10"]}}},
        {"hosts": {"mx.test": {"address": "not-an-ip"}}},
    ],
)
def test_from_dict_rejects_mistakes(data: dict) -> None:
    with pytest.raises(ValueError):
        World.from_dict(data)


def test_mailbox_matching_is_case_insensitive_by_local_part_or_full_address() -> None:
    b = HostBehaviour(mailboxes={"Alice", "bob@one.test"}, full_mailboxes={"Full"})
    assert b.has_mailbox("ALICE@any.test")
    assert b.has_mailbox("Bob@ONE.test")
    assert not b.has_mailbox("bob@two.test")
    assert b.has_mailbox("full@x.test") and b.is_full("FULL@x.test")
    assert not b.is_full("alice@x.test")


def test_world_of_normalises_names() -> None:
    world = World.of(
        [HostSpec("MX.A.Test.")], [DomainSpec("A.Test.", mx=[(10, "MX.A.TEST.")], a=["::1"])]
    )
    assert list(world.hosts) == ["mx.a.test"]
    assert world.domains["a.test"].mx == [(10, "mx.a.test")]
    assert world.domains["a.test"].a == ["::1"]


def test_generate_world_is_deterministic_skewed_and_consistent() -> None:
    world, addresses = generate_world(400, 40, 5, seed=7)
    again_world, again = generate_world(400, 40, 5, seed=7)
    assert addresses == again and world == again_world
    assert generate_world(400, 40, 5, seed=8)[1] != addresses
    assert len(world.domains) == 400 and len(world.hosts) == 40
    assert len(addresses) == 2000 and len({a.address for a in addresses}) == 2000

    per_host = Counter(d.mx[0][1] for d in world.domains.values())
    biggest = per_host.most_common(3)
    assert sum(n for _, n in biggest) > 400 * 0.25  # a few hosts serve a large share
    assert min(per_host.values()) <= 5  # and there is a long tail

    outcomes = Counter(a.expected for a in addresses)
    assert set(outcomes) == {"valid", "invalid", "catchall"}
    for item in addresses:
        behaviour = world.hosts[item.host].behaviour
        assert world.domains[item.domain].mx == [(10, item.host)]
        if item.expected == "catchall":
            assert behaviour.accept_all
        else:
            assert not behaviour.accept_all
            assert behaviour.has_mailbox(item.address) == (item.expected == "valid")
