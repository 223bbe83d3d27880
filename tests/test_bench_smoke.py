"""Every benchmark script at a tiny size, so that ``bench/`` cannot rot.

No timing assertions: each script runs as ``make bench`` runs it (a subprocess from the
repository root), writes its section to a temporary file instead of ``BENCHMARKS.md`` (which
must stay untouched) and its tables as JSON, whose row names are checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from api_helpers import TIMEOUTS_ENV

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "BENCHMARKS.md"


def _digest() -> str | None:
    return hashlib.sha256(BENCHMARKS.read_bytes()).hexdigest() if BENCHMARKS.exists() else None


def _run(
    tmp_path: Path, module: str, *args: str, timeout: float = 600, env: dict | None = None
) -> dict:
    out, data = tmp_path / f"{module}.md", tmp_path / f"{module}.json"
    before = _digest()
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args, "--output", str(out), "--json", str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        # (the suite's DNS and SMTP timeouts: a busy machine's loopback is no failure)
        env={**os.environ, **TIMEOUTS_ENV, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert _digest() == before, "a smoke run must not touch BENCHMARKS.md"
    section = out.read_text(encoding="utf-8")
    assert "Command: `python -m bench." in section and "Machine: " in section
    assert "Reading:" in section
    return json.loads(data.read_text(encoding="utf-8"))


def _first_cells(result: dict, table: int = 0) -> list[str]:
    return [row[0] for row in result["tables"][table]["rows"]]


def _peer_available() -> bool:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.peer import ensure_peer_venv

    try:
        ensure_peer_venv()
    except (subprocess.CalledProcessError, OSError):
        return False
    return True


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
def test_throughput_smoke(tmp_path):
    import prefect.settings

    peer = _peer_available()
    args = ["--size", "200", "--peer-sample", "5"]
    args += ["--peer-threads", "1,4"] if peer else ["--peer-threads", ""]
    # The flow run uses this session's Prefect server instead of starting its own.
    server = {"PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value())}
    result = _run(tmp_path, "throughput", *args, env=server)
    rows = _first_cells(result)
    assert rows[0] == "verimail engine (verify_many)"
    assert rows[1] == "verimail bulk_verify flow (LocalRunner)"
    assert rows[-1] == "latency-model lower bound"
    if peer:
        assert [r for r in rows if r.startswith("py3-validate-email")], rows
    ratios = _first_cells(result, 1)
    assert "engine wall ÷ lower bound" in ratios
    assert "flow wall ÷ engine wall (Prefect overhead)" in ratios
    assert "MX queries ÷ unique domains (engine)" in ratios
    engine = result["extra"]["runs"]["engine"]
    assert engine["agreement"] == 1.0  # the tiny world is verified exactly as generated
    if not peer:
        pytest.skip("py3-validate-email could not be installed (no package index?)")


def test_throughput_shared_host_smoke(tmp_path):
    """The shared-host shape (issue 33): a server with an MX name per domain, its greeting
    slowed, run both ways in one run; the table compares the two on that server."""
    args = ["--size", "100", "--no-flow", "--peer-threads", ""]
    args += ["--shared-names", "4", "--shared-per-domain", "5", "--greeting-delay", "0.05"]
    result = _run(tmp_path, "throughput", *args, "--by-name")
    rows = _first_cells(result)
    assert rows[:2] == [
        "verimail engine (verify_many)",
        "verimail engine, sessions per MX name (before issue 33)",
    ]
    shared = result["tables"][-1]
    assert [row[0] for row in shared["rows"]] == [
        "sessions per MX name (before)",
        "sessions per server IP (now)",
    ]
    before, now = (int(row[1]) for row in shared["rows"])
    assert now < before  # (4 domains: 4 sessions per name, 1 per server)
    runs = result["extra"]["runs"]
    assert runs["engine"]["agreement"] == runs["engine-by-name"]["agreement"] == 1.0


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
def test_greylisting_smoke(tmp_path):
    import prefect.settings

    server = {"PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value())}
    args = ["--timeouts", "1", "--size", "40", "--grey-delay", "1"]
    result = _run(tmp_path, "greylisting", *args, env=server)
    assert _first_cells(result)[0] == "tarpit"
    assert _first_cells(result, 1) == ["deferred retries", "retry_unknowns=false"]
    assert result["extra"]["with_retry"]["grey_unknown"] == 0
    assert result["extra"]["without"]["grey_unknown"] == result["extra"]["without"]["grey"] > 0


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
def test_greylisting_one_worker_smoke(tmp_path):
    """Part 3 (a worker process and three flow-run processes, on SQLite): which job went
    first is the figure, not checked here (a 1 s greylist delay is too short to tell)."""
    import prefect.settings

    server = {"PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value())}
    args = ["--one-worker", "--size", "40", "--second-size", "5", "--grey-delay", "1"]
    result = _run(tmp_path, "greylisting", *args, "--database", "sqlite", env=server)
    assert "A's retry pass: flow run started" in _first_cells(result)
    assert _first_cells(result, 1) == ["A when parked", "A at the end", "B at the end"]
    run = result["extra"]["one_worker"]
    assert run["parked"]["retry_waiting"] == run["A"]["grey"] > 0
    assert (run["A"]["status"], run["A"]["grey_unknown"]) == ("completed", 0)
    assert (run["B"]["status"], run["B"]["total"]) == ("completed", 5)
    assert sorted(run["runs"]) == ["A pass 0", "A pass 1", "B pass 0"]
    assert (run["workers"], run["at_once"]) == (1, 1)


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
def test_scaling_smoke(tmp_path):
    import prefect.settings

    # The flow side uses this session's Prefect server instead of starting one per size.
    server = {"PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value())}
    result = _run(tmp_path, "scaling", "--sizes", "100,200", env=server)
    assert _first_cells(result) == ["100"] * 3 + ["200"] * 3
    runs = result["extra"]["runs"]
    assert [r["call"] for r in runs] == ["verify_many", "stream", "bulk_verify flow"] * 2
    # Every call verified every address of the world as it expects (streamed results are
    # matched back to the input by address).
    assert all(r["agreement"] == 1.0 for r in runs), [r["agreement"] for r in runs]


def test_ingest_smoke(tmp_path):
    result = _run(tmp_path, "ingest", "--rows", "2000", "--repeat", "2")
    assert _first_cells(result) == ["verimail (tokenizer + Polars)", "Python csv module"]
    assert _first_cells(result, 1) == [
        "verimail (values_for_rows + write_results_csv)",
        "Python csv.reader → csv.writer",
    ]
    runs = result["extra"]["runs"]
    assert runs["ours"]["counts"] == runs["csv"]["counts"]
    assert [len(runs[impl]["walls_s"]) for impl in ("ours", "csv", "ours-fallback")] == [2] * 3
    assert runs["ours"]["wall_s"] == min(runs["ours"]["walls_s"])  # the lower middle of two


def test_finder_smoke(tmp_path):
    result = _run(tmp_path, "finder", "--people", "5")
    assert _first_cells(result)[2] == "after: 20 probes, learning (CSV job)"
    assert all(row[1] == "5/5" for row in result["tables"][0]["rows"][1:])
    assert {row[2] for row in result["tables"][1]["rows"]} == {"yes"}
    assert result["extra"]["max_rcpts_per_lookup"] <= 21
    assert result["extra"]["peak_session_rejections"] < 10


_GROUPS = """
import json, sys
import polars as pl
from bench.ingest_worker import group_by_domain
uniques = pl.Series("normalised", json.loads(sys.argv[1]))
groups = group_by_domain(uniques)
print(json.dumps(dict(zip(groups["domain"].to_list(), groups["normalised"].to_list()))))
"""


@pytest.mark.parametrize(
    "addresses",
    [
        ["a@x.example", "b@y.example", "c@x.example", "no-at-sign", "d@"],
        ["a@x.example", '"odd@local"@y.example', "b@y.example", "c@@x.example"],
        ["zoë@x.example", "ann@x.example", "jo@dömäin.example", "ünï@dömäin.example", "ö@"],
    ],
)
def test_ingest_groups_like_the_csv_module(addresses):
    """The bench's Polars group-by puts each address under what follows its last "@" (the
    csv side's rpartition), in first-seen order: also with two "@" in one address, and with
    characters of more than one byte before or after the "@"."""
    expected: dict[str, list[str]] = {}
    for address in addresses:
        _local, at, domain = address.rpartition("@")
        expected.setdefault(domain if at else "", []).append(address)
    out = subprocess.run(
        [sys.executable, "-c", _GROUPS, json.dumps(addresses)],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    found = json.loads(out.stdout)
    assert found == expected
    assert list(found) == list(expected)


@pytest.mark.parametrize("tool", ["httpx", "wrk"])
def test_api_smoke(tmp_path, tool):
    if tool == "wrk" and shutil.which("wrk") is None:
        pytest.skip("wrk is not installed")
    result = _run(tmp_path, "api", "--seconds", "1", "--clients", "1,2", "--tool", tool)
    rows = result["tables"][0]["rows"]
    assert [(r[0], r[1]) for r in rows] == [
        ("GET /api/health", "1"),
        ("POST /api/verify/single", "1"),
        ("GET /api/health", "2"),
        ("POST /api/verify/single", "2"),
    ]
    assert all(r[6] == "0" for r in rows), rows  # no non-2xx answers


def test_starvation_smoke(tmp_path):
    result = _run(
        tmp_path, "starvation", "--groups", "2", "--per-group", "20", "--reply-delay", "0"
    )
    assert _first_cells(result) == ["verimail engine (verify_many)"]
    figures = result["extra"]["figures"]
    assert (figures["valid"], figures["unknown"]) == (40, 0)


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
def test_greylisting_in_pass_smoke(tmp_path):
    """Part 4: with a 1 s postgrey delay the old default settles in the pass (its first
    retry comes 5 s later), the new one parks; both end with no greylisted unknown."""
    import prefect.settings

    server = {"PREFECT_API_URL": str(prefect.settings.PREFECT_API_URL.value())}
    result = _run(
        tmp_path, "greylisting", "--in-pass", "--size", "40", "--grey-delay", "1", env=server
    )
    old, new = result["extra"]["in_pass"].values()
    assert (old["first_pass"], new["first_pass"] is not None) == (None, True)
    assert old["grey_unknown"] == new["grey_unknown"] == 0 < new["grey"]


def test_job_start_smoke(tmp_path):
    """The local runner's part only (``verimail serve`` with its embedded Prefect server)."""
    result = _run(tmp_path, "job_start", "--mode", "local", "--jobs", "1")
    assert [row[1] for row in result["tables"][0]["rows"]][1:] == ["CSV upload", "JSON list"]
    runs = result["extra"]["results"]["local"]
    assert [r["status"] for r in runs] == ["completed"] * 3


