"""`verimail verify` answers by its deadline, greylisting at once, and waits it out only
when asked (`--retry-greylisted [DELAY]`), against the testbed's postgrey and silent hosts."""

from __future__ import annotations

import json
import subprocess

from api_helpers import PATIENCE, VERIMAIL_BIN, clean_env, env_for_testbed, host_per_domain

from verimail.testbed.world import HostBehaviour, World


def _world() -> World:
    hosts = {
        "grey.test": HostBehaviour(mailboxes={"alice", "bob"}, greylist_delay=1.0),
        "silent.test": HostBehaviour(hostile="silent"),
    }
    return host_per_domain(hosts)


def _verify(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VERIMAIL_BIN), "verify", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )


def test_verify_deadline_greylisting_and_the_inline_retry(testbed_factory, tmp_path):
    tb = testbed_factory(_world())
    env = clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path),
            "VERIMAIL_SMTP_CONNECT_TIMEOUT": "30",
            "VERIMAIL_SMTP_GREYLIST_DELAY": "30",  # in-run back-off the CLI must not use
        }
    )
    # (6 s: the greylisting server's answer must come by then on a busy machine too; the
    # silent one's never does)
    first = _verify(["alice@grey.test", "alice@silent.test", "--timeout", "6"], env)
    assert first.returncode == 0, first.stderr
    grey, silent = (json.loads(line) for line in first.stdout.splitlines())
    assert (grey["sub_status"], grey["retry_after"]) == ("greylisted", 300)
    assert (silent["status"], silent["sub_status"]) == ("unknown", "timeout")
    assert tb.host_stats("mx.grey.test").rcpt_to == 2  # asked once (and the catch-all probe)

    waited = _verify(["bob@grey.test", "--retry-greylisted", "1.2"], env)
    assert waited.returncode == 0, waited.stderr
    (bob,) = (json.loads(line) for line in waited.stdout.splitlines())
    assert (bob["status"], bob["retry_after"]) == ("valid", None)
    assert "asking again about 1 greylisted address" in waited.stderr
