"""Tiering records of the master: access statistics and the move-task table.

Pure state, no I/O and no clock of its own (``now`` comes in), like
:mod:`cxlkv.master.state`, which owns one :class:`AccessSketch` and one
:class:`TaskTable` and makes every tiering decision (docs/tiers.md):

* **demotion** (CXL → SSD) when a CXL segment passes its high watermark,
* **promotion** (SSD → CXL) of an SSD-only object read often,
* **DRAM caching** of an object read often by one host, into that host's DRAM tier.

Bytes are moved by clientds: a :class:`MoveTask` names the object version, its
source extent and the destination extent the master allocated; the clientd
copies, verifies and reports. Not thread-safe (master event-loop thread only).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from typing import Callable, Iterator

import numpy as np
import xxhash

from cxlkv.master.objects import Extent, ObjectVersion
from cxlkv.v1 import master_pb2

__all__ = ["AccessSketch", "MoveTask", "TaskTable", "DEMOTE", "PROMOTE", "CACHE", "COPY"]

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
