"""API throughput with and without the HTTP edge limits, in one run, side by side.

``python -m bench.http_edge [--seconds 5] [--clients 10,50] [--tool auto|wrk|httpx]`` starts
one testbed process and two API processes on the same data dir and account:

- **before**: the app without its body-limit middleware, under uvicorn's default HTTP
  parser (httptools, no header limit, no header timeout, no connection cap) — the server
  as it was before the limits;
- **after**: ``verimail serve`` as shipped (h11 with its header limit, the header timeout,
  the connection cap, the body size cap and body read timeout).

Each row loads one of them with ``GET /api/health`` (the framework's floor) or
``POST /api/verify/single`` (a real verification against the testbed); before and after
alternate row by row, so that other work on the machine weighs on both alike.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.api import (
    ADDRESS,
    QUIET,
    VERIMAIL,
    WORLD_YAML,
    _account,
    _cpu_s,
    _env,
    _httpx,
    _wait_healthy,
    _wrk,
)
from bench.common import (
    Table,
    add_output_args,
    command_text,
    fmt_float,
    fmt_int,
    fmt_ratio,
    publish,
    stop_process,
)
from bench.world import RemoteTestbed
from verimail.runners.testing import free_port

SERVERS = ("before", "after")


def serve_unbounded(port: int) -> None:
    """The API as it was served before the edge limits (run in a child process)."""
    import uvicorn

    from verimail.api.app import create_app
    from verimail.api.body_limit import BodyLimitMiddleware
    from verimail.config import get_settings

    app = create_app(get_settings())
    app.user_middleware = [m for m in app.user_middleware if m.cls is not BodyLimitMiddleware]
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http="httptools")


def _median_run(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median requests/s (its own latencies and CPU, not a mix)."""
    ordered = sorted(rounds, key=lambda run: run["rps"])
    return ordered[len(ordered) // 2]


def _start(which: str, env: dict[str, str], work: Path) -> tuple[subprocess.Popen, str, Any]:
    port = free_port()
    if which == "after":
        command = [str(VERIMAIL), "serve", "--host", "127.0.0.1", "--port", str(port), *QUIET]
    else:
        command = [sys.executable, "-m", "bench.http_edge", "--serve-unbounded", str(port)]
    log = (work / f"serve-{which}.log").open("wb")
    server = subprocess.Popen(
        command,
        env=env,
        cwd=Path(__file__).resolve().parents[1],  # the repository root: `-m bench...` imports
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    _wait_healthy(server, base, work / f"serve-{which}.log")
    return server, base, log


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--clients", default="10,50", help="comma-separated concurrency")
    parser.add_argument("--tool", choices=["auto", "wrk", "httpx"], default="auto")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    parser.add_argument("--serve-unbounded", type=int, default=None, help=argparse.SUPPRESS)
    add_output_args(parser)
    args = parser.parse_args(argv)
    if args.serve_unbounded is not None:
        serve_unbounded(args.serve_unbounded)
        return {}
    levels = [int(c) for c in args.clients.split(",") if c.strip()]
    tool = args.tool
    if tool == "auto":
        tool = "wrk" if shutil.which("wrk") else "httpx"
    load = _wrk if tool == "wrk" else _httpx
    body = json.dumps({"email": ADDRESS})

    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="verimail-bench-edge-") as tmp:
        work = Path(tmp)
        world = work / "world.yaml"
        world.write_text(WORLD_YAML, encoding="utf-8")
        with RemoteTestbed(world_yaml=str(world)) as tb:
            env = _env(tb, work / "data")
            key = _account(env, work, credits=10_000_000)
            started = {which: _start(which, env, work) for which in SERVERS}
            try:
                for _round in range(args.rounds):
                    for clients in levels:
                        for name, path, auth, payload in (
                            ("health", "/api/health", None, None),
                            ("verify", "/api/verify/single", key, body),
                        ):
                            for which in SERVERS:
                                server, base, _log = started[which]
                                cpu0 = _cpu_s(server.pid)
                                run = load(f"{base}{path}", clients, args.seconds, auth, payload)
                                run["server_cpu_ms"] = (
                                    1000 * (_cpu_s(server.pid) - cpu0) / max(1, run["requests"])
                                )
                                runs.setdefault((which, name, clients), []).append(run)
            finally:
                for server, _base, log in started.values():
                    stop_process(server, 20)
                    log.close()
    results = {
        which: {
            name: {clients: _median_run(runs[(which, name, clients)]) for clients in levels}
            for name in ("health", "verify")
        }
        for which in SERVERS
    }

    table = Table(
        "API throughput before and after the HTTP edge limits (one process each, same data)",
        [
            "endpoint",
            "clients",
            "server",
            "requests",
            "requests/s",
            "p50 ms",
            "p99 ms",
            "non-2xx",
            "server CPU ms/request",
            "after/before (rps)",
        ],
    )
    labels = {"health": "GET /api/health", "verify": "POST /api/verify/single"}
    ratios: dict[str, list[float]] = {"health": [], "verify": []}
    for clients in levels:
        for name in ("health", "verify"):
            before = results["before"][name][clients]
            for which in SERVERS:
                run = results[which][name][clients]
                ratio = "–"
                if which == "after" and before["rps"]:
                    ratios[name].append(run["rps"] / before["rps"])
                    ratio = fmt_ratio(run["rps"] / before["rps"])
                table.add(
                    labels[name],
                    clients,
                    which,
                    fmt_int(run["requests"]),
                    fmt_int(run["rps"]),
                    fmt_float(run["p50_ms"]),
                    fmt_float(run["p99_ms"]),
                    fmt_int(run["errors"]),
                    fmt_float(run["server_cpu_ms"]),
                    ratio,
                )
    tool_text = results["after"]["health"][levels[0]]["tool"]
    cpu = {
        name: [tuple(results[which][name][c]["server_cpu_ms"] for which in SERVERS) for c in levels]
        for name in ("health", "verify")
    }
    reading = [
        f"Load tool: {tool_text}, {args.seconds:g} s per row, {args.rounds} rounds with before "
        "and after alternating; each row is the median round (by requests/s). Before: "
        "httptools parser, no body-limit middleware. After: h11 parser with a 16 KiB header "
        "limit, header timeout, connection cap, body cap and body read timeout.",
        "After/before, requests per second: health "
        + ", ".join(f"{r:.2f}" for r in ratios["health"])
        + "; single verification "
        + ", ".join(f"{r:.2f}" for r in ratios["verify"])
        + f" (at {', '.join(str(c) for c in levels)} clients). Server CPU per request, "
        "before → after: health "
        + ", ".join(f"{b:.2f} → {a:.2f} ms" for b, a in cpu["health"])
        + "; single verification "
        + ", ".join(f"{b:.2f} → {a:.2f} ms" for b, a in cpu["verify"])
        + ". CPU per request is the steadier figure on a shared machine: requests/s also "
        "move with whatever else the 2 cores are running.",
    ]
    publish(
        args,
        title="HTTP edge limits: API throughput before and after",
        command=command_text("bench.http_edge", argv),
        tables=[table],
        reading=reading,
        extra={"results": results, "tool": tool},
    )
    return {"results": results, "tables": [table]}


if __name__ == "__main__":
    main()
