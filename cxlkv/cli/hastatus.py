"""Who leads: the masters of a leader-elected cluster as etcd records them (docs/ha.md).

Used by ``cxlkv status --etcd HOST:PORT`` (and ``$CXLKV_ETCD``): one Range of
``P/leader``, ``P/epoch`` and ``P/masters/`` (:mod:`cxlkv.master.election`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Sequence

__all__ = ["read_masters", "render_masters"]


def read_masters(endpoints: Sequence[str], prefix: str, timeout_s: float = 2.0, tls: Any = None) -> dict[str, Any]:
    """The leader, the standbys and the epoch, from etcd.

    Returns:
        ``{"leader": {...} | None, "standbys": [{...}], "epoch": int, "etcd": [endpoints]}``;
        each master is a :class:`~cxlkv.master.election.MasterInfo` as a dict.

    Raises:
        Unavailable: etcd cannot be reached.
        ConfigError: https endpoints without ``tls``.
    """
    from cxlkv.master.election import MasterInfo
    from cxlkv.master.etcd import EtcdClient

    p = prefix.rstrip("/")

    async def read() -> tuple[Any, Any, list[Any]]:
        c = EtcdClient(list(endpoints), timeout_s=timeout_s, tls=tls)
        try:
            return (await c.get(f"{p}/leader".encode()), await c.get(f"{p}/epoch".encode()),
                    await c.get_prefix(f"{p}/masters/".encode()))
        finally:
            await c.close()

    leader_kv, epoch_kv, members = asyncio.run(read())
    leader = MasterInfo.decode(leader_kv.value) if leader_kv is not None else None
    infos = [i for i in (MasterInfo.decode(kv.value) for kv in members) if i is not None]
    standbys = [dataclasses.asdict(i) for i in infos if leader is None or i.master_id != leader.master_id]
    try:
        epoch = int(epoch_kv.value) if epoch_kv is not None else 0
    except ValueError:
        epoch = 0
    return {"leader": dataclasses.asdict(leader) if leader is not None else None, "standbys": standbys,
            "epoch": epoch, "etcd": list(endpoints)}


def render_masters(ha: dict[str, Any]) -> list[tuple[str, str]]:
    """Summary rows for ``cxlkv status``."""
    rows: list[tuple[str, str]] = []
    ld = ha.get("leader")
    now = time.time()
    if ld is None:
        rows.append(("leader", "none (an election is under way, or no master can reach etcd)"))
    else:
        state = "serving" if ld.get("epoch") else "taking over"
        rows.append(("leader", f"{ld['address']}  master {ld['master_id']}  epoch {ld.get('epoch', 0)}  "
                               f"{state} for {max(0.0, now - ld.get('since_s', now)):.0f} s  "
                               f"({ld.get('host', '')} pid {ld.get('pid', '')})"))
    sb = ha.get("standbys", [])
    rows.append(("standbys", ", ".join(f"{s['address']} ({s['master_id']})" for s in sb) or "none"))
    rows.append(("epoch", f"{ha.get('epoch', 0)} (etcd {','.join(ha.get('etcd', []))})"))
    return rows
