"""``prefix``: an eviction policy for a prefix cache (adaptive S3-FIFO over prefix chains).

What a prefix cache knows and plain LRU/ARC do not use:

* **Most blocks are used once.** On the Mooncake conversation trace 76 % of the
  182,790 blocks are never requested again, and 24 % of those that are come back
  after more than 2 minutes (median gap 135 s). A new block therefore enters a small
  probationary FIFO (S3-FIFO's *small* queue) and leaves it quickly unless it is hit
  while there; a long *ghost* list of recently evicted keys (four times the resident
  count by default, twelve while returns are admitted at a rate, below; a ghost is a
  key hash and a few counts) recognises a block that comes back after a
  long gap, which is then admitted to the protected *main* queue. Main evicts the
  lowest *rank*: a block's last use plus a credit per use it has had (its uses are
  remembered through the ghost), as GreedyDual-Size-Frequency and LFU with dynamic
  aging rank objects: a hot head (the shared system prompts; block 0 of the trace is
  in every request) outlasts a block used once more, which outlasts nothing. The
  credit is ``use_credit`` × the resident count of uses (puts and hits) per use, up
  to ``uses_cap`` uses.
* **A second use comes late or not at all.** Apart from requests that arrive together,
  about 6 % of reuses on the trace come within 30 s (a user reads and types before the
  next turn). When the cache holds less than that, probation is worse than useless: a
  new block sits there for nothing, in the place of a block with a record of reuse.
  The policy measures it: ``reach`` is the share (an EWMA, starting at 1) of first
  reuses that come within half a resident count of puts after the block's first put,
  observed on hits and, for blocks already evicted, on their ghost hits (so it is
  measured whether or not probation is on). While ``reach`` is below ``reach_keep``
  (0.25), the blocks a prefix query missed and that are written now skip probation:
  they go to the front of the victims (adaptive insertion, as DIP's bypass of
  thrashing lines). On the trace ``reach`` settles near 0.00 / 0.09 / 0.53 / 0.91 at 1
  / 3 / 10 / 30 % capacity.
* **Main can hold what probation cannot.** Probation keeps a newcomer a few percent of
  a resident count of puts; main keeps a block with one use about one resident count
  (its credit). ``reach_full``, the share of first reuses within one resident count of
  puts (measured as ``reach``, starting at 0.5), settles near 0.02 / 0.33 / 0.64 / 0.94 at
  1 / 3 / 10 / 30 %. While misses skip probation and ``reach_full`` is at least
  ``head_reach`` (0.25), the first ``head_keep`` (8) misses of a prefix query — the
  blocks right after the cached prefix, which are reused most (28 % of new blocks
  within 3 blocks of the match are requested again on the trace, 22 % past 30) and
  usable as soon as they are cached, their prefix being cached — enter main as blocks
  with one use instead; the rest of the query's misses still skip probation. As in
  DIP the insertion is chosen by a measurement; the place after the match acts as
  SHiP's signature of likely reuse (fixed here, not learnt). Measured on the trace at
  3 %: 4 blocks +0.31 points, 8 +0.36, 12 +0.16, every miss -1.58; on either half of
  the trace at 3 % / 6 % of its unique blocks, 8 blocks changed +0.06 / +0.57 and
  0.00 / +0.72 points; at 1 % (``reach_full`` 0.02) keeping even one head lost 0.24,
  which is why it waits for ``reach_full``.
* **When main cannot hold them, returns must come at a rate.** At 1 % the 4x ghost sent
  23,176 second uses into main, of which 29 % were hit before they left; they took 47 %
  of main's room and earned the fewest hits for it (0.064 per slot and resident count
  of puts, against 0.077 / 0.091 / 0.098 / 0.134 with 3 / 4 / 5 / 6 uses). A block
  whose second use came late comes back later and less often: on the trace, of blocks
  whose second use came more than 3 resident counts (at 1 %) of first puts after their
  first, 20 % are used again within 5 more, against 33 % of those back within 1 to 3
  and 38 % of those back within 1. So while ``reach_full`` is below ``head_reach`` (main
  cannot hold a query's first misses), a ghost return enters main only if it comes
  within ``return_window`` (3) resident counts of evictions per use it has had; a later
  one keeps its uses (its next return is judged with one more) but is put as a
  newcomer (``late_returns``). For that record to outlast the gaps, the ghost holds
  ``late_ghost_factor`` (12) times the resident count meanwhile, instead of
  ``ghost_factor``. As LIRS keeps blocks by their inter-reference recency rather than
  their recency, with a window that grows with the uses (a frequency over a window).
  Measured on the trace at 1 %: +0.40 points (the window with a 4x ghost -0.14, the 12x
  ghost admitting every return -0.78; a window of 2.5 / 3.5 +0.23 / +0.16; a ghost of
  10x / 14x +0.39 / +0.45); on either half of the trace at 1 % / 3 % of its unique
  blocks +0.12 / +0.26 and +0.16 / -0.17 points; at 3 % of the whole trace -0.02, at 10
  and 30 % (``reach_full`` 0.64 / 0.94) nothing; at 0.5 / 2 / 5 % +0.29 / +0.06 / 0.00.
* **The reverse holds when the cache is large.** When most first reuses (``lru_reach``,
  0.7) come within one resident count of puts, probation is given a floor of up to
  ``lru_floor`` (0.8) of the cache: newcomers are kept about as long as LRU would keep
  them (at 30 % LRU beats ARC and S3-FIFO on this trace).
* **A block is only useful if every block before it in its prefix is cached.** When
  a block leaves, its resident descendants are *orphans*: no lookup can reach them
  until the missing block is written again. They are nominated first. In main, the
  blocks of a chain named by a query are used together and ordered by depth: a block
  seldom has more uses than its parent, and of two of equal rank the deeper one goes
  first, so a chain is shortened from its tail and what stays is still a usable
  prefix.
* **The last block of a prefix query is rarely reused** (0.8 % of them on the trace:
  the next turn of a conversation extends the prompt, so its partial last block has
  another id). A block known to end a query enters the victim queue directly.
* **The best size of the probationary queue depends on the capacity.** Between the two
  bounds above the target size adapts as in ARC: a ghost hit on a key that the small
  queue dropped recently (within the last *resident count* drops) grows it, one the
  main queue dropped recently shrinks it; the step is ARC's ``max(1, |B2| / |B1|)``
  (the ratio of the recent ghosts of each origin).

Where the prefix structure comes from (what the store receives): the key names are
opaque to the master, so chains are learnt from **prefix queries** — a reader asking
for the longest cached prefix of ``keys`` names the whole chain, head first, and how
much of it matched. :meth:`PrefixPolicy.on_prefix` takes that (the master calls it for
its own ``MatchPrefix`` and for the prefix queries readers report with their index
hits, ``ReportReadsRequest.prefix_*``). Reports are asynchronous: a query's report may come
before or after the puts of its misses; links for keys not resident yet wait in a
bounded table (as many entries as resident keys) until their put, with whether they
skip probation or enter main as a query's head. Ablations, simulated on the trace at
1 / 3 / 10 / 30 % (the policy: 11.22 / 18.86 / 29.40 / 35.56): without the late-return
rule (every ghost return admitted, a 4x ghost) 10.82 / 18.88 / 29.40 / 35.56; without
prefix reports 10.78 / 17.99 / 29.01 / 35.56; without the bypass (and so without kept
heads) 11.16 / 18.05 / 29.40 / 35.56; without kept heads 11.22 / 18.51 / 29.40 /
35.56; without the large-cache floor 11.22 / 18.86 / 28.85 / 34.92; without the credit
per use (a plain LRU main) 11.00 / 17.54 / 29.49 / 35.66; ghost 3x 11.19 / 18.73 /
29.37 / 35.56, 6x 11.20 / 18.80 / 29.43 / 35.56 (the late ghost 12x in both). The
previous design (a CLOCK main, a ghost of 3x, no
bypass, no floor) measured 10.22 / 17.19 / 28.66 / 34.92. Tried and not kept, with
the late-return rule (at 1 %): a window that does not grow with the uses (3 resident
counts for a second use, none past it) +0.28 against the rule's +0.40; TinyLFU-like
admission on top of that window (a return entering a full main only with at least
as many uses as main's lowest rank) +0.03 more; a late second use admitted with less credit instead of put
as a newcomer, no gain; a credit of 0.75x-2x, no gain. Before it, while
``reach_full`` is under 0.1, a ghost return entering a full main only with more uses
than main's lowest rank (TinyLFU's admission), with a second ghost of 8x for keys of
3 or more uses: 11.03 / 18.83 at 1 / 3 % on the whole trace, but on its halves -0.05
to +0.12 points at 1 % and -0.07 to -0.30 at 3 % of their unique blocks; (before heads
were kept) a credit of 0.5x or 2x, a cap of 8 or 32 uses, a ghost of 8x or 12x, more
credit for blocks near the head of a chain, a credit of uses^0.7 or uses^1.3: each
between -0.8 and 0.0 points at 1 and 3 %.

Sources: S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
SOSP'23: small/main/ghost queues, quick demotion); GreedyDual-Size-Frequency
(Cherkasova, HP Labs HPL-98-69, 1998) and LFU with dynamic aging (Arlitt et al.,
"Evaluating content management techniques for Web proxy caches", 2000): a rank of
clock plus frequency credit; ARC (Megiddo & Modha, FAST'03: the
adaptive split driven by ghost hits); DIP (Qureshi et al., "Adaptive insertion
policies for high performance caching", ISCA'07: inserting new lines where they leave
first when the working set does not fit, chosen by a measurement); SHiP (Wu et al.,
"SHiP: signature-based hit predictor for high performance caching", MICRO'11:
insertion by a predictor of re-reference); W-TinyLFU (Einziger
et al., ACM ToS 2017: admission of a newcomer only on evidence of reuse, a small
window); SGLang RadixAttention (Zheng et al., 2024: a prefix tree whose leaves are
evicted first, a node being useful only with its ancestors); LIRS (Jiang & Zhang,
"LIRS: an efficient low inter-reference recency set replacement policy to improve
buffer cache performance", SIGMETRICS'02: a block kept on the gap between its last two
uses, not on its recency); "KVCache Cache in the
Wild" (Wang et al., arXiv 2506.02634: reuse is skewed, most blocks are used once, head
blocks outlast tail blocks, workload-aware eviction beats LRU/LFU).

Measured on the conversation trace, 512-token blocks, hit = longest cached prefix
(docs/master.md "Choosing an eviction policy", ``bench/results/policy.json``),
simulated: 11.22 / 18.86 / 29.40 / 35.56 % at 1 / 3 / 10 / 30 % of the unique blocks
(the store 11.05 / 18.70 / 29.42 / 35.55; ARC 7.53 / 14.56 / 28.64 / 34.92, on the store
7.38 / 14.49 / 28.64 / 34.84; LRU 5.23 / 12.52 / 27.87 / 35.77; Belady 24.30 / 34.55 /
36.64 / 36.64). That is at least 10 % at 1 % and 16 % at 3 %, above ARC at every
capacity, and closes 22.0 % of the gap from ARC to Belady at 1 % (a fifth: 10.88 %;
the store 21.7 %, against 10.76 % from the store's ARC) and 21.5 % at 3 % (a fifth:
18.56 %; the store 21.0 %, against 18.50 %). Per block it costs the master 2.7-6.3x
ARC's CPU (8.1-11.8 against 1.3-4.1 us in a quiet run before the late-return rule,
``bench/results/policy_cost.json``; the rule adds one comparison per ghost hit, and
timed with and without it under the same load the two were alike within the noise).

Cost: main is a ``SortedList`` keyed by (rank, depth): a use, a move into or out
of main is O(log n); everything else is O(1) amortised per key (an orphan is
nominated once per residency); ``on_prefix`` is O(len(keys) · log n);
``candidates(n)`` is O(n + log n) and changes nothing. Memory: resident keys, one
ghost hash per evicted key up to ``ghost_factor`` × resident (``late_ghost_factor``
× while returns are admitted at a rate), one pending link per
queried-but-absent key up to the resident count. All methods run on the master's
event-loop thread (not thread-safe).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Sequence

from sortedcontainers import SortedList

from cxlkv.config import MasterConfig
from cxlkv.master.eviction import EvictionPolicy

__all__ = ["PrefixPolicy"]

_SMALL, _MAIN, _VICTIM = 1, 2, 3  # queue of a resident key: probation / protected / next out
_FREQ_MAX = 3  # S3-FIFO's 2-bit counter (hits while in probation)


class _Entry:
    """A resident key: its queue, frequency and place in the prefix forest."""

    __slots__ = ("queue", "freq", "parent", "kids", "from_main", "born", "last", "rank", "uses")

    def __init__(self, parent: str | None) -> None:
        self.queue = 0
        self.freq = 0
        self.uses = 1  # uses (puts and hits) while resident and, through the ghost, before
        self.last = 0  # use number (puts and hits) of its last use
        self.rank: tuple | None = None  # its place in main's recency order while there
        self.born = -1  # put number of a first-time key until its first reuse (-1: none pending)
        self.parent = parent  # the key before this one in its prefix (None: unknown / head)
        self.kids: list[str] | None = None  # resident keys whose parent this is
        self.from_main = False  # in the victim queue after leaving main (for the ghost's origin)


class PrefixPolicy(EvictionPolicy):
    """Adaptive S3-FIFO with a long ghost and a frequency-credited LRU main; probation
    skipped while out of reach (a query's first misses kept in main instead while main
    can hold them, ghost returns admitted at a rate when it cannot), orphan-first and
    query-tail demotion, chains shortened from the tail.

    Queues of resident keys: *victim* (a FIFO ``OrderedDict``, nominated first: orphans
    and blocks that skip probation at its front, then blocks that ended a prefix query,
    then what the other two queues dropped), *small* (a FIFO: new keys, probation),
    *main* (keys with evidence of reuse, lowest rank first: last use + a credit per use,
    deeper blocks of a chain first among equals). ``candidates(n)`` walks victim, small,
    main in that order.

    Args:
        config: the master's configuration (read-only), or ``None`` in tests and the
            simulation.
        ghost_factor: most ghost entries, as a multiple of the resident count (4.0;
            0 disables the ghost).
        small_init: initial target of the small queue, a fraction of the resident
            count (0.1, S3-FIFO's).
        small_min, small_max: bounds of the adaptive target (fractions; 0.01, 0.9).
        reach_span: a first reuse is "in reach" within this many resident counts of
            puts after the block's first put (0.5).
        reach_keep: below this share of first reuses in reach, the misses of a prefix
            query skip probation (0.25; a negative value never skips).
        lru_reach: above this share of first reuses within one resident count of puts,
            probation gets a floor (0.7; above 1 never).
        lru_floor: the floor's most, as a fraction of the resident count, reached when
            every first reuse is within one resident count (0.8).
        reach_alpha: weight of one first reuse in the two EWMAs (1/1024).
        reach_init: the starting ``reach`` (1.0: probation is kept until first reuses are
            measured out of its reach; starting at 0 gains 0.05 points at 3 % on the
            trace but skips probation before anything is known, and with hit reports
            arriving late a short replay at 30 % lost 2.4 points against its simulation).
        use_credit: main's credit per use, in resident counts of uses (1.0; 0: a
            plain LRU).
        uses_cap: uses counted in the credit at most (16).
        head_keep: while misses skip probation and ``reach_full`` is at least
            ``head_reach``, this many first misses of a prefix query enter main instead
            (8 blocks, 4,096 tokens of the trace; 0 never).
        head_reach: the ``reach_full`` from which heads are kept (0.25); below it
            ghost returns are admitted at a rate (``return_window``).
        late_ghost_factor: the ghost's most, as a multiple of the resident count, while
            ``reach_full`` is below ``head_reach`` (12.0; not below ``ghost_factor``).
        return_window: while ``reach_full`` is below ``head_reach``, a ghost return
            enters main only within this many resident counts of evictions per use it
            has had (3.0); a later one keeps its uses and is put as a newcomer.
    """

    def __init__(self, config: MasterConfig | None = None, *, ghost_factor: float = 4.0,
                 small_init: float = 0.1, small_min: float = 0.01, small_max: float = 0.9,
                 reach_span: float = 0.5, reach_keep: float = 0.25, lru_reach: float = 0.7,
                 lru_floor: float = 0.8, reach_alpha: float = 1 / 1024, reach_init: float = 1.0,
                 use_credit: float = 1.0, uses_cap: int = 16, head_keep: int = 8,
                 head_reach: float = 0.25, late_ghost_factor: float = 12.0,
                 return_window: float = 3.0) -> None:
        super().__init__(config)
        self._late_ghost_factor, self._return_window = float(late_ghost_factor), float(return_window)
        self._head_keep, self._head_reach = int(head_keep), float(head_reach)
        self._use_credit, self._uses_cap = float(use_credit), int(uses_cap)
        self._reach_span, self._reach_keep = float(reach_span), float(reach_keep)
        self._lru_reach, self._lru_floor, self._reach_alpha = float(lru_reach), float(lru_floor), float(reach_alpha)
        self._reach = float(reach_init)  # share of first reuses within reach_span x resident puts of the first put
        self._reach_full = 0.5  # the same within one resident count of puts
        self._puts = 0  # puts of keys not resident (the clock of first reuses)
        self._entries: dict[str, _Entry] = {}
        self._small: OrderedDict[str, None] = OrderedDict()
        self._main: OrderedDict[str, None] = OrderedDict()  # membership; the order is _mq's
        self._mq: SortedList = SortedList()  # main by (last use, -depth in its chain, key)
        self._uses = 0  # the use clock
        self._victim: OrderedDict[str, None] = OrderedDict()
        # ghost: hash(key) -> (came from main, eviction number of its origin, put number of a
        # first-time key not reused yet or -1, its uses, eviction number of all origins)
        self._ghost: OrderedDict[int, tuple[bool, int, int, int, int]] = OrderedDict()
        self._ghost_factor = float(ghost_factor)
        self._small_target = -1.0  # keys; < 0 until the first put sets it from small_init
        self._small_init, self._small_min, self._small_max = small_init, small_min, small_max
        self._drops_small = 0  # evictions of keys that came from small (ghost sequence numbers)
        self._drops_main = 0
        self._ghosts_small = 0  # ghost entries by origin (ARC's |B1|, |B2|)
        self._ghosts_main = 0
        # links for keys named by a prefix query but not resident (yet):
        # key -> (parent, ends a query, resident keys named right after it, where its put goes
        # (_SMALL; _VICTIM: skips probation; _MAIN: a head kept), its depth in the query, the use
        # clock at the query)
        self._pending: OrderedDict[str, tuple[str | None, bool, list[str] | None, int, int, int]] = OrderedDict()
        self.counters = {"ghost_hits": 0, "orphans": 0, "query_tails": 0, "promotions": 0, "bypassed": 0,
                         "heads_kept": 0, "late_returns": 0}

    # ------------------------------------------------------------------ queues
    def _queue(self, q: int) -> OrderedDict[str, None]:
        return self._small if q == _SMALL else self._main if q == _MAIN else self._victim

    def _rank(self, key: str, e: _Entry, depth: int = 0) -> None:
        # last use + a credit per use (GDSF / LFU-DA's priority): use_credit x resident uses
        credit = self._use_credit * len(self._entries) * min(e.uses, self._uses_cap)
        e.rank = (e.last + credit, -depth, key)
        self._mq.add(e.rank)

    def _move(self, key: str, e: _Entry, q: int, front: bool = False) -> None:
        if e.queue == _MAIN:
            self._mq.remove(e.rank)
            e.rank = None
        if q == _MAIN:
            self._rank(key, e)
        if e.queue:
            del self._queue(e.queue)[key]
        d = self._queue(q)
        d[key] = None
        if front:
            d.move_to_end(key, last=False)
        e.queue = q

    def _balance(self) -> None:
        """S3-FIFO's eviction walk, done eagerly so ``candidates`` stays read-only:
        small over its target → its oldest goes to main (hit while there) or to the
        victims; main over the rest → its lowest rank to the victims. The
        target is kept within ``[floor, small_max]`` of the resident count, the floor
        being ``small_min`` or, while most first reuses are in reach, up to
        ``lru_floor``."""
        n = len(self._entries)
        target = self._small_target
        if target < 0:
            target = self._small_init * n
        floor = self._small_min
        if self._reach_full > self._lru_reach:  # newcomers' reuses are in reach: hold them long
            floor = max(floor, self._lru_floor * (self._reach_full - self._lru_reach) / (1.0 - self._lru_reach))
        target = self._small_target = min(max(target, floor * n), self._small_max * n)
        small, main, entries = self._small, self._main, self._entries
        while len(small) > target:
            key, _ = small.popitem(last=False)
            e = entries[key]
            e.queue = 0
            if e.freq > 0:
                e.freq = 0
                self._move(key, e, _MAIN)
                self.counters["promotions"] += 1
            else:
                e.from_main = False
                self._move(key, e, _VICTIM)
        mq = self._mq
        while len(main) > n - target:
            key = mq[0][2]  # main's lowest rank
            e = entries[key]
            e.from_main = True
            self._move(key, e, _VICTIM)

    def _link(self, key: str, e: _Entry, parent: str | None, orphan_if_absent: bool = True) -> None:
        if parent is None or e.parent == parent:
            return
        self._unlink(key, e)
        e.parent = parent
        pe = self._entries.get(parent)
        if pe is None:
            if orphan_if_absent:
                self._orphan(key, e)  # its prefix is not cached: unreachable
            return
        if pe.kids is None:
            pe.kids = []
        pe.kids.append(key)

    def _unlink(self, key: str, e: _Entry) -> None:
        if e.parent is not None:
            pe = self._entries.get(e.parent)
            if pe is not None and pe.kids:
                try:
                    pe.kids.remove(key)
                except ValueError:
                    pass

    def _orphan(self, key: str, e: _Entry) -> None:
        """``key`` and its resident descendants cannot be reached: nominate them first."""
        stack = [(key, e)]
        while stack:
            k, ce = stack.pop()
            ce.from_main = ce.queue == _MAIN
            self._move(k, ce, _VICTIM, front=True)
            self.counters["orphans"] += 1
            if ce.kids:
                stack.extend((c, self._entries[c]) for c in ce.kids if c in self._entries)
                ce.kids = None  # they are orphans now; a re-put of this key links afresh

    # ------------------------------------------------------------------- events
    def on_put(self, key: str) -> None:
        """See :meth:`EvictionPolicy.on_put`. A key in the ghost goes to main (evidence
        of reuse, and an ARC-style adaptation of the small queue's target); one that
        ended a prefix query goes to the victims; one whose query came first and found
        probation out of reach to the front of the victims, or to main if it is one of the
        query's first ``head_keep`` misses and main can hold it; any other to small."""
        entries = self._entries
        e = entries.get(key)
        if e is not None:  # a new version of a resident key: a use
            self.on_hit(key)
            return
        link = self._pending.pop(key, None)
        e = entries[key] = _Entry(None)
        self._uses += 1
        e.last = self._uses
        self._puts += 1
        e.born = self._puts
        if link is not None:
            if link[0] is not None:
                self._link(key, e, link[0])
            for c in link[2] or ():  # resident keys a query named after this one
                ce = entries.get(c)
                if ce is not None and ce.parent == key:
                    if e.kids is None:
                        e.kids = []
                    e.kids.append(c)
        if e.queue == _VICTIM:  # linked under a parent that is not resident
            self._balance()
            return
        g = self._ghost.pop(hash(key), None) if self._ghost_factor > 0 else None
        since = self._drops_small + self._drops_main - g[4] if g is not None else 0
        if g is not None and self._reach_full < self._head_reach and since > self._return_window * len(entries) * g[3]:
            # Back too late for its record (main cannot hold a query's first misses, so
            # it takes returns only at a rate: within return_window resident counts of
            # evictions per use it has had): its uses are counted, it is not admitted.
            self.counters["late_returns"] += 1
            self._forget(g[0])
            e.uses = g[3] + 1
            if g[2] >= 0 and since <= self._ghost_factor * len(entries):
                self._first_reuse(self._puts - g[2])  # measured over the ghost's usual span only
            e.born = -1
            g = None
        if g is not None:
            self.counters["ghost_hits"] += 1
            self._adapt(g[0], g[1])
            e.born = -1
            e.uses = g[3] + 1
            if g[2] >= 0:
                self._first_reuse(self._puts - g[2])
            self._move(key, e, _MAIN)
        elif link is not None and link[1]:
            self.counters["query_tails"] += 1
            self._move(key, e, _VICTIM)
        elif link is not None and link[3] == _VICTIM:  # its query came first, probation out of reach
            self.counters["bypassed"] += 1
            self._move(key, e, _VICTIM, front=True)
        elif link is not None and link[3] == _MAIN:  # ... and it is one of the query's first misses
            self.counters["heads_kept"] += 1
            e.last = link[5]  # used by its query: a chain's heads rank alike, the deeper first out
            self._move(key, e, _MAIN)
            self._mq.remove(e.rank)
            self._rank(key, e, link[4])
        else:
            self._move(key, e, _SMALL)
        self._balance()

    def _first_reuse(self, distance: int) -> None:
        """A first-time key is used again ``distance`` puts after its first put (a hit, or a
        put found in the ghost): the reach estimates move towards whether that is within
        ``reach_span`` x / 1 x the resident count (EWMAs, weight ``reach_alpha``)."""
        n = len(self._entries)
        a = self._reach_alpha
        self._reach += a * ((1.0 if distance <= self._reach_span * n else 0.0) - self._reach)
        self._reach_full += a * ((1.0 if distance <= n else 0.0) - self._reach_full)

    def _adapt(self, from_main: bool, seq: int) -> None:
        """ARC's rule on a ghost hit of a recent eviction (within the last resident-count
        drops of that origin): small dropped it → grow small; main → shrink small."""
        n = max(1, len(self._entries))
        b1, b2 = max(1, self._ghosts_small), max(1, self._ghosts_main)
        if from_main:
            self._ghosts_main -= 1
            if self._drops_main - seq <= n:
                self._small_target -= max(1.0, b1 / b2)
        else:
            self._ghosts_small -= 1
            if self._drops_small - seq <= n:
                self._small_target += max(1.0, b2 / b1)

    def _forget(self, from_main: bool) -> None:
        if from_main:
            self._ghosts_main -= 1
        else:
            self._ghosts_small -= 1

    def on_hit(self, key: str) -> None:
        """See :meth:`EvictionPolicy.on_hit`: in small a count more (up to 3, promoted
        when small drops it); in main ranked anew (used now, a use more); a victim that is hit after all
        goes back to main. A key's first hit is a first reuse (``reach``). O(log n)."""
        e = self._entries.get(key)
        if e is None:
            return
        if e.born >= 0:
            self._first_reuse(self._puts - e.born)
            e.born = -1
        self._uses += 1
        e.last = self._uses
        e.uses += 1
        if e.queue == _VICTIM:
            e.freq = 0
            self._move(key, e, _MAIN)
            self._balance()
        elif e.queue == _MAIN:
            self._mq.remove(e.rank)
            self._rank(key, e)
        elif e.freq < _FREQ_MAX:
            e.freq += 1

    def on_remove(self, key: str, evicted: bool = False) -> None:
        """See :meth:`EvictionPolicy.on_remove`. An evicted key enters the ghost; its
        resident descendants become orphans (nominated first)."""
        e = self._entries.pop(key, None)
        if e is None:
            self._pending.pop(key, None)
            return
        if e.queue == _MAIN:
            self._mq.remove(e.rank)
        del self._queue(e.queue)[key]
        if evicted and self._ghost_factor > 0:
            ghost = self._ghost
            h = hash(key)
            old = ghost.pop(h, None)
            if old is not None:
                self._forget(old[0])
            if e.from_main or e.queue == _MAIN:
                self._drops_main += 1
                self._ghosts_main += 1
                ghost[h] = (True, self._drops_main, e.born, e.uses, self._drops_small + self._drops_main)
            else:
                self._drops_small += 1
                self._ghosts_small += 1
                ghost[h] = (False, self._drops_small, e.born, e.uses, self._drops_small + self._drops_main)
            factor = self._ghost_factor
            if self._reach_full < self._head_reach:  # returns are admitted at a rate: a longer record
                factor = max(factor, self._late_ghost_factor)
            limit = factor * max(1, len(self._entries))
            while len(ghost) > limit:
                self._forget(ghost.popitem(last=False)[1][0])
        self._unlink(key, e)
        if e.kids and evicted and not (e.from_main or e.queue == _MAIN):
            # A probationary block's descendants are probationary too: unreachable now,
            # and unlikely to see their prefix written again soon. (A block that was in
            # main is a hot prefix, written again by the next request that needs it:
            # its descendants keep their places.)
            entries = self._entries
            for c in e.kids:
                ce = entries.get(c)
                if ce is not None:
                    self._orphan(c, ce)

    def on_prefix(self, keys: Sequence[str], matched: int) -> None:
        """A reader asked for the longest cached prefix of ``keys`` (one chain, head
        first) and found the first ``matched`` cached: record each key's parent and
        that the last one ends a query; the chain's blocks in main are used now, the
        deeper first out; while probation is out of reach the written misses skip it
        (to the front of the victims, the first ``head_keep`` to main while
        ``reach_full`` is at least ``head_reach``; misses not written yet are marked for
        their put). Hits themselves come through :meth:`on_hit`. O(len(keys) · log n)."""
        entries = self._entries
        pending = self._pending
        parent: str | None = None
        last = len(keys) - 1
        bypass = self._reach < self._reach_keep  # probation cannot hold its misses long enough
        heads = self._reach_full >= self._head_reach  # ... but main can hold a query's first misses
        for i, key in enumerate(keys):
            e = entries.get(key)
            if e is not None:
                if parent is not None:
                    # a parent past the match is a miss being written now: no orphan
                    self._link(key, e, parent, orphan_if_absent=i <= matched)
                    if i > matched and parent not in entries:
                        p = pending.get(parent)
                        if p is not None:
                            kids = p[2]
                            if kids is None:
                                kids = []
                                pending[parent] = (p[0], p[1], kids, p[3], p[4], p[5])
                            kids.append(key)
                if i == last and e.freq == 0 and e.queue != _MAIN:
                    self.counters["query_tails"] += 1
                    if e.queue == _SMALL:
                        e.from_main = False
                        self._move(key, e, _VICTIM)
            elif i >= matched:
                pending[key] = (parent, i == last, None, _SMALL if not bypass else _MAIN
                                if heads and i < matched + self._head_keep else _VICTIM, i, self._uses)
                pending.move_to_end(key)
            parent = key
        if bypass:
            for i in range(last - 1, matched - 1, -1):
                e = entries.get(keys[i])
                if e is not None and e.queue == _SMALL and e.freq == 0:
                    if heads and i < matched + self._head_keep:
                        self.counters["heads_kept"] += 1
                        self._move(keys[i], e, _MAIN)
                    else:
                        self.counters["bypassed"] += 1
                        e.from_main = False
                        self._move(keys[i], e, _VICTIM, front=True)
        main, mq, now = self._main, self._mq, self._uses
        for i in range(last, -1, -1):  # the chain's blocks in main: used now, the tail first out
            if keys[i] in main:
                e = entries[keys[i]]
                mq.remove(e.rank)
                e.last = now
                self._rank(keys[i], e, i)
        limit = max(64, len(entries))
        while len(pending) > limit:
            pending.popitem(last=False)

    def candidates(self, n: int) -> list[str]:
        """See :meth:`EvictionPolicy.candidates`: the order S3-FIFO's walk would evict
        ``n`` keys in, without walking (nothing changes): the victims, then the small
        queue's keys with no hit (oldest first), then main's lowest ranks, then
        the rest of small. Each queue is looked at for at most ``8n + 64`` keys (O(n));
        past that its keys come in queue order."""
        out = list(itertools.islice(self._victim, n))
        if len(out) >= n:
            return out
        entries = self._entries
        window = 8 * n + 64
        for queue in (self._small, None):
            if len(out) >= n:
                return out
            if queue is None:  # main, lowest rank first: every key's count is 0
                queue = [t[2] for t in itertools.islice(self._mq, window + n)]
            later: list[str] = []
            for key in itertools.islice(queue, window):
                if entries[key].freq == 0:
                    out.append(key)
                    if len(out) >= n:
                        return out
                else:
                    later.append(key)
            if len(queue) > window:
                out.extend(itertools.islice(queue, window, window + n - len(out)))
            out.extend(later[:n - len(out)])  # short of keys: those S3-FIFO would spare
        return out[:n]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def small_target(self) -> float:
        """The adaptive target size of the small queue (keys)."""
        return self._small_target
