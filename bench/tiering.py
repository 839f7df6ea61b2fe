"""``cxlkv bench tiering``: CXL-only against CXL+SSD and DRAM+CXL+SSD on the real trace.

Replays the Mooncake conversation trace on an embedded cluster (master and two
clientds, real processes) once per configuration and eviction policy, with the
CXL tier sized at ``--capacity-fraction`` (default 0.1) of the trace's unique
blocks:

* ``cxl_only`` — the CXL region alone; a full region evicts (lost blocks).
* ``cxl_ssd`` — plus an SSD tier (a file on disk, pread/pwrite) holding
  ``--ssd-fraction`` (default 1.0) of the unique blocks: cold blocks are demoted
  instead of lost, hot SSD blocks promoted back (docs/tiers.md).
* ``dram_cxl_ssd`` — plus a DRAM tier in each clientd holding ``--dram-fraction``
  (default 0.02) of the unique blocks, for blocks one host reads repeatedly.

Each record has ``block_hit_rate`` and its split by serving tier
(``dram_hit_rate``, ``cxl_hit_rate``, ``ssd_hit_rate``), the LRU simulation and
the unbounded bound at the same CXL size, ``errors`` (every hit is verified
byte for byte), requests/s and the memcpy limit at the block size measured in
the same run.

Block size: 4 KiB by default (the replay's default is 64 KiB) so that the SSD
tier — all 182,790 unique blocks of the trace — is ~0.8 GB of disk writes per
run instead of ~12 GB; hit rates do not depend on the block size.
"""

from __future__ import annotations

import click

from cxlkv.bench.common import Record, emit, output_options
from cxlkv.cli.sizes import Size

__all__ = ["tiering_cmd", "CONFIGS"]

#: configuration → (ssd_fraction, dram_fraction); the DRAM fraction is per clientd.
CONFIGS: dict[str, tuple[float, float]] = {
    "cxl_only": (0.0, 0.0),
    "cxl_ssd": (1.0, 0.0),
    "dram_cxl_ssd": (1.0, 0.02),
}


@click.command("tiering")
@click.option("--trace", default=None, type=click.Path(dir_okay=False),
              help="JSON-lines trace  [default: ../shared/traces/conversation_trace.jsonl beside the checkout]")
@click.option("--block-bytes", default="4KiB", show_default=True, type=Size(min_bytes=1),
              help="Bytes per 512-token block.")
@click.option("--capacity-fraction", default=0.1, show_default=True, type=float,
              help="CXL tier as a fraction of the trace's unique blocks.")
@click.option("--ssd-fraction", default=1.0, show_default=True, type=float, help="SSD tier (tiered configs).")
@click.option("--dram-fraction", default=0.02, show_default=True, type=float,
              help="DRAM tier per clientd (dram_cxl_ssd).")
@click.option("--policy", "policies", multiple=True, default=("lru", "arc"), show_default=True,
              help="Eviction (demotion) policies to compare (repeatable).")
@click.option("--config", "configs", multiple=True, default=tuple(CONFIGS), show_default=True,
              type=click.Choice(list(CONFIGS)), help="Configurations to run (repeatable).")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(min=1), help="Replay processes.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N requests.")
@output_options
def tiering_cmd(trace: str, block_bytes: int, capacity_fraction: float, ssd_fraction: float,
                dram_fraction: float, policies: tuple[str, ...], configs: tuple[str, ...], workers: int,
                limit: int | None, as_json: bool, out: str | None, quick: bool) -> None:
    """Hit rates per tier: CXL-only vs CXL+SSD vs DRAM+CXL+SSD, per policy, on the real trace."""
    from cxlkv.trace.replay import ReplayOptions, resolve_trace, run_embedded

    try:
        trace = resolve_trace(trace)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    bb = block_bytes
    if quick and limit is None:
        limit = 1000
    records: list[Record] = []
    for config in configs:
        ssd, dram = CONFIGS[config]
        if ssd:
            ssd = ssd_fraction
        if dram:
            dram = dram_fraction
        for policy in policies:
            opts = ReplayOptions(trace_path=trace, block_bytes=bb, capacity_fraction=capacity_fraction,
                                 limit=limit, workers=workers, policy=policy, ssd_fraction=ssd,
                                 dram_fraction=dram)
            click.echo(f"tiering: {config} / {policy} ...", err=True)
            r = run_embedded(opts)
            c = r.master_counters
            records.append(Record(
                bench="tiering", op=f"{config}/{policy}", size_bytes=bb, ops_per_s=r.requests_per_s,
                gbps=r.gbps, p50_us=r.p50_ms * 1e3, p99_us=r.p99_ms * 1e3, limit_gbps=r.limit_gbps,
                ratio_to_limit=r.ratio_to_limit,
                extra={
                    "config": config, "policy": policy,
                    "block_hit_rate": r.block_hit_rate, "cxl_hit_rate": r.cxl_hit_rate,
                    "ssd_hit_rate": r.ssd_hit_rate, "dram_hit_rate": r.dram_hit_rate,
                    "cxl_capacity_fraction": capacity_fraction, "ssd_fraction": ssd,
                    "dram_fraction_per_clientd": dram, "errors": r.errors,
                    "requests_per_s": r.requests_per_s, "requests": r.requests,
                    "lru_sim_hit_rate": r.lru_sim_hit_rate, "bound_hit_rate": r.bound_hit_rate,
                    "verified_blocks": r.verified_blocks, "unique_blocks": r.unique_blocks,
                    "demotions": c.get("demotions", 0), "promotions": c.get("promotions", 0),
                    "dram_caches": c.get("dram_caches", 0), "moves_failed": c.get("moves_failed", 0),
                    "ssd_puts": c.get("ssd_puts", 0), "evictions": c.get("evictions", 0),
                    "objects_lost": c.get("objects_lost", 0), "elapsed_s": r.elapsed_s,
                },
            ))
            if r.error_samples:
                click.echo("  errors: " + "; ".join(r.error_samples[:3]), err=True)
    emit(records, as_json=as_json, out=out)
