"""``cxlkv bench all`` (``make bench``): every benchmark and the trace replay.

Each benchmark runs in its own process (``python -m cxlkv.cli bench NAME --out
FILE``) so one cannot disturb another's caches or threads; its table is shown as it
runs. Results land in ``--json-dir`` (default ``bench/results``) as ``NAME.json``,
the replay as ``replay.json``, and a markdown summary of all of them — every
throughput figure beside the memcpy limit measured in the same run — as
``summary.md``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from cxlkv.bench.cli import BENCHMARKS

__all__ = ["all_cmd", "summarize"]

DEFAULT_TRACE = "../shared/traces/conversation_trace.jsonl"
_EXTRA_KEYS = ("path", "batch", "concurrency", "coherence", "ratio_to_coherent", "buffer", "threads", "tier",
               "config", "policy", "side",
               # bench ha
               "round", "write_gap_s", "takeover_s", "failed_reads", "lost", "objects", "rebuild_s",
               "changed_since_warm")


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _size(n: int | None) -> str:
    if not n:
        return "—" if n is None else "0"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


#: Beside the results: when each was measured (``{name: "YYYY-MM-DD HH:MM UTC"}``),
#: so a partial run (``--only``) does not relabel the others.
MEASURED_AT = "measured_at.json"


def _now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _measured_at(json_dir: Path) -> dict[str, str]:
    try:
        data = json.loads((json_dir / MEASURED_AT).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stamp(json_dir: Path, name: str) -> None:
    """Record that ``name``'s result was measured now."""
    data = _measured_at(json_dir)
    data[name] = _now_utc()
    (json_dir / MEASURED_AT).write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")


