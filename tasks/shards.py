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

import heapq
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
    """The domain an address is sharded by: what follows its last ``@`` ("" for a string
    without one, which is no address: it is refused on syntax, with no DNS asked)."""
    _, at, domain = address.rpartition("@")
    return domain if at else ""


def pack(groups: Sequence[Sequence[str]], sizes: Mapping[str, int], limit: int) -> list[list[str]]:
    """``groups`` of domains (``sizes``: addresses per domain) dealt into shards of at most
    ``limit`` addresses where they fit; each shard's domains, shards largest first.

    O(n log n) in the number of domains: the shards' loads are kept in a heap, so the
    emptiest is found without looking at every shard, and a shard's domains are appended
    to its own list, never copied."""
    items: list[tuple[int, Sequence[str]]] = []
    for group in groups:
        size = sum(sizes[d] for d in group)
        if size <= limit:
            items.append((size, group))
        else:  # (too big for one shard: its domains are dealt one by one)
            items += [(sizes[d], [d]) for d in group]
    items.sort(key=lambda item: -item[0])
    total = sum(size for size, _ in items)
    shards: list[list[str]] = [[] for _ in range(max(1, math.ceil(total / limit)))]
    loads = [0] * len(shards)
    emptiest = [(0, n) for n in range(len(shards))]  # (load, shard): a heap, ties by number
    for size, domains in items:
        load, n = heapq.heappop(emptiest)
        if load and load + size > limit:  # (even the emptiest is too full: a new shard)
            heapq.heappush(emptiest, (load, n))
            n, load = len(shards), 0
            shards.append([])
            loads.append(0)
        shards[n].extend(domains)
        loads[n] = load + size
        heapq.heappush(emptiest, (loads[n], n))
    order = sorted(range(len(shards)), key=lambda n: -loads[n])
    return [shards[n] for n in order if shards[n]]


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
