"""Tiering in the master: access statistics, the move-task table and :class:`Tiering`.

Pure state, no I/O and no clock of its own (``now`` comes in), like
:mod:`cxlkv.master.state`, whose :class:`Tiering` part owns one pair of
:class:`AccessSketch` and one :class:`TaskTable` and makes every tiering
decision (docs/tiers.md):

* **demotion** (CXL → SSD) when a CXL segment passes its high watermark,
* **promotion** (SSD → CXL) of an SSD-only object read often,
* **DRAM caching** of an object read often by one host, into that host's DRAM tier.

Bytes are moved by clientds: a :class:`MoveTask` names the object version, its
source extent and the destination extent the master allocated; the clientd
copies, verifies and reports. Not thread-safe (master event-loop thread only).
"""

from __future__ import annotations

import itertools
from array import array
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np
import xxhash

from cxlkv.errors import CxlkvError, ErrorCode, InvalidArgument, NotFound, StaleToken
from cxlkv.master.objects import Extent, ObjectVersion, ObjState, short_key as _short
from cxlkv.master.segments import Segment, Tier, place_extents
from cxlkv.master.strategies import PlacementRequest
from cxlkv.v1 import master_pb2

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["AccessSketch", "MoveTask", "TaskTable", "Tiering", "DEMOTE", "PROMOTE", "CACHE", "COPY"]

DEMOTE = master_pb2.DEMOTE    # CXL → SSD; the CXL replica is dropped once the copy is verified
PROMOTE = master_pb2.PROMOTE  # SSD → CXL; the SSD replica stays
CACHE = master_pb2.CACHE      # → the executing clientd's DRAM tier
COPY = master_pb2.COPY        # CXL → SSD ahead of demotion; the CXL replica stays

_M64 = (1 << 64) - 1
_MAX_COUNT = 0xFFFFFFFF