def test_egress_smoke(tmp_path):
    result = _run(tmp_path, "egress", "--size", "200", "--rounds", "1")
    assert _first_cells(result) == ["direct, run 1", "SOCKS5 proxy, run 1"]
    runs = result["extra"]["runs"]
    assert all(r["agreement"] == 1.0 for r in runs.values())
    proxied = runs["SOCKS5 proxy, run 1"]
    assert proxied["proxy_connections"] == proxied["testbed"]["sessions"] > 0
    assert runs["direct, run 1"]["proxy_connections"] == 0


def test_shard_planning_smoke(tmp_path):
    result = _run(tmp_path, "shard_planning", "--rows", "2000", "--old-timeout", "5")
    assert _first_cells(result) == ["2,000"]
    plans = result["extra"]["plan_shards"]
    now = [p for p in plans if p["code"] == "this tree (now)"]
    assert now[0]["dns_queries"] == 0  # (rows without an @: no DNS)
    assert [p["shards"] for p in now] == [1, 1]


def test_merge_memory_smoke(tmp_path):
    """Two small sizes through the merge's steps: a row per size, a peak per step."""
    result = _run(tmp_path, "merge_memory", "--rows", "2000", "120000")
    rows = result["tables"][0]["rows"]
    assert [row[0] for row in rows] == ["2,000", "120,000"]
    assert all(float(cell.replace(",", "")) > 0 for row in rows for cell in row[1:-1])
