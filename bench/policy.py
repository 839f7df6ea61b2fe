"""``cxlkv bench policy``: every shipped eviction policy at 1, 3, 10 and 30 % of the
trace's unique blocks, the store beside its own simulation, Belady beside both.

For each capacity (``--fraction``, a share of the conversation trace's 182,790
unique blocks) and each policy registered in ``cxlkv.eviction_policies``
(``--policy`` to choose):

* ``sim_hit_rate``: the in-process simulation with the store's own policy code
  (:func:`cxlkv.trace.sim.simulate`: hit = longest cached prefix, 512-token blocks);
* ``store_hit_rate``: the store itself — an embedded cluster (a real master and two
  clientds, a region sized for exactly that many blocks) replaying the whole trace
  (:func:`cxlkv.trace.replay.run_embedded`), every hit verified byte for byte; ``errors``
  must be 0; ``store_minus_sim_points`` is the gap in percentage points;
* ``belady_hit_rate``: the offline optimum at the same capacity
  (:func:`cxlkv.trace.sim.simulate_belady`) and ``bound_hit_rate`` (a cache that
  never evicts);
* ``policy_us_per_block``: the policy's own CPU cost on the master, microseconds per
  requested block of the trace — every policy call (``on_put``, ``on_hit``,
  ``on_prefix``, ``on_remove``, ``candidates``) timed in-process over the simulation,
  less the cost of timing an empty call (measured in the same run); also
  ``policy_us_per_call``.

Store runs use ``--block-bytes`` (16 KiB: the 30 % region is ~0.9 GB of
``/dev/shm``) and put through PutStart/PutEnd (``reserve_ahead`` off) unless
``--reserve-ahead``: extents reserved ahead of need hold region space the
simulation does not model (up to 1 MiB per clientd, 6.8 % of a 1 % cache at 16 KiB).
One replay worker by default (``--workers``): the simulation replays the requests one
after another; with several workers requests overlap, and a block still being
written by one cannot be hit by another.
``ops_per_s`` is the store's requests/s; ``gbps`` its bytes read and written per
second, beside the memcpy bandwidth at the block size measured in the same run
(``limit_gbps``, ``ratio_to_limit``). ``--no-store`` runs the simulations only.
"""

from __future__ import annotations

import time
from typing import Any

import click

from cxlkv.bench.common import Record, emit, output_options

__all__ = ["policy_cmd", "FRACTIONS", "timed_policy_cost"]

#: Capacities swept, as fractions of the trace's unique blocks.
FRACTIONS = (0.01, 0.03, 0.1, 0.3)