def summarize(json_dir: Path) -> str:
    """A markdown summary of every ``*.json`` result in ``json_dir``, each section
    headed by when it was measured (from ``measured_at.json``, when known)."""
    lines = ["# Benchmark summary", "",
             f"Written {_now_utc()}; every figure beside the memcpy limit measured in the same run "
             "(`limit_gbps`; `ratio_to_limit` = gbps / limit); single-key 4 KiB figures also beside the "
             "per-call ceilings of the same run (a no-op call through the daemon's framing and loop, and a "
             "bare echo; docs/benchmarks.md).", ""]
    measured = _measured_at(json_dir)
    for path in sorted(json_dir.glob("*.json")):
        if path.name == MEASURED_AT:
            continue
        data = json.loads(path.read_text())
        records = data if isinstance(data, list) else [data]
        lines += [f"## {path.stem}", ""]
        if path.stem in measured:
            lines += [f"Measured {measured[path.stem]}.", ""]
        if path.stem == "replay":
            r = records[0]
            lines += [
                "| requests | block hit rate | same policy simulated | LRU simulated | bound | requests/s | "
                "GB/s | memcpy GB/s | p50 ms | p99 ms | errors |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
                f"| {r['requests']:,} | {100 * r['block_hit_rate']:.2f} % | {100 * r['policy_sim_hit_rate']:.2f} % | "
                f"{100 * r['lru_sim_hit_rate']:.2f} % | {100 * r['bound_hit_rate']:.2f} % | "
                f"{r['requests_per_s']:,.0f} | {r['gbps']:.2f} | {_fmt(r.get('limit_gbps'))} | "
                f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} |",
                "",
            ]
            continue
        if path.stem == "tiering":
            lines += ["| config | policy | block hit rate | DRAM | CXL | SSD | LRU simulated (CXL size) | bound | "
                      "requests/s | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
            for r in records:
                lines.append(
                    f"| {r['config']} | {r['policy']} | {100 * r['block_hit_rate']:.2f} % | "
                    f"{100 * r['dram_hit_rate']:.2f} % | {100 * r['cxl_hit_rate']:.2f} % | "
                    f"{100 * r['ssd_hit_rate']:.2f} % | {100 * r['lru_sim_hit_rate']:.2f} % | "
                    f"{100 * r['bound_hit_rate']:.2f} % | {r['requests_per_s']:,.0f} | {r['errors']} |")
            lines.append("")
            continue
        lines += ["| op | size | details | ops/s | GB/s | p50 µs | p99 µs | limit GB/s | ratio |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in records:
            details = ", ".join(f"{k}={r[k]}" for k in _EXTRA_KEYS if r.get(k) not in (None, ""))
            if r.get("cold_limit_gbps"):
                details += (f"; memcpy from out of cache {r['cold_limit_gbps']:.2f} GB/s (ratio "
                            f"{r['ratio_to_cold_limit']:.2f})")
            if r.get("written_limit_gbps"):
                details += (f", of bytes just written by another process {r['written_limit_gbps']:.2f} GB/s "
                            f"(ratio {r['ratio_to_written_limit']:.2f})")
            if r.get("call_limit_ops_per_s"):
                details += (f"; no-op call {r['call_limit_ops_per_s']:,.0f}/s (ratio "
                            f"{r['ratio_to_call_limit']:.2f}), echo {r['echo_limit_ops_per_s']:,.0f}/s")
            lines.append(
                f"| {r.get('op')} | {_size(r.get('size_bytes'))} | {details} | {_fmt(r.get('ops_per_s'), 0)} | "
                f"{_fmt(r.get('gbps'))} | {_fmt(r.get('p50_us'), 1)} | {_fmt(r.get('p99_us'), 1)} | "
                f"{_fmt(r.get('limit_gbps'))} | {_fmt(r.get('ratio_to_limit'))} |"
            )
        lines.append("")
    return "\n".join(lines)


@click.command("all")
@click.option("--json-dir", default="bench/results", show_default=True, type=click.Path(file_okay=False))
@click.option("--quick", is_flag=True, help="Smoke run: fewer sizes and a 1,000-request replay.")
@click.option("--only", multiple=True, help="Run only these (repeatable): " + ", ".join(BENCHMARKS) + ", replay.")
@click.option("--trace", default=None, type=click.Path(dir_okay=False),
              help="Trace for the replay and `bench tiering`  [default: ../shared/traces/"
                   "conversation_trace.jsonl beside the checkout]")
@click.option("--compare", type=click.Choice(["mooncake"]), default=None,
              help="Also run the peer (Mooncake Store, ../shared/peer/) beside `bench kv`.")
def all_cmd(json_dir: str, quick: bool, only: tuple[str, ...], trace: str, compare: str | None) -> None:
    """Run every benchmark and the replay; write JSON results and summary.md."""
    out_dir = Path(json_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in BENCHMARKS if n != "all"] + ["replay"]
    unknown = set(only) - set(names)
    if unknown:
        raise click.ClickException(f"unknown benchmark(s) {sorted(unknown)}; known: {names}")
    from cxlkv.trace.replay import resolve_trace

    try:
        trace_path: str | None = resolve_trace(trace)
    except FileNotFoundError as exc:
        trace_path, trace_missing = None, str(exc)
    failed = []
    for name in names:
        if only and name not in only:
            continue
        out = out_dir / f"{name}.json"
        if name == "replay":
            if trace_path is None:
                click.echo(f"skipping replay: {trace_missing}", err=True)
                continue
            argv = ["replay", trace_path, "--embedded", "--block-bytes", "64KiB", "--capacity-fraction", "0.1",
                    "--out", str(out)] + (["--limit", "1000"] if quick else [])
        else:
            argv = ["bench", name, "--out", str(out)] + (["--quick"] if quick else [])
            if name == "tiering" and trace_path is not None:
                argv += ["--trace", trace_path]
            if name == "kv" and compare:
                argv += ["--compare", compare]
        runs = [(name, argv)]
        if name == "kv":  # flush mode's cost beside coherent: both modes in one interleaved run
            runs.append(("kv_coherence", ["bench", "kv", "--coherence", "both", "--out",
                                          str(out_dir / "kv_coherence.json")] + (["--quick"] if quick else [])))
        for label, args in runs:
            click.echo(f"\n=== {label}: cxlkv {' '.join(args)}", err=True)
            rc = subprocess.call([sys.executable, "-m", "cxlkv.cli", *args])
            if rc != 0:
                failed.append(f"{label} (exit {rc})")
            else:
                _stamp(out_dir, label)
    summary = summarize(out_dir)
    (out_dir / "summary.md").write_text(summary + "\n")
    click.echo(f"\nwrote {out_dir}/*.json and {out_dir / 'summary.md'}", err=True)
    if failed:
        raise click.ClickException("failed: " + ", ".join(failed))
