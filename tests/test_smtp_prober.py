"""The prober's session handling against the loopback testbed: the defects found in review
(issue 22, point 5), each reproduced on real SMTP sessions."""

from __future__ import annotations

import random

import pytest

from verimail.engine.core import Engine
from verimail.engine.smtp import prober as smtp_probe
from verimail.schemas.outcomes import Status, SubStatus
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World


@pytest.mark.parametrize("mode", ["rcpt_code_999", "rcpt_code_garbage"])
async def test_an_out_of_range_reply_code_breaks_the_session_and_the_next_mx_answers(
    testbed_factory, tmp_path, testbed_settings, mode
):
    """A RCPT answered ``999`` is no answer, as one whose code is no number is none: both
    break the session, the host is dropped after its tries, and the backup MX gives the
    verdicts (the 999 used to be recorded as every recipient's protocol error)."""
    tb = testbed_factory(
        World.of(
            [
                HostSpec("mx1.odd.test", HostBehaviour(hostile=mode)),
                HostSpec("mx2.odd.test", HostBehaviour(mailboxes={"alice"})),
            ],
            [DomainSpec("odd.test", mx=[(10, "mx1.odd.test"), (20, "mx2.odd.test")])],
        )
    )
    batch = await Engine(testbed_settings(tb, tmp_path)).verify_many(
        ["alice@odd.test", "nobody@odd.test"]
    )
    assert [(r.status, r.sub_status) for r in batch.results] == [
        (Status.VALID, SubStatus.OK),
        (Status.INVALID, SubStatus.MAILBOX_NOT_FOUND),
    ]
    assert tb.host_stats("mx2.odd.test").rcpt_to >= 2


async def test_two_mx_names_for_one_server_share_its_session_cap(
    testbed_factory, tmp_path, testbed_settings
):
    """Two domains whose MX names differ but lead to one server (one IP address) are two
    host groups; the politeness cap is the server's, so together they hold at most
    ``smtp_max_sessions_per_host`` sessions there (it was per name: twice as many)."""
    boxes = {f"u{i}" for i in range(40)}
    real = HostSpec("mx.real.test", HostBehaviour(mailboxes=boxes, reply_delay=0.01))
    domains = [
        DomainSpec("a.test", mx=[(10, "mx.real.test")]),
        DomainSpec("b.test", mx=[(10, "mx.alias.test")]),
    ]
    tb = testbed_factory(World.of([real], domains[:1]))
    alias = HostSpec("mx.alias.test", address=tb.address_of("mx.real.test"))
    tb.replace_world(World.of([real, alias], domains))
    settings = testbed_settings(
        tb, tmp_path, smtp_max_sessions_per_host=2, smtp_rcpts_per_session=5
    )
    addresses = [f"u{i}@{d}" for d in ("a.test", "b.test") for i in range(40)]
    batch = await Engine(settings).verify_many(addresses)
    assert {r.status for r in batch.results} == {Status.VALID}
    stats = tb.host_stats("mx.real.test")
    assert stats.sessions >= 2 * 40 // 5  # (both groups' sessions went to the one server)
    assert stats.peak_concurrent <= 2


async def test_the_recipient_limit_learnt_from_a_452_is_the_servers(
    testbed_factory, tmp_path, testbed_settings
):
    """A server that takes 5 RCPTs per connection, rejections included (Postfix counts
    accepted ones per message; the cap here counts every RCPT, which is never too low for
    either). The 452 taught the recipients *accepted in the transaction*: 3 here, and
    later 2, so 3-5 times the sessions needed. Now it learns 5, and 31 RCPTs (30
    addresses and the catch-all probe) take 7 sessions."""
    good = [f"u{i}@five.test" for i in range(20)]
    bad = [f"nobody{i}@five.test" for i in range(10)]
    mixed = [a for pair in zip(good[::2], good[1::2], bad, strict=True) for a in pair]
    host = HostBehaviour(mailboxes={a.split("@")[0] for a in good}, max_rcpts_per_session=5)
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.five.test", host)], [DomainSpec("five.test", mx=[(10, "mx.five.test")])]
        )
    )
    engine = Engine(testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=1))
    batch = await engine.verify_many(mixed)
    assert [r.status for r in batch.results] == [
        Status.INVALID if a.startswith("nobody") else Status.VALID for a in mixed
    ]
    assert engine.prober.learned.rcpt_limit(tb.address_of("mx.five.test")) == 5
    assert tb.host_stats("mx.five.test").sessions == 7


