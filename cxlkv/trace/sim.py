"""The conversation trace and an in-process cache simulator over it.

The trace (``../shared/traces/conversation_trace.jsonl``, Mooncake FAST'25,
Apache-2.0) has one JSON object per request: ``timestamp`` (ms from the trace
start), ``input_length`` and ``output_length`` (tokens) and ``hash_ids``: one id
per 512-token prompt block, equal ids at equal positions meaning a shared prefix.

The simulator replays the same request stream against a block cache of a fixed
capacity (in blocks) with the store's own semantics: a request hits the longest
*resident prefix* of its blocks (a block after the first miss is no hit, even if
resident); hit blocks are touched head-last (so the head of a prompt, which every
longer prompt needs, is the most recently used); missing blocks are inserted in
order, room for all of them made first (the store's master places a batch of
puts, evicting as needed, before any of them is committed and reaches the
policy); then a policy that takes prefix queries (``on_prefix``) is told the
request's chain and how much of it matched — in the store that report follows the
puts (hits are reported asynchronously, in batches). Eviction runs when the
inserts do not fit, and frees down to the low watermark (``low_watermark *
capacity``) below what they need — the store's master does the same on an
allocation failure. The policy is any ``cxlkv.eviction_policies`` plugin,
so the simulation and the store evict by the very same code.

Published figures this reproduces (traces/README.md): LRU hits 5.2 / 12.5 / 27.8 /
35.8 % of blocks at 1 / 3 / 10 / 30 % capacity; unbounded 36.6 %. The offline optimum
(:func:`simulate_belady`, Belady's MIN under the same prefix-hit rule) hits 24.3 /
34.6 / 36.6 / 36.6 % (traces/README.md quotes 24.6 / 34.8 from another simulator).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Container, Iterable, Sequence

__all__ = [
    "TOKENS_PER_BLOCK",
    "Request",
    "load_trace",
    "TraceError",
    "unique_blocks",
    "SimResult",
    "simulate",
    "simulate_unbounded",
    "simulate_belady",
]

#: Tokens per prompt block in the trace (Mooncake's block size).
TOKENS_PER_BLOCK = 512


@dataclass(frozen=True, slots=True)
class Request:
    """One trace request.

    Attributes:
        timestamp_s: arrival time, seconds from the trace start.
        input_tokens: prompt length in tokens.
        output_tokens: generated tokens.
        hash_ids: prefix-block ids, one per 512-token block of the prompt.
    """

    timestamp_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]

    def block_tokens(self, i: int) -> int:
        """Tokens in block ``i`` (the last block may be partial)."""
        if i < len(self.hash_ids) - 1:
            return TOKENS_PER_BLOCK
        rest = self.input_tokens - TOKENS_PER_BLOCK * (len(self.hash_ids) - 1)
        return max(1, min(TOKENS_PER_BLOCK, rest))

    def prefix_tokens(self, n_blocks: int) -> int:
        """Tokens covered by the first ``n_blocks`` blocks."""
        if n_blocks >= len(self.hash_ids):
            return sum(self.block_tokens(i) for i in range(len(self.hash_ids)))
        return TOKENS_PER_BLOCK * n_blocks


class TraceError(ValueError):
    """A trace file with a line that is not a request (the message names the file and line)."""


def load_trace(path: str | os.PathLike[str], limit: int | None = None) -> list[Request]:
    """Read a trace file (JSON lines).

    Args:
        path: the ``.jsonl`` file.
        limit: read only the first ``limit`` requests (``None``: all).

    Raises:
        FileNotFoundError: no such file.
        TraceError: a line that is not a request (the message gives the line number).
    """
    out: list[Request] = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.append(Request(
                    float(d["timestamp"]) / 1000.0, int(d["input_length"]),
                    int(d["output_length"]), tuple(int(h) for h in d["hash_ids"]),
                ))
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(f"{path}:{lineno}: not a trace request ({exc})") from None
    return out


def unique_blocks(trace: Iterable[Request]) -> int:
    """Number of distinct block ids in ``trace``."""
    return len({h for r in trace for h in r.hash_ids})


@dataclass(frozen=True)
class SimResult:
    """Outcome of a simulation.

    Attributes:
        blocks: blocks requested.
        hit_blocks: blocks served from the cache (longest resident prefix).
        tokens: prompt tokens requested.
        hit_tokens: prompt tokens in hit blocks.
    """

    blocks: int
    hit_blocks: int
    tokens: int
    hit_tokens: int

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0


class _LruPolicy:
    """Plain LRU with the plugin interface (used when no master policy is asked for)."""

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def on_put(self, key) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def on_hit(self, key) -> None:
        self._order.move_to_end(key)

    def on_remove(self, key, evicted: bool = False) -> None:
        self._order.pop(key, None)

    def candidates(self, n: int):
        it = iter(self._order)
        return [next(it) for _ in range(min(n, len(self._order)))]


def _resident_prefix(ids: Sequence[int], resident: Container[int]) -> int:
    """How many of ``ids``, from the first, are resident: the longest cached prefix."""
    m = 0
    for h in ids:
        if h not in resident:
            break
        m += 1
    return m


def _make_policy(name: str):
    if name == "lru_builtin":
        return _LruPolicy()
    from cxlkv.master.eviction import load_policy  # the store's own plugin

    return load_policy(name)


def simulate(
    trace: Sequence[Request],
    capacity_blocks: int,
    *,
    policy: str = "lru",
    low_watermark: float = 1.0,
) -> SimResult:
    """Replay ``trace`` against a block cache of ``capacity_blocks``.

    Args:
        trace: requests in arrival order.
        capacity_blocks: blocks the cache holds (>= 1).
        policy: an eviction policy name from the ``cxlkv.eviction_policies``
            registry (the store's own code), or ``"lru_builtin"`` (a plain LRU
            that needs no master package).
        low_watermark: when an insert finds the cache full, evict down to
            ``floor(low_watermark * capacity_blocks)`` blocks (1.0: one block).

    Returns:
        Block and token hit counts. Deterministic. O(blocks) time.
    """
    cap = max(1, int(capacity_blocks))
    low = min(cap - 1, int(low_watermark * cap)) if low_watermark < 1.0 else cap - 1
    pol = _make_policy(policy)
    on_prefix = getattr(pol, "on_prefix", None)
    resident: set[int] = set()
    blocks = hit_blocks = tokens = hit_tokens = 0
    for req in trace:
        ids = req.hash_ids
        m = _resident_prefix(ids, resident)
        blocks += len(ids)
        hit_blocks += m
        tokens += req.prefix_tokens(len(ids))
        hit_tokens += req.prefix_tokens(m)
        for h in reversed(ids[:m]):
            pol.on_hit(h)
        # Room for each missing block in turn, then the commits: the store's master
        # places every put of a batch (evicting as needed; a block evicted meanwhile
        # is put again) before any of them is committed and reaches the policy.
        placed: dict[int, None] = {}
        for h in ids[m:]:
            if h in resident or h in placed:
                continue
            if len(resident) + len(placed) >= cap:
                want = len(resident) + len(placed) - min(low, cap - 1)
                for victim in pol.candidates(min(want, len(resident))):
                    resident.discard(victim)
                    pol.on_remove(victim, evicted=True)  # as the master does (ARC keeps a ghost)
                if len(resident) + len(placed) >= cap:
                    continue  # nothing evictable: the put fails (NO_SPACE)
            placed[h] = None
        for h in placed:
            resident.add(h)
            pol.on_put(h)
        if on_prefix is not None:
            on_prefix(ids, m)
    return SimResult(blocks, hit_blocks, tokens, hit_tokens)


def simulate_belady(trace: Sequence[Request], capacity_blocks: int) -> SimResult:
    """The offline optimum at ``capacity_blocks``: Belady's MIN (evict the block whose
    next request lies farthest in the future; never-again blocks first) under the
    simulator's rules (hit = longest resident prefix, every missing block is
    inserted, then the farthest is evicted — possibly the one just inserted).

    Belady, "A study of replacement algorithms for a virtual-storage computer",
    IBM Systems Journal 5(2), 1966. MIN is optimal for single-block hits; with the
    prefix rule it is the usual reference, not a proven optimum. O(blocks · log
    blocks) time, reads the trace twice.
    """
    import heapq

    cap = max(1, int(capacity_blocks))
    never = len(trace)
    nxt: list[list[int]] = [[]] * len(trace)
    seen: dict[int, int] = {}
    for ri in range(len(trace) - 1, -1, -1):
        ids = trace[ri].hash_ids
        nxt[ri] = [seen.get(h, never) for h in ids]
        for h in ids:
            seen[h] = ri
    resident: dict[int, int] = {}  # block -> its next request
    heap: list[tuple[int, int]] = []  # (-next request, block), stale entries skipped
    blocks = hit_blocks = tokens = hit_tokens = 0
    for ri, req in enumerate(trace):
        ids = req.hash_ids
        m = _resident_prefix(ids, resident)
        blocks += len(ids)
        hit_blocks += m
        tokens += req.prefix_tokens(len(ids))
        hit_tokens += req.prefix_tokens(m)
        for h, nu in zip(ids, nxt[ri]):
            resident[h] = nu
            heapq.heappush(heap, (-nu, h))
            while len(resident) > cap:
                neg, v = heapq.heappop(heap)
                if resident.get(v) == -neg:
                    del resident[v]
    return SimResult(blocks, hit_blocks, tokens, hit_tokens)


def simulate_unbounded(trace: Sequence[Request]) -> SimResult:
    """The bound: a cache that never evicts (every block seen before, on a resident prefix, hits)."""
    return simulate(trace, capacity_blocks=max(1, unique_blocks(trace)), policy="lru_builtin")
