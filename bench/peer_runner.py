"""Run the peer, ``py3-validate-email``, over a list of addresses against the testbed.

Executed by the peer's own virtual environment (``bench/.peer-venv``), so it imports nothing of
verimail or of ``bench``: only the standard library, dnspython and ``validate_email``.

The peer has no setting for a nameserver or an SMTP port, so this wrapper points it at the
testbed with the least invasive means, before the first call and without touching its code:

- DNS: its MX lookup is ``dns.resolver.resolve``, which uses ``dns.resolver.default_resolver``;
  that is replaced by a resolver whose only nameserver is the testbed's (no cache, as the
  default has none);
- the MX host's address: it connects with ``smtplib`` by host name, i.e. through
  ``socket.getaddrinfo`` and the system resolver, which does not know the testbed's names; a
  ``getaddrinfo`` shim asks the same testbed resolver for the A record (one query per
  connection, as a stub resolver without a cache would) and leaves IP literals alone;
- the port: ``smtplib.SMTP.default_port`` is set to the testbed's (25 when run as root);
- its disposable-list updater, which downloads from the internet at import, is turned off
  with its own switch ``PY3VE_IGNORE_UPDATER``.

It is called as a user would call it: ``validate_email(address, smtp_helo_host=...)`` (the
HELO name is given so that ``smtplib`` does not look up this machine's FQDN), from a thread
pool of ``--threads`` workers. Prints one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

os.environ["PY3VE_IGNORE_UPDATER"] = "1"  # before the import: it reads it at import time

import smtplib

import dns.resolver
from validate_email import validate_email

RESULT_PREFIX = "BENCH-RESULT "


def point_at(nameserver: str, smtp_port: int) -> None:
    host, _, port = nameserver.rpartition(":")
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = [host]
    resolver.port = int(port)
    dns.resolver.default_resolver = resolver
    smtplib.SMTP.default_port = smtp_port

    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(name, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            socket.inet_pton(socket.AF_INET, name)
        except (OSError, TypeError):
            if isinstance(name, str) and name not in ("localhost", ""):
                answer = resolver.resolve(name, "A", search=False)
                name = answer[0].to_text()
        return real_getaddrinfo(name, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nameserver", required=True, help="ip:port of the testbed's DNS")
    parser.add_argument("--smtp-port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--input", required=True, help="one address a line")
    parser.add_argument("--output", required=True, help="one result a line: true/false/null")
    args = parser.parse_args()
    point_at(args.nameserver, args.smtp_port)
    with open(args.input, encoding="utf-8") as fh:
        addresses = [line.strip() for line in fh if line.strip()]

    def one(address: str) -> bool | None:
        return validate_email(
            address, smtp_helo_host="verimail.localhost", smtp_timeout=15, dns_timeout=10
        )

    cpu0 = time.process_time()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        results = list(pool.map(one, addresses))
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    with open(args.output, "w", encoding="utf-8") as fh:
        for result in results:
            fh.write(json.dumps(result) + "\n")
    from importlib.metadata import version

    counts = Counter(json.dumps(r) for r in results)
    summary = {
        "addresses": len(addresses),
        "wall_s": wall,
        "cpu_s": cpu,
        "results": dict(counts),
        "version": version("py3-validate-email"),
        "dnspython": version("dnspython"),
    }
    print(RESULT_PREFIX + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