def _shared_host_world(
    groups: int, per_group: int, reply_delay: float = 0.0
) -> tuple[World, list[str]]:
    """``groups`` domains, each its own host group (a backup MX of its own, which is down),
    all sharing one primary that takes one connection at once."""
    boxes = {f"u{i}" for i in range(per_group)}
    one = HostBehaviour(mailboxes=boxes, max_connections=1, reply_delay=reply_delay)
    hosts = [HostSpec("mx.one.test", one)]
    domains = []
    for g in range(groups):
        hosts.append(HostSpec(f"backup.g{g}.test", HostBehaviour(refuse_connections=True)))
        domains.append(
            DomainSpec(f"g{g}.test", mx=[(10, "mx.one.test"), (20, f"backup.g{g}.test")])
        )
    addresses = [f"u{i}@g{g}.test" for g in range(groups) for i in range(per_group)]
    return World.of(hosts, domains), addresses


async def test_a_one_connection_host_shared_by_several_groups_answers_them_all(
    testbed_factory, tmp_path, testbed_settings, monkeypatch
):
    """Three host groups share a primary that takes one connection at once. The groups'
    last workers waited a fixed schedule (15.5 s; shortened here so that the others'
    work outlasts it) while the others kept winning the connection, then wrote the host
    off (its backups are down): their addresses came back unknown. Now they queue for the
    one connection as the sessions before them end, however long that takes."""
    monkeypatch.setattr(smtp_probe, "CROWDED_WAITS", (0.05, 0.1))
    world, addresses = _shared_host_world(groups=3, per_group=100, reply_delay=0.003)
    tb = testbed_factory(world)
    settings = testbed_settings(
        tb, tmp_path, smtp_max_sessions_per_host=5, smtp_rcpts_per_session=10
    )
    batch = await Engine(settings).verify_many(addresses)
    unknown = [(r.email, r.smtp_response) for r in batch.results if r.status is not Status.VALID]
    assert unknown == []


async def test_a_tarpit_beyond_the_command_timeout_spends_no_valid_recipients_tries(
    testbed_factory, tmp_path, testbed_settings
):
    """After a session's first rejection the server waits 1 s before every reply, past
    the 0.3 s command timeout. The recipient asked then timed out, went back behind the
    rest of its claim, was asked after a rejection again and timed out again until its
    tries were spent: addresses came back unknown. Now the timeout after rejections
    reads as the server's limit (sessions end at their first rejection, as after a
    hang-up) and the recipient is asked first in the next session, uncounted."""
    good = [f"u{i}@pit.test" for i in range(10)]
    bad = [f"nobody{i}@pit.test" for i in range(10)]
    mixed = good + bad
    random.Random(1).shuffle(mixed)
    # The tarpit's replies never come within the timeout; the others must, on a busy
    # machine too (at 0.3 s they could miss it: issue 48; each tarpitted reply costs the
    # timeout, so it stays short).
    pit = HostBehaviour(mailboxes={a.split("@")[0] for a in good}, tarpit_delay=60.0)
    tb = testbed_factory(
        World.of([HostSpec("mx.pit.test", pit)], [DomainSpec("pit.test", mx=[(10, "mx.pit.test")])])
    )
    settings = testbed_settings(
        tb, tmp_path, smtp_max_sessions_per_host=1, smtp_command_timeout=1.0
    )
    batch = await Engine(settings).verify_many(mixed)
    assert [(r.email, r.status) for r in batch.results] == [
        (a, Status.INVALID if a.startswith("nobody") else Status.VALID) for a in mixed
    ]


async def test_sessions_ending_early_at_rejections_bring_more_sessions(
    testbed_factory, tmp_path, testbed_settings
):
    """90 unknown recipients at one host that allows 5 sessions: the first count of
    sessions assumed full ones (100 recipients), so one session did it all, ending at
    every 9th rejection and opening the next itself. Now sessions that end early start
    more workers, up to the cap."""
    tb = testbed_factory(
        World.of(
            [HostSpec("mx.bad.test", HostBehaviour(reply_delay=0.01))],
            [DomainSpec("bad.test", mx=[(10, "mx.bad.test")])],
        )
    )
    settings = testbed_settings(tb, tmp_path, smtp_max_sessions_per_host=5)
    batch = await Engine(settings).verify_many([f"nobody{i}@bad.test" for i in range(90)])
    assert {r.sub_status for r in batch.results} == {SubStatus.MAILBOX_NOT_FOUND}
    stats = tb.host_stats("mx.bad.test")
    assert stats.sessions == 11  # 91 rejections (with the catch-all probe), 9 a session
    assert stats.peak_concurrent >= 4
