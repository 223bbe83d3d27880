"""Learned limits across the fleet (issue 37, point 4): what one prober learns of a server —
its recipient limit from a 452, its error limit from a hang-up, that it will not mix
domains — a second prober with its own state (another worker) uses from its first session
there, through Redis; the testbed's counters show the second paying none of it. With Redis
down, each keeps its own lessons (``engine/smtp/learned.py``)."""

from __future__ import annotations

import pytest
import redis

from verimail.engine.core import Engine
from verimail.engine.smtp import learned
from verimail.schemas.outcomes import Status
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

REDIS_URL = "redis://127.0.0.1:6379/0"
HOST = "mx.strict.test"


def _world(domains: list[str], **behaviour) -> World:
    boxes = {f"u{i}" for i in range(60)}
    return World.of(
        [HostSpec(HOST, HostBehaviour(mailboxes=boxes, **behaviour))],
        [DomainSpec(d, mx=[(10, HOST)]) for d in domains],
    )


def _written() -> None:
    """Wait for the lessons written so far to reach Redis (one writer thread: a task
    submitted after them ends after them)."""
    learned._WRITES.submit(lambda: None).result(timeout=10)


@pytest.fixture
def shared(testbed_factory, testbed_settings, tmp_path):
    """``make(world) -> (tb, new_engine)``: a testbed and a maker of engines (each its own
    prober, as another worker would have) that share lessons through Redis; the server's
    key is cleared before and after."""
    client = redis.Redis.from_url(REDIS_URL)
    made: list[Engine] = []
    keys: list[str] = []

    def make(world: World):
        tb = testbed_factory(world)
        key = learned.LearnedLimits(None).key(tb.address_of(HOST))
        keys.append(key)
        client.delete(key)

        def new_engine(**overrides) -> Engine:
            settings = testbed_settings(tb, tmp_path, redis_url=REDIS_URL, **overrides)
            engine = Engine(settings)
            made.append(engine)
            return engine

        return tb, new_engine

    yield make
    for engine in made:
        engine.close()
    for key in keys:
        client.delete(key)
    client.close()


@pytest.mark.redis
async def test_a_recipient_limit_learnt_by_one_worker_spares_the_other_its_452s(shared):
    """The server says 452 after 5 RCPTs a connection. The first prober learns it from
    452s (their recipients asked again: more RCPTs than addresses); the second, with its own
    state, starts at 5 a session: not one 452, 31 RCPTs in 7 sessions."""
    tb, new_engine = shared(_world(["five.test"], max_rcpts_per_session=5))
    first = await new_engine(smtp_max_sessions_per_host=1).verify_many(
        [f"u{i}@five.test" for i in range(30)]
    )
    assert {r.status for r in first.results} == {Status.VALID}
    assert tb.wait_idle()
    assert tb.host_stats(HOST).rcpt_to > 31  # (the 452s: asked again)
    _written()
    tb.reset_stats()
    second = new_engine(smtp_max_sessions_per_host=1)
    batch = await second.verify_many([f"u{i}@five.test" for i in range(30, 60)])
    assert {r.status for r in batch.results} == {Status.VALID}
    assert tb.wait_idle()
    stats = tb.host_stats(HOST)
    assert stats.rcpt_to == 31  # 30 addresses and the catch-all probe, none asked twice
    assert stats.sessions == 7
    assert second.prober.learned.rcpt_limit(tb.address_of(HOST)) == 5


@pytest.mark.redis
async def test_an_error_limit_learnt_by_one_worker_spares_the_other_the_hang_ups(shared):
    """The server hangs up at a session's 3rd rejection. The first prober is hung up on
    and learns to stop at 2; the second is never hung up on."""
    tb, new_engine = shared(_world(["rej.test"], disconnect_after_rejections=3))
    first = await new_engine().verify_many([f"nobody{i}@rej.test" for i in range(20)])
    assert {r.status for r in first.results} == {Status.INVALID}
    assert tb.wait_idle()
    assert tb.host_stats(HOST).hangups >= 1
    _written()
    tb.reset_stats()
    batch = await new_engine().verify_many([f"nobody{i}@rej.test" for i in range(20, 40)])
    assert {r.status for r in batch.results} == {Status.INVALID}
    assert tb.wait_idle()
    stats = tb.host_stats(HOST)
    assert stats.hangups == 0
    assert stats.peak_session_rejections <= 2


@pytest.mark.redis
async def test_no_mixing_learnt_by_one_worker_gives_the_other_a_transaction_per_domain(shared):
    """The server refuses a second domain in one transaction (550 5.7.1). The first
    prober meets the refusal; the second sends each domain its own ``MAIL FROM`` from
    the start: its only rejections are the three catch-all probes."""
    domains = ["a.test", "b.test", "c.test"]
    tb, new_engine = shared(_world(domains, one_domain_per_transaction=True))
    addresses = [f"u{i}@{d}" for d in domains for i in range(2)]
    first = await new_engine().verify_many(addresses)
    assert {r.status for r in first.results} == {Status.VALID}
    assert tb.wait_idle()
    assert tb.host_stats(HOST).rejections > 3  # (the probes and the refused mix)
    _written()
    tb.reset_stats()
    again = [f"u{i}@{d}" for d in domains for i in range(2, 4)]
    batch = await new_engine().verify_many(again)
    assert {r.status for r in batch.results} == {Status.VALID}
    assert tb.wait_idle()
    stats = tb.host_stats(HOST)
    assert stats.rejections == 3
    assert stats.mail_from == 3


async def test_with_redis_down_a_prober_keeps_its_own_lessons(
    testbed_factory, testbed_settings, tmp_path, caplog
):
    """Nothing listens at the Redis URL: the run is answered, the 452 limit is learnt and
    used in this process, with one warning (not one per lesson or session)."""
    tb = testbed_factory(_world(["five.test"], max_rcpts_per_session=5))
    settings = testbed_settings(
        tb, tmp_path, redis_url="redis://127.0.0.1:1/0", smtp_max_sessions_per_host=1
    )
    engine = Engine(settings)
    try:
        batch = await engine.verify_many([f"u{i}@five.test" for i in range(30)])
        _written()
        assert {r.status for r in batch.results} == {Status.VALID}
        assert engine.prober.learned.rcpt_limit(tb.address_of(HOST)) == 5
        assert engine.prober.learned.down
        assert caplog.text.count("SMTP lessons in Redis failed") == 1
    finally:
        engine.close()
