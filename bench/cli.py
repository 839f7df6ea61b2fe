"""``cxlkv bench``: the benchmark commands, imported lazily.

Add a benchmark by adding ``name: "module:attribute"`` (a click command) to
``BENCHMARKS``; each follows the output convention of :mod:`cxlkv.bench.common`
(table on stdout, ``--json``, ``--out FILE``, ``--quick``).
"""

from __future__ import annotations

import click

from cxlkv.cli import LazyGroup

__all__ = ["BENCHMARKS", "bench_group"]

#: benchmark name → "module:attribute" of its click command.
BENCHMARKS: dict[str, str] = {
    "transport": "cxlkv.bench.transport:transport_cmd",
    "master": "cxlkv.bench.master:master_cmd",
    "kv": "cxlkv.bench.kv:kv_cmd",
    "tiering": "cxlkv.bench.tiering:tiering_cmd",
    "policy": "cxlkv.bench.policy:policy_cmd",
    "gpu": "cxlkv.bench.gpu:gpu_cmd",
    "ha": "cxlkv.bench.ha:ha_cmd",
    "all": "cxlkv.bench.all:all_cmd",
}


@click.group("bench", cls=LazyGroup, lazy=BENCHMARKS)
def bench_group() -> None:
    """Benchmarks: a table on stdout, or --json records with ratio_to_limit."""
