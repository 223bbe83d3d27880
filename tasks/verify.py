"""The Prefect tasks of a verification pass, each a thin unit over the engine: prepare the
addresses (syntax, lists, DNS once per domain, grouped by mail host) and verify chunks of
host groups over SMTP. The verify pipeline (``tasks/pipeline.py``) composes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from verimail.config import current_settings
from verimail.engine import GroupResult, HostGroup, Prepared, shared_engine

MAX_CHUNKS = 100  # task runs per job, whatever its size
MIN_CHUNK_ADDRESSES = 200  # below this, one task does it all


def chunk_groups(groups: Sequence[HostGroup]) -> list[list[HostGroup]]:
    """Pack host groups into at most ``MAX_CHUNKS`` chunks of similar size (largest first)."""
    total = sum(g.size for g in groups)
    if not groups:
        return []
    n = max(1, min(MAX_CHUNKS, len(groups), math.ceil(total / MIN_CHUNK_ADDRESSES)))
    chunks: list[list[HostGroup]] = [[] for _ in range(n)]
    loads = [0] * n
    for group in sorted(groups, key=lambda g: g.size, reverse=True):
        i = loads.index(min(loads))
        chunks[i].append(group)
        loads[i] += group.size
    return [c for c in chunks if c]


@task(name="verify-host-groups", persist_result=False, cache_policy=NO_CACHE)
async def verify_host_groups(
    groups: list[HostGroup], greylist_retries: int | None = None
) -> list[GroupResult]:
    """SMTP for a chunk of host groups; sessions are shared within each group."""
    engine = shared_engine(current_settings())
    return await engine.run_groups(groups, greylist_retries=greylist_retries)


@task(name="prepare-addresses", persist_result=False, cache_policy=NO_CACHE)
async def prepare_addresses(addresses: list[str]) -> Prepared:
    """Syntax, lists and DNS once per unique domain; SMTP work grouped by mail host."""
    return await shared_engine(current_settings()).prepare(addresses)
