"""Planning a big job's shards (issue 47): linear in its rows, and no DNS for a row that has
no domain. (The shards' runs: tests/test_sharded_jobs.py.)"""

from __future__ import annotations

import asyncio

from verimail.config import using_settings
from verimail.engine.core import forget_engine
from verimail.files.shards import read_shard_input
from verimail.tasks.shards import domain_of, pack, plan_shards
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

ONE_DOMAIN = 200_000


def test_pack_deals_200000_domains_whole_into_the_fewest_shards_that_fit():
    """200,000 domains of one address each (what 200,000 rows without an ``@`` were before
    they had no domain), in groups of four, in shards of the default 50,000: every domain in
    exactly one shard, each group whole, no shard over the limit, shards largest first.
    (Quadratic before: each append copied its shard's list.)"""
    domains = [f"d{i}.test" for i in range(ONE_DOMAIN)]
    sizes = dict.fromkeys(domains, 1)
    groups = [domains[i : i + 4] for i in range(0, ONE_DOMAIN, 4)]
    shards = pack(groups, sizes, limit=50_000)
    assert sorted(d for shard in shards for d in shard) == sorted(domains)
    loads = [len(shard) for shard in shards]
    assert max(loads) <= 50_000
    assert loads == sorted(loads, reverse=True)
    assert loads == [50_000] * 4  # (groups of 4 fill 4 shards of 50,000 exactly)
    shard_of = {d: n for n, shard in enumerate(shards) for d in shard}
    assert all(len({shard_of[d] for d in group}) == 1 for group in groups)


def test_planning_200000_rows_of_one_domain_asks_dns_only_for_real_domains(
    testbed_factory, testbed_settings, tmp_path
):
    """200,000 addresses of one domain and 1,000 rows without an ``@``, in shards of at most
    50,000: the domain is a shard of its own (a domain is never split), the rows without a
    domain another, each shard in input order; DNS was asked about the domain and never
    about a row without one (they are refused on syntax; before, each was a domain)."""
    world = World.of(
        [HostSpec("mx.one.test", HostBehaviour(accept_all=True))],
        [DomainSpec("one.test", mx=[(10, "mx.one.test")])],
    )
    tb = testbed_factory(world)
    settings = testbed_settings(tb, tmp_path)
    at_domain = [f"user{i}@one.test" for i in range(ONE_DOMAIN)]
    no_domain = [f"not-an-address-{i}" for i in range(1_000)]
    uniques = [a for pair in zip(at_domain, no_domain, strict=False) for a in pair]
    uniques += at_domain[len(no_domain) :]
    rows = {"user7@one.test": 3}
    try:
        with using_settings(settings):
            planned = asyncio.run(plan_shards.fn(tmp_path, uniques, rows, 50_000))
    finally:
        forget_engine(settings)
    assert planned == [(ONE_DOMAIN, ONE_DOMAIN + 2), (1_000, 1_000)]
    first = read_shard_input(tmp_path, 0)
    assert first["normalised"].to_list() == at_domain
    assert first.filter(first["normalised"] == "user7@one.test")["rows"].to_list() == [3]
    assert read_shard_input(tmp_path, 1)["normalised"].to_list() == no_domain
    asked = {name for name, _type in tb.dns_queries}
    assert "one.test" in asked
    assert not any(name.startswith("not-an-address") for name in asked), sorted(asked)[:5]


def test_domain_of():
    assert domain_of("Ann@Example.test") == "Example.test"
    assert domain_of("a@b@c.test") == "c.test"
    assert domain_of("not-an-address") == ""
    assert domain_of("trailing@") == ""
