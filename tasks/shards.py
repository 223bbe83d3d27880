"""Cutting a big job into shards (the ``plan-shards`` task): which addresses each shard
verifies.

By domain: every address of a domain is in the same shard, so a domain's catch-all probe
is sent once and its recipients share sessions; and domains the prober would serve over
the same sessions (the same mail servers: ``Engine.mail_groups``) stay together where they
fit, so shards do not compete for one server's session slots. Groups are dealt largest
first into the emptiest shard that has room (first fit decreasing, at most ``limit``
addresses a shard); a group larger than a shard is dealt domain by domain, and a single
domain larger than a shard is a shard of its own, whatever its size.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from verimail.config import current_settings
from verimail.engine import shared_engine
from verimail.files.shards import write_shard_input


def domain_of(address: str) -> str:
    """The domain an address is sharded by (none for an address without one)."""
    return address.rpartition("@")[2]


def pack(groups: Sequence[Sequence[str]], sizes: Mapping[str, int], limit: int) -> list[list[str]]:
    """``groups`` of domains (``sizes``: addresses per domain) dealt into shards of at most
    ``limit`` addresses where they fit; each shard's domains, shards largest first."""
    items: list[tuple[int, list[str]]] = []
    for group in groups:
        size = sum(sizes[d] for d in group)
        if size <= limit:
            items.append((size, list(group)))
        else:  # (too big for one shard: its domains are dealt one by one)
            items += [(sizes[d], [d]) for d in group]
    total = sum(size for size, _ in items)
    bins: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, math.ceil(total / limit)))]
    for size, domains in sorted(items, key=lambda item: -item[0]):
        n = min(range(len(bins)), key=lambda i: bins[i][0])
        if bins[n][0] and bins[n][0] + size > limit:
            bins.append((0, []))
            n = len(bins) - 1
        load, kept = bins[n]
        bins[n] = (load + size, kept + domains)
    return [domains for load, domains in sorted(bins, key=lambda b: -b[0]) if domains]


@task(name="plan-shards", persist_result=False, cache_policy=NO_CACHE)
async def plan_shards(
    job_directory: Path, uniques: list[str], rows: Mapping[str, int], limit: int
) -> list[tuple[int, int]]:
    """Cut ``uniques`` (a job's distinct addresses, ``rows`` the data rows each stands for)
    into shards and keep each one's addresses, in input order, in the job's folder
    (``files/shards.py``); returns each shard's (addresses, rows)."""
    sizes = Counter(domain_of(address) for address in uniques)
    engine = shared_engine(current_settings())
    groups = await engine.mail_groups([d for d in sizes if d])
    if "" in sizes:
        groups.append([""])
    shard_of = {
        domain: n for n, domains in enumerate(pack(groups, sizes, limit)) for domain in domains
    }
    members: list[list[str]] = [[] for _ in range(max(shard_of.values()) + 1)]
    for address in uniques:
        members[shard_of[domain_of(address)]].append(address)
    planned = []
    for n, addresses in enumerate(members):
        counts = [rows.get(address, 1) for address in addresses]
        write_shard_input(job_directory, n, addresses, counts)
        planned.append((len(addresses), sum(counts)))
    return planned
