"""Politeness is the service's, not one job's: SMTP session slots per mail host are shared by
every event loop of a process and, with Redis, by every process (``engine/smtp/host_slots.py``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid

import pytest
from api_helpers import PATIENCE, clean_env, env_for_testbed

from verimail.config import Settings
from verimail.engine.core import Engine
from verimail.engine.smtp import host_slots
from verimail.engine.smtp.host_slots import HostSlots, SharedSemaphore, host_semaphore
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

REDIS_URL = "redis://127.0.0.1:6379/0"


class _Gauge:
    """How many holders are inside at once, across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = self.peak = 0

    def enter(self) -> None:
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


def test_a_shared_semaphore_caps_every_event_loop_together() -> None:
    """Three threads, each with its own event loop (as the local runner runs jobs), 20
    holders each, cap 3: never more than 3 inside at once, all of them, and all 3 slots
    free at the end (each slot handed across loops without loss)."""
    sem, gauge, done = SharedSemaphore(3), _Gauge(), []

    async def holder() -> None:
        await sem.acquire()
        try:
            gauge.enter()
            await asyncio.sleep(0.002)  # the work done while holding
            gauge.leave()
        finally:
            sem.release()
        done.append(1)

    async def loop_body() -> None:
        await asyncio.gather(*(holder() for _ in range(20)))

    threads = [threading.Thread(target=asyncio.run, args=(loop_body(),)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(done) == 60
    assert gauge.peak == 3
    assert sem.free == 3


async def test_a_cancelled_waiter_never_keeps_a_slot() -> None:
    """A waiter cancelled while it waits leaves the queue; one cancelled after its slot was
    handed to it, before it could run, passes the slot on. Either way nothing leaks."""
    sem = SharedSemaphore(1)
    await sem.acquire()
    waiting = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)  # it queues
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    sem.release()
    assert sem.free == 1

    await sem.acquire()
    handed = asyncio.create_task(sem.acquire())
    await asyncio.sleep(0)
    sem.release()  # the slot is on its way to `handed` (call_soon_threadsafe)...
    handed.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await handed
    next_one = asyncio.create_task(sem.acquire())
    await asyncio.wait_for(next_one, PATIENCE)  # the slot was passed on, not lost
    sem.release()
    assert sem.free == 1


async def test_urgent_takers_go_before_queued_ones() -> None:
    """An API request's session (urgent) goes before a job's that queued earlier; among
    themselves, each kind is first come, first served."""
    sem = SharedSemaphore(1)
    await sem.acquire()
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await sem.acquire(urgent=urgent)
        order.append(name)

    tasks = [
        asyncio.create_task(take("job 1", False)),
        asyncio.create_task(take("job 2", False)),
        asyncio.create_task(take("api 1", True)),
        asyncio.create_task(take("api 2", True)),
    ]
    while sem.waiting < 4:
        await asyncio.sleep(0)
    for served in range(1, 5):
        sem.release()  # each taker keeps the slot it gets: the next release serves the next
        while len(order) < served:
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["api 1", "api 2", "job 1", "job 2"]
    sem.release()
    assert sem.free == 1


@pytest.mark.redis
async def test_redis_leases_cap_a_host_across_holders_and_expire() -> None:
    """Leases in Redis: with the process's own slots out of the way (a HostSlots per
    "process", per-host cap 2, distinct hosts per test), the third taker waits until one
    gives its lease back; a lease its process never gave back expires."""
    prefix = f"verimail-test-{uuid.uuid4().hex}"
    slots = HostSlots(2, 100, REDIS_URL, prefix=prefix)
    assert slots.leases is not None
    host = f"mx.{uuid.uuid4().hex}.test"
    try:
        first = await slots.leases.take(host, 2)
        second = await slots.leases.take(host, 2)
        assert first and second
        third = asyncio.create_task(slots.leases.take(host, 2))
        await asyncio.sleep(0.1)
        assert not third.done()  # both leases are held
        slots.leases.give_back(host, first)
        assert await asyncio.wait_for(third, PATIENCE)
        # A process that died holding `second`: its lease runs out and is swept.
        client = slots.leases._client
        client.zadd(slots.leases.key(host), {second: 0}, xx=True)  # (expired long ago)
        assert await asyncio.wait_for(slots.leases.take(host, 2), PATIENCE)
    finally:
        slots.leases._client.delete(slots.leases.key(host))
        slots.close()


@pytest.mark.redis
async def test_a_take_cancelled_while_redis_answers_leaves_no_lease() -> None:
    """The acquire script runs in a thread, which a cancelled take cannot stop: it still
    added the lease, which nobody held, renewed or gave back, and the slot stayed taken
    for a minute in every process. Now a lease taken that late is given back. (The script
    is slowed down so that the cancel lands while it runs.)"""
    slots = HostSlots(2, 100, REDIS_URL, prefix=f"verimail-test-{uuid.uuid4().hex}")
    leases = slots.leases
    assert leases is not None
    started, finished = threading.Event(), threading.Event()
    real_acquire = leases._acquire

    def slow_acquire(**kwargs):
        started.set()
        time.sleep(0.3)
        try:
            return real_acquire(**kwargs)
        finally:
            finished.set()

    leases._acquire = slow_acquire
    host = f"mx.{uuid.uuid4().hex}.test"
    key = leases.key(host)
    try:
        taking = asyncio.create_task(leases.take(host, 2))
        assert await asyncio.to_thread(started.wait, PATIENCE)
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        assert await asyncio.to_thread(finished.wait, PATIENCE)  # the script did add its lease
        deadline = time.monotonic() + PATIENCE
        while leases._client.zcard(key):  # (added by the script, then given back)
            assert time.monotonic() < deadline, "the cancelled take's lease was left in Redis"
            await asyncio.sleep(0.02)
    finally:
        leases._acquire = real_acquire
        leases._client.delete(key)
        slots.close()


@pytest.mark.redis
async def test_leases_are_renewed_while_the_event_loop_is_busy(monkeypatch) -> None:
    """A lease is renewed from a thread, not the session's event loop: a loop held by CPU
    work for longer than a lease lives (here 0.3 s leases, held 1 s) keeps its sessions'
    leases, so no other process can take the slot meanwhile; giving it back frees it."""
    monkeypatch.setattr(host_slots, "LEASE_SECONDS", 0.3)
    monkeypatch.setattr(host_slots, "RENEW_SECONDS", 0.05)
    slots = HostSlots(1, 10, REDIS_URL, prefix=f"verimail-test-{uuid.uuid4().hex}")
    leases = slots.leases
    assert leases is not None
    host = f"mx.{uuid.uuid4().hex}.test"
    key = leases.key(host)
    try:
        held = await slots.take(host)
        time.sleep(1.0)  # the loop is busy: no await, so no task of it runs
        assert leases._acquire(keys=[key], args=[1, 0.3, "another-process"]) == 0
        held.release()
        while leases._client.zcard(key):  # given back from a worker thread
            await asyncio.sleep(0.01)
        assert leases._acquire(keys=[key], args=[1, 0.3, "another-process"]) == 1
    finally:
        leases._client.delete(key)
        slots.close()


@pytest.mark.redis
async def test_closing_the_engine_stops_its_lease_renewer() -> None:
    """The API's shutdown (and forget() in the flows) closes the engine: the renewer thread
    a held lease started ends, and the Redis client is closed."""
    engine = Engine(Settings(redis_url=REDIS_URL))
    leases = engine.prober.slots.leases
    assert leases is not None
    host = f"mx.{uuid.uuid4().hex}.test"
    held = await engine.prober.slots.take(host)
    renewer = leases._renewer
    assert renewer is not None and renewer.is_alive()
    held.release()
    engine.close()
    await asyncio.to_thread(renewer.join, 10)
    assert not renewer.is_alive()


async def test_a_redis_outage_falls_back_to_the_process_slots(caplog) -> None:
    """Nothing listens at the Redis URL (connection refused, on loopback): a session still
    gets its slot — this process's own, the cap still held — with one warning, and later
    sessions do not ask Redis again until RETRY_SECONDS have passed."""
    slots = HostSlots(1, 10, "redis://127.0.0.1:1/0", prefix="unused")
    assert slots.leases is not None
    host = f"mx.{uuid.uuid4().hex}.test"
    held = await asyncio.wait_for(slots.take(host), PATIENCE)
    assert held._lease is None and slots.leases.down
    assert "SMTP host slots in Redis failed" in caplog.text
    waiting = asyncio.create_task(slots.take(host))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the process's own cap of 1 still holds
    held.release()
    again = await asyncio.wait_for(waiting, PATIENCE)
    again.release()
    sem = host_semaphore(host, 1)
    assert sem is None or sem.free == 1
    assert caplog.text.count("SMTP host slots in Redis failed") == 1
    slots.close()


_WORKER = """
import asyncio, sys
from verimail.config import Settings
from verimail.engine.core import Engine

async def main():
    engine = Engine(Settings())
    addresses = [f"user{i}@{sys.argv[1]}" for i in range(int(sys.argv[2]))]
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    batch = await engine.verify_many(addresses)
    print(sum(r.status.value == "valid" for r in batch.results), flush=True)

asyncio.run(main())
"""


def _one_host_world(host: str, domain: str) -> World:
    """One domain on one host that rejects every recipient, 10 ms per reply (so sessions
    overlap)."""
    return World.of(
        [HostSpec(host, HostBehaviour(reply_delay=0.01))], [DomainSpec(domain, mx=[(10, host)])]
    )


@pytest.mark.redis
def test_two_processes_share_a_hosts_sessions_through_redis(testbed_factory, tmp_path) -> None:
    """Two worker processes verify 30 addresses each on one mail host, with politeness 2
    and one recipient per session (so 60+ sessions): the host never sees more than 2
    sessions at once between them (each process alone would open 2)."""
    host = "mx.polite.test"
    tb = testbed_factory(_one_host_world(host, "polite.test"))
    env = clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_REDIS_URL": REDIS_URL,
            "VERIMAIL_SMTP_MAX_SESSIONS_PER_HOST": "2",
            "VERIMAIL_SMTP_RCPTS_PER_SESSION": "1",
            "VERIMAIL_DATA_DIR": str(tmp_path),
        }
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, "polite.test", "30"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready", worker.stderr
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [w.returncode for w in workers] == [0, 0], [err for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["0", "0"]  # every answer came (550)
    assert tb.wait_idle()
    stats = tb.host_stats(host)
    assert stats.sessions >= 60
    assert stats.peak_concurrent == 2


async def test_every_engine_in_a_process_shares_a_hosts_slots(
    testbed_factory, testbed_settings, tmp_path
) -> None:
    """Two engines (the API's and a job's) verifying on the same host at once, per-host cap
    2: together they never open more than 2 sessions, and the host's slots are gone after."""
    host = "mx.shared.test"
    tb = testbed_factory(_one_host_world(host, "shared.test"))
    settings = testbed_settings(
        tb, tmp_path, smtp_max_sessions_per_host=2, smtp_rcpts_per_session=1
    )
    engines = [Engine(settings), Engine(settings)]
    batches = await asyncio.gather(
        *(
            e.verify_many([f"u{i}-{n}@shared.test" for i in range(15)])
            for n, e in enumerate(engines)
        )
    )
    assert all(len(b.results) == 15 for b in batches)
    assert tb.wait_idle()
    stats = tb.host_stats(host)
    assert stats.sessions >= 30 and stats.peak_concurrent == 2
    assert host_semaphore(tb.address_of(host), 2) is None  # (slots are per server address)


async def test_a_learnt_connection_cap_queues_the_next_session() -> None:
    """A server turned a session away while this process had two open there: learn_cap
    lowers its slots to those two, so a third taker waits for one of them to end rather
    than dialling (the per-host cap of 3 would have let it in). Dials under way are no
    open sessions: with none open there is nothing to learn."""
    slots = HostSlots(per_host=3, total=10, redis_url=None)
    host = f"203.0.113.{uuid.uuid4().int % 250}"
    first, second, dialling = [await slots.take(host) for _ in range(3)]
    dialling.release()  # (turned away)
    assert not slots.learn_cap(host)  # nothing open yet
    first.opened()
    second.opened()
    assert slots.learn_cap(host)
    third = asyncio.create_task(slots.take(host))
    sem = host_semaphore(host, 3)
    assert sem is not None
    while sem.waiting < 1:  # (queued, not let in)
        await asyncio.sleep(0.005)
    assert not third.done() and sem.held == 2
    first.release()
    (await asyncio.wait_for(third, PATIENCE)).release()
    second.release()
    del sem
    assert host_semaphore(host, 3) is None  # forgotten with its last holder
