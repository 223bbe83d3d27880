"""The prober's session handling against the loopback testbed: the defects found in review
(issue 22, point 5), each reproduced on real SMTP sessions."""

from __future__ import annotations

import pytest

from verimail.schemas.outcomes import Status, SubStatus
from verimail.tasks.engine import Engine
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
