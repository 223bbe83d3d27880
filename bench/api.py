"""The API: single verifications on a cached domain against ``GET /api/health``.

``python -m bench.api [--seconds 5] [--clients 1,10,50] [--tool auto|wrk|httpx]`` starts a
testbed process with one fast mail host (no reply delay), one ``verimail serve`` process (SQLite
store, in-process rate limiter, Prefect not warmed) and an enterprise account made with
``verimail accounts create --plan enterprise`` + ``verimail credits grant``. The load comes
from a second process: ``wrk`` (with a Lua script for the POST and its Bearer key) when it is
installed, else :mod:`bench.api_load` (httpx). One warm-up verification puts the domain in the
DNS cache first; every measured request still runs its own SMTP session (connect, EHLO, MAIL,
catch-all probe, RCPT, QUIT) and charges a credit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    Table,
    add_output_args,
    command_text,
    fmt_float,
    fmt_int,
    fmt_ratio,
    publish,
    run_measured,
    stop_process,
)
from bench.world import RemoteTestbed
from verimail.runners.testing import free_port

VERIMAIL = Path(sys.executable).parent / "verimail"
ADDRESS = "alice@fast.test"
QUIET = ("--log-level", "warning")  # no access log line per request
WORLD_YAML = """\
hosts:
  mx.fast.test:
    mailboxes: [alice]
domains:
  fast.test:
    mx: [[10, mx.fast.test]]