class _Timed:
    """Wraps a policy and adds the wall time of each call to ``spent_ns``."""

    _METHODS = ("on_put", "on_hit", "on_remove", "on_prefix", "candidates")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.spent_ns = 0
        self.calls = 0
        clock = time.perf_counter_ns
        for name in self._METHODS:
            fn = getattr(inner, name, None)
            if fn is None:
                continue

            def timed(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
                t0 = clock()
                out = _fn(*args, **kwargs)
                self.spent_ns += clock() - t0
                self.calls += 1
                return out

            setattr(self, name, timed)


class _Empty:
    """A policy whose calls do nothing (the timing's own cost)."""

    def on_put(self, key: Any) -> None: ...
    def on_hit(self, key: Any) -> None: ...
    def on_remove(self, key: Any, evicted: bool = False) -> None: ...
    def on_prefix(self, keys: Any, matched: int) -> None: ...
    def candidates(self, n: int) -> list[Any]:
        return []


def _overhead_ns_per_call(samples: int = 200_000) -> float:
    t = _Timed(_Empty())
    hit = getattr(t, "on_hit")
    for i in range(samples):
        hit(i)
    return t.spent_ns / t.calls


def timed_policy_cost(trace: Any, capacity_blocks: int, policy: str) -> tuple[float, int, int, float]:
    """Simulate ``policy`` at ``capacity_blocks`` with every policy call timed.

    Returns:
        ``(hit_rate, calls, blocks, policy_ns)``: the simulated block hit rate, the
        number of policy calls, the blocks requested and the nanoseconds spent
        inside the policy (timing overhead not subtracted).
    """
    import cxlkv.trace.sim as ts

    made: list[_Timed] = []
    real = ts._make_policy

    def make(name: str) -> Any:
        made.append(_Timed(real(name)))
        return made[-1]

    ts._make_policy = make
    try:
        res = ts.simulate(trace, capacity_blocks, policy=policy)
    finally:
        ts._make_policy = real
    return res.block_hit_rate, made[0].calls, res.blocks, float(made[0].spent_ns)


@click.command("policy")
@click.option("--trace", default=None, type=click.Path(dir_okay=False),
              help="JSON-lines trace  [default: ../shared/traces/conversation_trace.jsonl beside the checkout]")
@click.option("--fraction", "fractions", multiple=True, type=click.FloatRange(min=0, min_open=True, max=1),
              default=FRACTIONS, show_default=True, help="Capacities, as fractions of the unique blocks (repeatable).")
@click.option("--policy", "policies", multiple=True, default=None,
              help="Policies to compare (repeatable)  [default: every registered one]")
@click.option("--block-bytes", default="16KiB", show_default=True, help="Bytes per 512-token block (store runs).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replay processes (1: the simulation's order; more overlap requests).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N requests.")
@click.option("--store/--no-store", default=True, show_default=True, help="Also replay on the store.")
@click.option("--reserve-ahead", is_flag=True, help="Store runs with the clientds' extent reservations on.")
@output_options
def policy_cmd(trace: str | None, fractions: tuple[float, ...], policies: tuple[str, ...], block_bytes: str,
               workers: int, limit: int | None, store: bool, reserve_ahead: bool, as_json: bool,
               out: str | None, quick: bool) -> None:
    """Eviction policies on the real trace: store vs its simulation vs Belady, 1–30 % capacity."""
    from tabulate import tabulate

    from cxlkv.config import parse_size
    from cxlkv.master.eviction import available_policies
    from cxlkv.trace.replay import ReplayOptions, resolve_trace, run_embedded
    from cxlkv.trace.sim import load_trace, simulate_belady, simulate_unbounded, unique_blocks

    try:
        trace = resolve_trace(trace)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    bb = parse_size(block_bytes, name="--block-bytes")
    names = list(policies) or available_policies()
    if quick and limit is None:
        limit = 1000
    requests = load_trace(trace, limit)
    uniq = unique_blocks(requests)
    bound = simulate_unbounded(requests).block_hit_rate
    overhead = _overhead_ns_per_call()
    records: list[Record] = []
    for frac in fractions:
        cap = max(1, int(frac * uniq))
        belady = simulate_belady(requests, cap).block_hit_rate
        for name in names:
            sim, calls, blocks, spent_ns = timed_policy_cost(requests, cap, name)
            own_ns = max(0.0, spent_ns - overhead * calls)
            extra: dict[str, Any] = {
                "policy": name, "capacity_fraction": frac, "capacity_blocks": cap, "unique_blocks": uniq,
                "sim_hit_rate": sim, "belady_hit_rate": belady, "bound_hit_rate": bound,
                "policy_us_per_block": own_ns / blocks / 1e3,
                "policy_us_per_call": own_ns / calls / 1e3 if calls else 0.0,
                "timing_overhead_ns_per_call": overhead,
            }
            rec = Record(bench="policy", op=f"{name}@{frac:g}", size_bytes=bb, ops_per_s=0.0, gbps=0.0,
                         p50_us=0.0, p99_us=0.0, extra=extra)
            if store:
                click.echo(f"policy: {name} at {frac:g} ({cap:,} blocks) on the store ...", err=True)
                r = run_embedded(ReplayOptions(
                    trace_path=trace, block_bytes=bb, capacity_fraction=frac, limit=limit, workers=workers,
                    policy=name, reserve_ahead=reserve_ahead))
                rec.ops_per_s, rec.gbps = r.requests_per_s, r.gbps
                rec.p50_us, rec.p99_us = r.p50_ms * 1e3, r.p99_ms * 1e3
                rec.limit_gbps, rec.ratio_to_limit = r.limit_gbps, r.ratio_to_limit
                extra.update(
                    store_hit_rate=r.block_hit_rate, store_sim_hit_rate=r.policy_sim_hit_rate,
                    store_minus_sim_points=100 * (r.block_hit_rate - r.policy_sim_hit_rate),
                    errors=r.errors, verified_blocks=r.verified_blocks, requests=r.requests,
                    evictions=r.master_counters.get("evictions", 0), reserve_ahead=reserve_ahead,
                    workers=workers, **{k: v for k, v in r.master_counters.items() if k.startswith("policy_")})
                if r.error_samples:
                    click.echo("  errors: " + "; ".join(r.error_samples[:3]), err=True)
            records.append(rec)
    pct = lambda x: "" if x is None else f"{100 * x:.2f}"  # noqa: E731
    rows = []
    for rec in records:
        e = rec.extra
        rows.append([e["policy"], f"{100 * e['capacity_fraction']:g} %", pct(e.get("store_hit_rate")),
                     pct(e["sim_hit_rate"]), pct(e["belady_hit_rate"]),
                     "" if "errors" not in e else e["errors"], f"{e['policy_us_per_block']:.2f}"])
    click.echo(tabulate(rows, headers=["policy", "capacity", "store %", "simulated %", "Belady %", "errors",
                                       "policy µs/block"], disable_numparse=True, stralign="right"),
               err=as_json)
    emit(records, as_json=as_json, out=out)