class AccessSketch:
    """Approximate per-key read counts in fixed memory: a count-min sketch with decay.

    Count-min sketch (Cormode & Muthukrishnan, "An improved data stream summary:
    the count-min sketch and its applications", J. Algorithms 55(1), 2005):
    ``depth`` rows of ``width`` 32-bit counters; a key increments one counter per
    row and its estimate is the minimum of those counters — never below the true
    count, above it by at most ``e·N/width`` with probability ``1 - e^-depth``.
    The row indices come from one 128-bit xxh3 hash by double hashing
    (Kirsch & Mitzenmacher, "Less hashing, same performance", ESA 2006).
    Decay as in TinyLFU (Einziger, Friedman & Manes, ACM ToS 13(4), 2017):
    after ``reset_adds`` increments every counter is halved, so the estimate
    favours recent frequency.

    Memory: ``width × depth × 4`` bytes (1 MiB at the defaults 65536 × 4).
    pyprobables' CountMinSketch has no halving decay, hence this small class.

    Args:
        width: counters per row (>= 16).
        depth: rows (1..16).
        reset_adds: halve every counter after this many :meth:`add` calls
            (0: ``10 × width``).
    """

    __slots__ = ("width", "depth", "reset_adds", "_rows", "_adds", "resets")

    def __init__(self, width: int = 1 << 16, depth: int = 4, reset_adds: int = 0) -> None:
        self.width = int(width)
        self.depth = int(depth)
        self.reset_adds = int(reset_adds) or 10 * self.width
        self._rows = [array("I", bytes(4 * self.width)) for _ in range(self.depth)]
        self._adds = 0
        #: Number of halvings so far.
        self.resets = 0

    def _indices(self, key: str) -> Iterator[tuple[array, int]]:
        h = xxhash.xxh3_128_intdigest(key.encode("utf-8", "surrogatepass"))
        h1, h2 = h & _M64, (h >> 64) | 1
        w = self.width
        for i, row in enumerate(self._rows):
            yield row, (h1 + i * h2) % w

    def add(self, key: str) -> int:
        """Count one read of ``key``; returns its new estimate (reads, decayed)."""
        est = _MAX_COUNT
        for row, j in self._indices(key):
            v = row[j]
            if v < _MAX_COUNT:
                v += 1
                row[j] = v
            if v < est:
                est = v
        self._adds += 1
        if self._adds >= self.reset_adds:
            self._halve()
        return est

    def estimate(self, key: str) -> int:
        """Estimated (decayed) reads of ``key``: never below the true decayed count."""
        return min(row[j] for row, j in self._indices(key))

    def _halve(self) -> None:
        for row in self._rows:
            counters = np.frombuffer(row, dtype=np.uint32)  # a view: halved in place
            counters >>= 1
        self._adds = 0
        self.resets += 1

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the counters."""
        return 4 * self.width * self.depth


class MoveTask:
    """One copy of an object version's extent from one segment to another.

    Attributes:
        task_id: unique within a master run.
        kind: :data:`DEMOTE`, :data:`PROMOTE`, :data:`CACHE` or :data:`COPY`.
        obj: the committed version being moved (the master re-checks at completion
            that it is still the key's committed version).
        source: the extent read (one of ``obj.extents`` when the task was made).
        destination: the extent written; live (allocated) for the task's whole life.
        client_id: the only clientd that may run it ("" = any clientd mapping both
            segments; a CACHE task names the DRAM tier's owner).
        attempts: times given to a clientd.
        assigned_to: the clientd running it now ("" while queued).
        deadline: master clock (s) after which a given task is given again.
        created_at: master clock (s).
        fence: while given, the writer's hold on ``destination`` (a FAILED
            :class:`~cxlkv.master.objects.ObjectVersion` with its own token, granted in
            the region's index): a clientd that does not report in time may still be
            writing there, so the destination is never freed nor given to another
            writer before that clientd is known to have stopped (master/state.py).
    """

    __slots__ = ("task_id", "kind", "obj", "source", "destination", "client_id", "attempts",
                 "assigned_to", "deadline", "created_at", "fence")

    def __init__(self, task_id: int, kind: int, obj: ObjectVersion, source: Extent, destination: Extent,
                 client_id: str, now: float) -> None:
        self.task_id = task_id
        self.kind = kind
        self.obj = obj
        self.source = source
        self.destination = destination
        self.client_id = client_id
        self.attempts = 0
        self.assigned_to = ""
        self.deadline = 0.0
        self.created_at = now
        self.fence: ObjectVersion | None = None

    def __repr__(self) -> str:
        return (f"MoveTask({self.task_id}, kind={self.kind}, key={self.obj.key!r}, v{self.obj.version}, "
                f"{self.source} -> {self.destination}, attempts={self.attempts}, to={self.assigned_to!r})")


class TaskTable:
    """Queued and running move tasks, at most one per object version.

    Queued tasks wait in FIFO order, promotions and DRAM caching (a reader
    benefits as soon as they are done) ahead of demotions and copies;
    :meth:`give` hands a client the oldest ones it may run. A task given but not reported by its deadline goes back to the
    queue (:meth:`overdue`). The master frees a task's destination extent when it
    fails or when the object changed meanwhile.
    """

    def __init__(self) -> None:
        self._next_id = 1
        #: task id → task, queued or running.
        self.tasks: dict[int, MoveTask] = {}
        #: object version → its task (one move per version at a time).
        self.by_version: dict[int, MoveTask] = {}
        self._queue: deque[int] = deque()
        self._urgent: deque[int] = deque()  # PROMOTE and CACHE
        self._running: OrderedDict[int, None] = OrderedDict()  # given order == deadline order

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def queued(self) -> int:
        """Tasks waiting for a clientd."""
        return len(self.tasks) - len(self._running)

    @property
    def running(self) -> int:
        """Tasks given to a clientd and not yet reported."""
        return len(self._running)

    def add(self, kind: int, obj: ObjectVersion, source: Extent, destination: Extent, client_id: str,
            now: float) -> MoveTask:
        """Queue a new task (the caller allocated ``destination``)."""
        task = MoveTask(self._next_id, kind, obj, source, destination, client_id, now)
        self._next_id += 1
        self.tasks[task.task_id] = task
        self.by_version[obj.version] = task
        (self._urgent if kind in (PROMOTE, CACHE) else self._queue).append(task.task_id)
        return task

    def give(self, client_id: str, max_tasks: int, now: float, timeout_s: float,
             can_run: Callable[[MoveTask], bool]) -> list[MoveTask]:
        """Up to ``max_tasks`` queued tasks for ``client_id``, oldest first; each
        runs until ``now + timeout_s``. Tasks the client may not run stay queued
        in their order. O(tasks looked at)."""
        out: list[MoveTask] = []
        for queue in (self._urgent, self._queue):
            if len(out) < max_tasks:
                self._give_from(queue, client_id, max_tasks, now, timeout_s, can_run, out)
        return out

    def _give_from(self, queue: deque[int], client_id: str, max_tasks: int, now: float, timeout_s: float,
                   can_run: Callable[[MoveTask], bool], out: list[MoveTask]) -> None:
        kept: list[int] = []
        tasks = self.tasks
        while queue and len(out) < max_tasks:
            tid = queue.popleft()
            task = tasks.get(tid)
            if task is None or task.assigned_to:
                continue  # finished or dropped meanwhile
            if (task.client_id and task.client_id != client_id) or not can_run(task):
                kept.append(tid)
                if len(kept) > 4 * max_tasks + 64:
                    break  # do not scan a long queue of others' tasks on every poll
                continue
            task.assigned_to = client_id
            task.attempts += 1
            task.deadline = now + timeout_s
            self._running[tid] = None
            out.append(task)
        queue.extendleft(reversed(kept))

    def finish(self, task: MoveTask) -> None:
        """Forget ``task`` (completed, failed or dropped)."""
        self.tasks.pop(task.task_id, None)
        self._running.pop(task.task_id, None)
        if self.by_version.get(task.obj.version) is task:
            del self.by_version[task.obj.version]

    def requeue(self, task: MoveTask) -> None:
        """Give ``task`` again later (at the front: it is the oldest)."""
        self._running.pop(task.task_id, None)
        task.assigned_to = ""
        (self._urgent if task.kind in (PROMOTE, CACHE) else self._queue).appendleft(task.task_id)

    def running_tasks(self) -> list[MoveTask]:
        """The tasks given to a clientd and not yet reported."""
        return [self.tasks[tid] for tid in self._running]

    def overdue(self, now: float) -> list[MoveTask]:
        """Running tasks whose deadline passed (they stay running; the caller decides)."""
        out: list[MoveTask] = []
        for tid in self._running:
            task = self.tasks[tid]
            if task.deadline > now:
                break
            out.append(task)
        return out

    def all(self) -> list[MoveTask]:
        """Every task (a copy; for invariant checks and unmounts)."""
        return list(self.tasks.values())


#: Policy candidates a put looks at to free CXL space at once (objects with an SSD copy).
_ROOM_CANDIDATES = 64
_ABSENT = object()
_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)


class Tiering:
    """The master's tiering decisions: demotion, promotion, DRAM caching, move tasks.

    A part of :class:`~cxlkv.master.state.MasterState` (as dask's
    active_memory_manager sits beside its scheduler state): it owns the access
    sketches, the move-task table, the SSD-only LRU and the DRAM-tier tables, and
    reads and changes the state's object and segment tables directly, under the
    same rules (pure, ``now`` passed in, event-loop thread only). The state calls it at

    * segment changes: :meth:`tiers_changed`, :meth:`on_mount`, :meth:`drop_segment`,
      :meth:`on_unmount`, :meth:`lost_cxl`;
    * commits and retirements: :meth:`track`, :meth:`copy_ahead`, :meth:`untrack`;
    * reads: :meth:`on_hit` (only while :attr:`active`);
    * puts into a full CXL segment: :meth:`room_in_cxl`;
    * registration ends: :meth:`registration_ended`; sweeps: :meth:`sweep_tasks`;
    * the clientd move RPCs: :meth:`fetch_tasks`, :meth:`complete_tasks`.

    The :class:`~cxlkv.master.eviction.Evictor` calls :meth:`demote` (CXL objects
    go to SSD instead of being dropped) and reads :attr:`cold` and :attr:`moving_out`.
    """

    def __init__(self, state: "MasterState") -> None:
        self._st = state
        self.config = state.config
        self.counters = state.counters
        cfg = state.config
        #: Read-frequency estimates per key (promotion) and per (client, key) (DRAM caching).
        self.sketch = AccessSketch(cfg.access_sketch_width, cfg.access_sketch_depth, cfg.access_sketch_reset_adds)
        self.host_sketch = AccessSketch(cfg.access_sketch_width, cfg.access_sketch_depth,
                                        cfg.access_sketch_reset_adds)
        #: Queued and running move tasks.
        self.tasks = TaskTable()
        #: Committed, unpinned objects without a CXL replica (SSD-only), least recently
        #: used first: SSD eviction drops from the front. The eviction policy tracks
        #: the objects with a CXL replica.
        self.cold: OrderedDict[str, None] = OrderedDict()
        self.moving_out: dict[int, int] = {}  # CXL segment id → bytes of its extents being demoted
        self.dram_of: dict[str, Segment] = {}  # client id → its mounted DRAM tier
        self.dram_lru: dict[int, OrderedDict[str, ObjectVersion]] = {}  # DRAM segment id → cached objects
        #: An SSD segment is mounted.
        self.has_ssd = False
        #: A segment other than CXL is mounted: reads feed the sketches.
        self.active = False
        #: (task id, clientd) -> fence token of a move destination held for a clientd
        #: that did not report in time (freed when it reports, or with its registration).
        self._fenced_moves: dict[tuple[int, str], int] = {}
        #: Why the last move task failed ("" if none failed), for Stat and logs.
        self.last_move_failure = ""
        #: The last time a tier was marked full (NO_SPACE from a move), one line ("" if never).
        self.last_tier_refusal = ""
        #: Times a tier was paused for a full filesystem (one per backoff period).
        self.tier_pauses = 0

    # ------------------------------------------------------------ segments
    def tiers_changed(self) -> None:
        """A segment was mounted or unmounted."""
        mounted = self._st.segment_table.mounted
        self.has_ssd = any(s.tier == Tier.SSD for s in mounted)
        self.active = any(s.tier != Tier.CXL for s in mounted)

    def check_mount(self, client_id: str) -> None:
        """Raises InvalidArgument when ``client_id`` already has a DRAM tier."""
        if client_id in self.dram_of:
            raise InvalidArgument(f"client {client_id} already has a DRAM tier "
                                  f"({self.dram_of[client_id].name!r})")

    def on_mount(self, seg: Segment, client_id: str) -> None:
        """``seg`` was mounted by ``client_id`` (a DRAM tier is that host's cache)."""
        if seg.tier == Tier.DRAM:
            self.dram_of[client_id] = seg
            self.dram_lru[seg.segment_id] = OrderedDict()
        self.tiers_changed()

    def drop_segment(self, seg: Segment) -> None:
        """``seg`` is being unmounted: the moves from or into it end."""
        sid = seg.segment_id
        for task in self.tasks.all():
            if task.source[0] == sid or task.destination[0] == sid:
                self.end_task(task, None, f"segment {seg.name!r} was unmounted")

    def on_unmount(self, seg: Segment) -> None:
        """``seg`` is unmounted (its replicas gone)."""
        sid = seg.segment_id
        self.dram_lru.pop(sid, None)
        if self.dram_of.get(seg.owner_client_id) is seg:
            del self.dram_of[seg.owner_client_id]
        self.moving_out.pop(sid, None)
        self.tiers_changed()

    def lost_cxl(self, obj: ObjectVersion) -> None:
        """A committed, unpinned ``obj`` lost its last CXL replica (an unmount)."""
        self._st.policy.on_remove(obj.key, False)
        self.cold[obj.key] = None

    # ------------------------------------------------------ commits and reads
    def untrack(self, obj: ObjectVersion, evicted: bool) -> None:
        """A committed, unpinned ``obj`` is retired: out of the SSD-only LRU or the policy."""
        if self.cold.pop(obj.key, _ABSENT) is _ABSENT:
            self._st.policy.on_remove(obj.key, evicted)

    def on_hit(self, client_id: str, obj: ObjectVersion, now: float, read: bool = True) -> None:
        """A read of committed ``obj`` (while :attr:`active`): the policy or the SSD-only
        LRU hears of it and, for a ``read`` that copies, the access statistics."""
        if not obj.hard_pin:
            cold = self.cold
            key = obj.key
            if key in cold:
                cold.move_to_end(key)
            else:
                self._st.policy.on_hit(key)
        if read:
            self._on_read(client_id, obj, now)

    def registration_ended(self, client_id: str, now: float) -> None:
        """The moves ``client_id`` was running: their destinations held with its registration."""
        if self.tasks:
            for task in [t for t in self.tasks.running_tasks() if t.assigned_to == client_id]:
                self.fence_destination(task, now, f"client {client_id}'s registration ended "
                                                  "while it ran the move")

    # ---------------------------------------------------------------- tiers
    def has_cxl(self, obj: ObjectVersion) -> bool:
        st = self._st
        by_id = st.segment_table.by_id
        return any(by_id[e[0]].tier == Tier.CXL for e in obj.extents)

    def track(self, obj: ObjectVersion) -> None:
        """Hand a committed, unpinned version to the eviction policy (it has a CXL
        replica) or to the SSD-only LRU (it has none)."""
        st = self._st
        if not self.active or self.has_cxl(obj):
            st.policy.on_put(obj.key)
        else:
            self.cold[obj.key] = None
            self.cold.move_to_end(obj.key)

    def has_tier(self, obj: ObjectVersion, tier: int) -> bool:
        st = self._st
        by_id = st.segment_table.by_id
        return any(by_id[e[0]].tier == tier for e in obj.extents)

    def room_in_cxl(self, seg: Segment, need: int, now: float) -> None:
        """Free ``need`` bytes in a full CXL segment: the least recently used
        objects (a bounded look) are demoted — at once for those that already
        have an SSD copy (:meth:`_copy_ahead`), through a DEMOTE task for others
        (the put then lands on SSD if nothing was freed at once)."""
        st = self._st
        alloc = seg.allocator
        if alloc.can_alloc(need):
            return
        sid = seg.segment_id
        objects = st._objects
        by_version = self.tasks.by_version
        for key in st.policy.candidates(_ROOM_CANDIDATES):  # O(1) per put: a bounded look
            obj = objects.get(key)
            if (obj is None or obj.leases or obj.hard_pin or obj.soft_pin_until > now
                    or obj.version in by_version or not any(e[0] == sid for e in obj.extents)):
                continue
            # with an SSD copy: its CXL space is free now; without: a DEMOTE task frees it soon
            if not self.demote(obj, now):
                break  # the SSD tier is full
            if alloc.can_alloc(need):
                return

    def copy_ahead(self, obj: ObjectVersion, now: float) -> None:
        """Queue a COPY of a new CXL object to the SSD tier once its CXL segment is
        past ``copy_ahead_watermark``: when it is later demoted, its CXL space is
        freed at once (no copy on the eviction path, so CXL can run full). Skipped
        when the SSD tier has no room without evicting."""
        st = self._st
        by_id = st.segment_table.by_id
        src = obj.extents[0]
        seg = by_id[src[0]]
        if seg.tier != Tier.CXL or seg.used_bytes < self.config.copy_ahead_watermark * seg.capacity_bytes:
            return
        if obj.version in self.tasks.by_version or self.has_tier(obj, Tier.SSD):
            return
        dst = self._alloc_in(obj, Tier.SSD, now)
        if dst is not None:
            self.tasks.add(COPY, obj, src, dst, "", now)
            self.counters["ssd_copies_started"] += 1

    def _detach(self, obj: ObjectVersion, extents: list) -> None:
        """Take replicas out of ``obj.extents``: freed now, or when the last lease ends."""
        st = self._st
        obj.extents = [e for e in obj.extents if e not in extents]
        if obj.state == ObjState.COMPLETE and st._objects.get(obj.key) is obj:
            st.index.publish(obj)  # readers leave the detached replicas before they are freed
            if obj.hard_pin:
                st._count_pinned(extents, -1)
        if obj.leases:
            obj.detached.extend(extents)
        else:
            segments = st.segment_table.by_id
            for sid, off, _ in extents:
                seg = segments[sid]
                if seg.mounted:
                    seg.allocator.free(off)
                    seg.object_count -= 1

    def _alloc_in(self, obj: ObjectVersion, tier: int, now: float, *, evict_cold: bool = False) -> Extent | None:
        """An extent for another replica of ``obj`` in ``tier`` (a segment without
        one of its replicas), or ``None``. With ``evict_cold``, SSD-only objects are
        dropped (least recently used first) until it fits."""
        st = self._st
        need = obj.extents[0][2] if obj.extents else st.extent_bytes(obj.size_bytes + obj.header_bytes)
        have = {e[0] for e in obj.extents}
        pool = [s for s in st.segment_table.mounted
                if s.tier == tier and s.segment_id not in have and s.capacity_bytes >= need
                and s.refused_until <= now]
        if not pool:
            return None
        request = _new_tuple(PlacementRequest, (need, 1, "", tier))
        cands = st.strategy.select(pool, request)
        ext = place_extents(cands, need, 1)
        if not ext and evict_cold and self.cold:
            ids = frozenset(s.segment_id for s in cands)
            st.evictor.evict(now, lambda: any(s.allocator.can_alloc(need) for s in cands), ids, None,
                        cold=True)
            ext = place_extents(cands, need, 1)
        return ext[0] if ext else None

    def demote(self, obj: ObjectVersion, now: float) -> bool:
        """Move ``obj``'s CXL replicas to the SSD tier instead of dropping it.

        An object that already has an SSD replica (promoted earlier) just loses
        its CXL replicas. Otherwise an SSD extent is allocated (dropping SSD-only
        objects if the tier is full) and a DEMOTE task queued; the CXL replica
        stays readable until a clientd has copied and verified the bytes.

        Returns:
            False when the SSD tier has no room even after eviction (the caller drops it).
        """
        st = self._st
        by_id = st.segment_table.by_id
        cxl = [e for e in obj.extents if by_id[e[0]].tier == Tier.CXL]
        if not cxl:
            return False
        if any(by_id[e[0]].tier == Tier.SSD for e in obj.extents):
            st.policy.on_remove(obj.key, True)
            self._detach(obj, cxl)
            self.cold[obj.key] = None
            self.counters["demotions"] += 1
            self.counters["demotions_no_copy"] += 1  # no task: demotions_started not counted
            return True
        dst = self._alloc_in(obj, Tier.SSD, now, evict_cold=True)
        if dst is None:
            return False
        src = cxl[0]
        self.tasks.add(DEMOTE, obj, src, dst, "", now)
        self.moving_out[src[0]] = self.moving_out.get(src[0], 0) + src[2]
        self.counters["demotions_started"] += 1
        return True

    def _on_read(self, client_id: str, obj: ObjectVersion, now: float) -> None:
        """Feed the access statistics; start a promotion or a DRAM caching when warranted.

        Never delays the read: the bytes are served from where they are now.
        """
        st = self._st
        cfg = self.config
        key = obj.key
        if obj.version in self.tasks.by_version or obj.state != ObjState.COMPLETE:
            return
        by_id = st.segment_table.by_id
        tiers = [by_id[e[0]].tier for e in obj.extents]
        if cfg.promotion_threshold and Tier.CXL not in tiers:
            if self.sketch.add(key) >= cfg.promotion_threshold:
                self._promote(obj, now)
            return
        dram = self.dram_of.get(client_id)
        if dram is None or not cfg.dram_promotion_threshold:
            return
        sid = dram.segment_id
        if any(e[0] == sid for e in obj.extents):
            lru = self.dram_lru.get(sid)
            if lru is not None and key in lru:
                lru.move_to_end(key)
            return
        if self.host_sketch.add(client_id + "\0" + key) >= cfg.dram_promotion_threshold:
            self._cache(obj, dram, client_id, now)

    def _promote(self, obj: ObjectVersion, now: float) -> bool:
        st = self._st
        dst = self._alloc_in(obj, Tier.CXL, now)
        if dst is None:
            need = obj.extents[0][2]
            for seg in st.segment_table.mounted:
                if seg.tier == Tier.CXL and seg.capacity_bytes >= need:
                    self.room_in_cxl(seg, need, now)
                    break
            dst = self._alloc_in(obj, Tier.CXL, now)
        if dst is None:
            self.counters["promotions_skipped"] += 1
            return False
        by_id = st.segment_table.by_id
        src = next(e for e in obj.extents if by_id[e[0]].tier != Tier.DRAM) if any(
            by_id[e[0]].tier != Tier.DRAM for e in obj.extents) else obj.extents[0]
        self.tasks.add(PROMOTE, obj, src, dst, "", now)
        self.counters["promotions_started"] += 1
        return True

    def _cache(self, obj: ObjectVersion, dram: Segment, client_id: str, now: float) -> bool:
        """Copy ``obj`` into ``client_id``'s DRAM tier (least recently read cached
        objects there are dropped to make room, never leased ones)."""
        st = self._st
        need = obj.extents[0][2]
        if need > dram.capacity_bytes // 4:
            return False  # a DRAM tier keeps many small hot objects, not a few large ones
        lru = self.dram_lru.setdefault(dram.segment_id, OrderedDict())
        alloc = dram.allocator
        if not alloc.can_alloc(need):
            for key, victim in list(itertools.islice(lru.items(), 64)):
                if alloc.can_alloc(need):
                    break
                del lru[key]
                self._detach(victim, [e for e in victim.extents if e[0] == dram.segment_id])
                self.counters["dram_uncached"] += 1
        off = alloc.alloc(need)
        if off < 0:
            return False
        dram.object_count += 1
        by_id = st.segment_table.by_id
        src = min(obj.extents, key=lambda e: 0 if by_id[e[0]].tier == Tier.CXL else 1)
        self.tasks.add(CACHE, obj, src, (dram.segment_id, off, need), client_id, now)
        self.counters["dram_caches_started"] += 1
        return True

    def fetch_tasks(self, client_id: str, epoch: int, max_tasks: int, now: float) -> list[MoveTask]:
        """Give ``client_id`` up to ``max_tasks`` queued move tasks it can run (it
        maps both segments; CACHE tasks only to the DRAM tier's owner).

        Raises:
            UnknownClient, StaleToken: the caller's registration is not current.
        """
        st = self._st
        client = st.writer(client_id, epoch, now)
        if not self.tasks:
            return []
        by_id = st.segment_table.by_id
        mapped = client.mapped

        def can_run(task: MoveTask) -> bool:
            return by_id[task.source[0]].name in mapped and by_id[task.destination[0]].name in mapped

        given = self.tasks.give(client_id, max_tasks or 64, now, self.config.task_timeout_s, can_run)
        out: list[MoveTask] = []
        for task in given:
            # The writer's hold on the destination, recorded in the region (a grant
            # slot) before it learns of it: a master taking over keeps it too.
            token = st._seq
            st._seq = token + 1
            n = task.destination[2]
            fence = ObjectVersion("", n, token, [task.destination], client_id, client.epoch, now)
            fence.state = ObjState.FAILED
            if not st.index.grant(fence):
                self.tasks.requeue(task)  # no slot to record it in: not given
                continue
            task.fence = fence
            out.append(task)
        return out

    def _unfence(self, task: MoveTask) -> None:
        """The writer of ``task`` reported: it no longer writes the destination."""
        st = self._st
        if task.fence is not None:
            st.index.ungrant(task.fence)
            task.fence = None

    def _fence_held(self, task: MoveTask, now: float = 0.0) -> None:
        """Hand ``task``'s destination to its writer's fence: ``_fenced`` while the
        writer's registration lives (freed when it reports the task, quarantined
        when the registration ends), else quarantined at once."""
        st = self._st
        fence = task.fence
        task.fence = None
        if fence is None:
            return
        client = st._clients.get(fence.client_id)
        if client is not None and client.alive and client.epoch == fence.epoch:
            st._fenced[fence.version] = fence
            self._fenced_moves[(task.task_id, fence.client_id)] = fence.version
            if len(self._fenced_moves) > 4 * len(st._fenced) + 1024:  # forget released ones
                self._fenced_moves = {k: t for k, t in self._fenced_moves.items() if t in st._fenced}
        else:
            st.quarantine.hold(fence, now)
        self.counters["moves_fenced"] += 1

    def fence_destination(self, task: MoveTask, now: float, why: str) -> None:
        """``task``'s writer did not report (or its registration ended): hold the
        destination for it (:meth:`_fence_held`) and give the task again with a new
        destination, or fail it."""
        st = self._st
        if task.fence is None:  # not given: nothing to hold
            self._retry_or_fail(task, why)
            return
        self._fence_held(task, now)
        seg = st.segment_table.by_id[task.destination[0]]
        off = -1
        if task.attempts < self.config.task_retries and seg.mounted:
            off = seg.allocator.alloc(task.destination[2])
        if off >= 0:
            seg.object_count += 1
            task.destination = (seg.segment_id, off, task.destination[2])
            self.tasks.requeue(task)
            self.counters["moves_retried"] += 1
        else:
            self.end_task(task, None, why, destination_held=True)

    def complete_tasks(self, client_id: str, epoch: int, results: Iterable[tuple[int, int, str]],
                       now: float) -> list[CxlkvError | None]:
        """Apply clientd reports ``(task_id, code, message)``; one result per item.

        A success adds the destination replica to the object, if the version is
        still the key's committed one (else the destination is freed), and for a
        demotion drops the CXL replica (freed when its last lease ends). A failure
        is given again until ``task_retries`` attempts, then counted and its
        destination freed — unless the object was removed, replaced or moved
        meanwhile (the likely cause: its source was rewritten): then the move is
        dropped (``moves_dropped``, not ``moves_failed``) and that item answers
        ``NotFound``.

        Raises:
            UnknownClient, StaleToken: the caller's registration is not current.
        """
        st = self._st
        st.writer(client_id, epoch, now)
        out: list[CxlkvError | None] = []
        for task_id, code, message in results:
            task = self.tasks.tasks.get(task_id)
            if task is None or task.assigned_to != client_id:
                held = self._fenced_moves.pop((task_id, client_id), None)
                if held is not None and held in st._fenced:  # a late writer is done: free its destination
                    st._free_extents(st._fenced.pop(held))
                    self.counters["moves_fence_released"] += 1
                out.append(StaleToken(f"task {task_id} is not running on client {client_id} "
                                      "(timed out and given again, or finished)"))
                continue
            self._unfence(task)
            if code == ErrorCode.NO_SPACE:
                self._refused(task, now, f"client {client_id}: {message}")
            elif code and not self._move_current(task):
                # the copy failed because its source changed under it (removed, replaced,
                # moved): nothing to retry, nothing failed — the move is dropped
                self.end_task(task, now, "")
                out.append(NotFound(f"key {_short(task.obj.key)} was removed or replaced during the move: "
                                    "move dropped", key=task.obj.key))
                continue
            elif code:
                self._retry_or_fail(task, f"client {client_id}: {message}")
            else:
                st.segment_table.by_id[task.destination[0]].refusals = 0
                self.end_task(task, now, "")
            out.append(None)
        return out

    def _refused(self, task: MoveTask, now: float, why: str) -> None:
        """A clientd could not write ``task``'s destination: its tier's filesystem is
        full. The task fails at once (retrying into a full tier only repeats the
        failure; the object stays where it was) and the destination segment takes
        nothing new (puts, demotions, copies) for ``full_tier_backoff_s``, doubled
        with each refusal in a row up to ``full_tier_backoff_max_s``; then it is
        tried again, and a successful write resets the backoff. Moves still queued
        into the tier fail with it (their destinations freed)."""
        st = self._st
        seg = st.segment_table.by_id[task.destination[0]]
        cfg = self.config
        if seg.refused_until <= now:  # tasks given before the mark do not lengthen it
            backoff = min(cfg.full_tier_backoff_max_s, cfg.full_tier_backoff_s * (2 ** min(seg.refusals, 30)))
            seg.refused_until = now + backoff
            seg.refusals += 1
            self.tier_pauses += 1
            self.last_tier_refusal = (f"segment {seg.name} ({Tier(seg.tier).name.lower()}) refused a write, "
                                      f"no new objects there for {backoff:g} s: {why}")
            # moves still queued into the tier would only meet the same full filesystem
            sid = seg.segment_id
            for queued in self.tasks.all():
                if queued is not task and not queued.assigned_to and queued.destination[0] == sid:
                    self.end_task(queued, None, f"segment {seg.name} paused: its filesystem is full")
        self.counters["tier_write_refusals"] += 1
        self.end_task(task, None, why)

    def _move_current(self, task: MoveTask) -> bool:
        """Whether ``task``'s object is still the key's committed version with its source extent."""
        st = self._st
        obj = task.obj
        return st._objects.get(obj.key) is obj and task.source in obj.extents

    def _retry_or_fail(self, task: MoveTask, why: str) -> None:
        if task.attempts < self.config.task_retries:
            self.tasks.requeue(task)
            self.counters["moves_retried"] += 1
        else:
            self.end_task(task, None, why)

    def end_task(self, task: MoveTask, now: float | None, why: str, *, destination_held: bool = False) -> None:
        """Finish ``task``: committed (``now`` given, no ``why``) or failed. With
        ``destination_held`` the destination belongs to a fence (not freed here)."""
        st = self._st
        if task.fence is not None:  # a given move ended otherwise (a segment unmounted): held for its writer
            self._fence_held(task)
            destination_held = True
        self.tasks.finish(task)
        obj = task.obj
        by_id = st.segment_table.by_id
        if task.kind == DEMOTE and task.source[0] in self.moving_out:
            sid = task.source[0]
            self.moving_out[sid] = max(0, self.moving_out[sid] - task.source[2])
        dst_seg = by_id[task.destination[0]]
        current = (not why and st._objects.get(obj.key) is obj and dst_seg.mounted
                   and task.source in obj.extents)
        if not current:
            if dst_seg.mounted and not destination_held:
                dst_seg.allocator.free(task.destination[1])
                dst_seg.object_count -= 1
            if why:
                self.counters["moves_failed"] += 1
                self.last_move_failure = why
            else:
                self.counters["moves_dropped"] += 1  # removed, replaced or moved meanwhile
            return
        obj.extents.append(task.destination)
        if obj.hard_pin:
            st._count_pinned((task.destination,), 1)
        if task.kind == PROMOTE:
            st.index.publish(obj)  # readable from the CXL tier now
        if task.kind == DEMOTE:
            cxl = [e for e in obj.extents if by_id[e[0]].tier == Tier.CXL]
            self._detach(obj, cxl)
            if not obj.hard_pin:
                st.policy.on_remove(obj.key, True)
                self.cold[obj.key] = None
            self.counters["demotions"] += 1
        elif task.kind == COPY:
            self.counters["ssd_copies"] += 1
        elif task.kind == PROMOTE:
            if not obj.hard_pin and self.cold.pop(obj.key, _ABSENT) is not _ABSENT:
                st.policy.on_put(obj.key)
            self.counters["promotions"] += 1
            seg = by_id[task.destination[0]]
            if seg.used_bytes > self.config.high_watermark * seg.capacity_bytes:
                st.evictor.draining.add(seg.segment_id)
        else:
            self.dram_lru.setdefault(dst_seg.segment_id, OrderedDict())[obj.key] = obj
            self.counters["dram_caches"] += 1

    def sweep_tasks(self, now: float) -> None:
        """Give again (or fail) tasks whose clientd did not report in time."""
        for task in self.tasks.overdue(now):
            self.fence_destination(task, now, f"no report within task_timeout_s "
                                               f"({self.config.task_timeout_s:g} s) from client {task.assigned_to}")
