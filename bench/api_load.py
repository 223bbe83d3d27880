"""A small HTTP load generator (httpx + asyncio), for machines without ``wrk``.

``python -m bench.api_load --url URL --clients N --seconds S [--json BODY] [--key KEY]``
keeps N requests in flight on N connections for S seconds and prints one ``BENCH-RESULT``
line: requests, requests/s, p50/p99 latency (ms) and the count of non-2xx answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

from bench.common import emit_result


async def run(url: str, clients: int, seconds: float, body: str | None, key: str | None) -> dict:
    headers = {"Content-Type": "application/json"} if body else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                if body is None:
                    response = await client.get(url, headers=headers)
                else:
                    response = await client.post(url, content=body, headers=headers)
                latencies.append(time.perf_counter() - started)
                if not 200 <= response.status_code < 300:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return 1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    return {
        "requests": len(latencies),
        "rps": len(latencies) / wall,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "errors": errors,
        "tool": f"httpx {httpx.__version__}",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--json", default=None, help="POST this body (else GET)")
    parser.add_argument("--key", default=None)
    args = parser.parse_args()
    body = json.dumps(json.loads(args.json)) if args.json else None
    emit_result(asyncio.run(run(args.url, args.clients, args.seconds, body, args.key)))


if __name__ == "__main__":
    main()