"""


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _env(tb: RemoteTestbed, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIMAIL_")}
    env.update(
        {
            "VERIMAIL_DATA_DIR": str(data_dir),
            "VERIMAIL_DNS_NAMESERVERS": tb.nameserver,
            "VERIMAIL_SMTP_PORT": str(tb.smtp_port),
            "VERIMAIL_SMTP_ALLOW_NETWORKS": "127.0.0.0/8",
            "VERIMAIL_PREFECT_WARM_UP": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _account(env: dict[str, str], cwd: Path, credits: int) -> str:
    """An enterprise account with ``credits`` more credits; returns its API key."""
    out = subprocess.run(
        [str(VERIMAIL), "accounts", "create", "--plan", "enterprise"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    account = re.search(r"Created account (\d+)", out)
    key = re.search(r"\b(vm_\S+)", out)
    if not account or not key:
        raise RuntimeError(f"unexpected output of verimail accounts create:\n{out}")
    subprocess.run(
        [str(VERIMAIL), "credits", "grant", str(credits), "--account", account.group(1)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return key.group(1)


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _wrk(url: str, clients: int, seconds: float, key: str | None, body: str | None) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        if body is not None:
            script.write('wrk.method = "POST"\n')
            script.write(f"wrk.body = {json.dumps(body)}\n")
            script.write('wrk.headers["Content-Type"] = "application/json"\n')
        if key:
            script.write(f'wrk.headers["Authorization"] = "Bearer {key}"\n')
    try:
        out = subprocess.run(
            [
                "wrk",
                f"-t{min(clients, 2)}",
                f"-c{clients}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "30s",
                "--latency",
                "-s",
                script.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 60,
        ).stdout
    finally:
        os.unlink(script.name)

    def latency(p: str) -> float:
        match = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        if not match:
            raise RuntimeError(f"no {p}% latency in wrk output:\n{out}")
        return float(match.group(1)) * _UNITS[match.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split()[:2]
    return {
        "requests": int(total.group(1)) if total else 0,
        "rps": float(rps.group(1)) if rps else 0.0,
        "p50_ms": latency("50"),
        "p99_ms": latency("99"),
        "errors": int(non2xx.group(1)) if non2xx else 0,
        "tool": " ".join(version) or "wrk",
    }


def _httpx(url: str, clients: int, seconds: float, key: str | None, body: str | None) -> dict:
    args = ["bench.api_load", "--url", url, "--clients", str(clients), "--seconds", str(seconds)]
    if body is not None:
        args += ["--json", body]
    if key:
        args += ["--key", key]
    return run_measured(args, timeout=seconds + 120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--clients", default="1,10,50", help="comma-separated concurrency")
    parser.add_argument("--tool", choices=["auto", "wrk", "httpx"], default="auto")
    add_output_args(parser)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",") if c.strip()]
    tool = args.tool
    if tool == "auto":
        tool = "wrk" if shutil.which("wrk") else "httpx"
    load = _wrk if tool == "wrk" else _httpx
    body = json.dumps({"email": ADDRESS})

    results: dict[str, dict[int, dict[str, Any]]] = {"health": {}, "verify": {}}
    with tempfile.TemporaryDirectory(prefix="verimail-bench-api-") as tmp:
        work = Path(tmp)
        world = work / "world.yaml"
        world.write_text(WORLD_YAML, encoding="utf-8")
        with RemoteTestbed(world_yaml=str(world)) as tb:
            env = _env(tb, work / "data")
            key = _account(env, work, credits=10_000_000)
            port = free_port()
            log = (work / "serve.log").open("wb")
            server = subprocess.Popen(
                [VERIMAIL, "serve", "--host", "127.0.0.1", "--port", str(port), *QUIET],
                env=env,
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            base = f"http://127.0.0.1:{port}"
            try:
                _wait_healthy(server, base, work / "serve.log")
                warm = httpx.post(
                    f"{base}/api/verify/single",
                    content=body,
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                    timeout=30,
                )
                warm.raise_for_status()
                warm_result = warm.json()
                for clients in levels:
                    for name, path, auth, payload in (
                        ("health", "/api/health", None, None),
                        ("verify", "/api/verify/single", key, body),
                    ):
                        cpu0 = _cpu_s(server.pid)
                        run = load(f"{base}{path}", clients, args.seconds, auth, payload)
                        run["server_cpu_ms"] = (
                            1000 * (_cpu_s(server.pid) - cpu0) / max(1, run["requests"])
                        )
                        results[name][clients] = run
                stats = tb.stats()
            finally:
                stop_process(server, 20)
                log.close()

    table = Table(
        "API: one verify process (SQLite, enterprise account), load from a second process",
        [
            "endpoint",
            "clients",
            "requests",
            "requests/s",
            "p50 ms",
            "p99 ms",
            "non-2xx",
            "server CPU ms/request",
            "vs health (rps)",
        ],
    )
    for clients in levels:
        health, verify = results["health"][clients], results["verify"][clients]
        table.add(
            "GET /api/health",
            clients,
            fmt_int(health["requests"]),
            fmt_int(health["rps"]),
            fmt_float(health["p50_ms"]),
            fmt_float(health["p99_ms"]),
            fmt_int(health["errors"]),
            fmt_float(health["server_cpu_ms"]),
            "1×",
        )
        table.add(
            "POST /api/verify/single",
            clients,
            fmt_int(verify["requests"]),
            fmt_int(verify["rps"]),
            fmt_float(verify["p50_ms"]),
            fmt_float(verify["p99_ms"]),
            fmt_int(verify["errors"]),
            fmt_float(verify["server_cpu_ms"]),
            fmt_ratio(verify["rps"] / health["rps"]) if health["rps"] else "–",
        )
    top = max(levels)
    v1, vt = results["verify"][min(levels)], results["verify"][top]
    tool_text = next(iter(results["health"].values()))["tool"]
    reading = [
        f"Load tool: {tool_text}, {args.seconds:g} s per row; the warm-up answer was "
        f"{warm_result.get('status')} ({warm_result.get('smtp_response')}). The testbed saw "
        f"{stats['sessions']:,} SMTP sessions and at most {stats['max_host_peak']} at once on "
        "the host.",
        f"Health is the framework's floor (FastAPI + uvicorn, one process; it also runs a "
        f"SELECT 1 on the store): {results['health'][top]['rps']:,.0f} requests/s at {top} "
        f"clients. A verification adds the API-key lookup, the credit charge (a SQLite write "
        f"transaction) and a live SMTP session of six round trips to the testbed: with one "
        f"client {v1['p50_ms']:.1f} ms at the median. It costs the server "
        f"{vt['server_cpu_ms']:.1f} ms of CPU per request, so one process tops out near "
        f"{1000 / max(vt['server_cpu_ms'], 0.1):,.0f}/s on one core; at {top} clients it did "
        f"{vt['rps']:,.0f}/s with p99 {vt['p99_ms']:,.0f} ms — requests queue for CPU (2 "
        "cores shared by the load tool, the server and the testbed) and for the host's 5 "
        "sessions. More throughput means more `verimail serve` processes (PostgreSQL + Redis).",
    ]
    publish(
        args,
        title="API (single verification vs health)",
        command=command_text("bench.api", argv),
        tables=[table],
        reading=reading,
        extra={"results": results, "tool": tool},
    )
    return {"results": results, "tables": [table]}


def _wait_healthy(server: subprocess.Popen, base: str, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"verimail serve exited:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(f"{base}/api/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"verimail serve not healthy:\n{log.read_text(errors='replace')}")
        time.sleep(0.1)


if __name__ == "__main__":
    main()
