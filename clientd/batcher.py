"""Group commit for master calls: coalesce concurrent callers into one batch call.

The master's cost per gRPC call (hundreds of microseconds in Python) dwarfs its
cost per key, so clientd gathers the items of every concurrent caller into one
batch call per kind (PutStart, PutEnd, GetReplicaList, …), the way
a database groups commits:

* an idle :class:`Coalescer` sends at once (on the next turn of the event loop,
  so callers that arrive in the same turn share the call) — a lone caller pays
  no added latency;
* while ``max_in_flight`` calls of its kind are outstanding, new items queue;
  when one returns, everything queued goes out in the next call (up to
  ``max_items`` per call);
* adaptive linger: the coalescer remembers how many items were waiting around
  the last call (the items it carried plus those that queued while it was in
  flight: the current concurrency). When fewer are queued, the next call waits
  a little (``linger_fraction`` of the last call's latency, at most
  ``max_linger_s``) for the callers it just answered to come back, and goes as
  soon as all are there. Without this, concurrent callers split into two
  cohorts that alternate, each paying the master's per-call cost — on a
  CPU-bound host one call of 16 items is much cheaper than two of 8. A lone
  caller never lingers.

Each :meth:`Coalescer.submit` carries a list of items and gets back the list of
their results, in order. A submission of at most ``max_items`` items is never
split across calls; a larger one (a local-API batch may hold up to clientd's
``max_batch_items``, 16,384 by default, while the master refuses calls over its
own, 2,048) goes out in consecutive calls of ``max_items`` items, one after the
other, so its positions still reach the master in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Awaitable, Callable, Generic, Sequence, TypeVar

__all__ = ["Coalescer"]

log = logging.getLogger(__name__)

I = TypeVar("I")
R = TypeVar("R")


class Coalescer(Generic[I, R]):
    """Coalesces concurrent :meth:`submit` calls into batched ``send`` calls.

    Args:
        name: the kind of call, for logs and stats (e.g. ``"PutStart"``).
        send: ``async send(items) -> results``, one result per item in order. An
            exception fails every submitter of that call.
        max_items: most items in one ``send``, counted by ``weight``. Without a
            ``weight``, a single larger submission is sent as consecutive calls of
            ``max_items`` items, each awaited before the next; with one (an item
            counting for several), an over-weight submission still goes out whole,
            alone (the caller splits it: prefix queries).
        max_in_flight: most concurrent ``send`` calls of this kind.
        linger_fraction: how long a call may wait for the rest of a cohort, as a
            fraction of the previous call's latency (0: never wait).
        max_linger_s: upper bound of that wait, in seconds.
        weight: how many items one item counts for against ``max_items`` (e.g. the
            keys of one prefix query; default 1 each), so that a call stays under
            the master's ``max_batch_items``.

    Thread-safety: event-loop confined (call from the loop's thread only).
    """

    def __init__(
        self,
        name: str,
        send: Callable[[list[I]], Awaitable[Sequence[R]]],
        *,
        max_items: int = 4096,
        max_in_flight: int = 1,
        linger_fraction: float = 0.0,
        max_linger_s: float = 0.0,
        weight: Callable[[I], int] | None = None,
    ) -> None:
        if max_items < 1 or max_in_flight < 1:
            raise ValueError("max_items and max_in_flight must be >= 1")
        self.name = name
        self._send = send
        self._max_items = max_items
        self._weight = weight
        self._max_in_flight = max_in_flight
        self._queue: deque[tuple[list[I], asyncio.Future[Sequence[R]]]] = deque()
        self._in_flight = 0
        self._scheduled = False
        self._linger_fraction = linger_fraction
        self._max_linger_s = max_linger_s
        self._linger: asyncio.TimerHandle | None = None
        self._queued_items = 0
        self._expected = 0
        self._urgent = False
        self._last_latency_s = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Calls sent so far.
        self.calls = 0
        #: Items sent so far (``items / calls`` is the mean batch size).
        self.items = 0

    @property
    def in_flight(self) -> int:
        """``send`` calls outstanding now."""
        return self._in_flight

    @property
    def queued(self) -> int:
        """Submissions waiting for the next call."""
        return len(self._queue)

    async def submit(self, items: list[I], *, urgent: bool = False) -> Sequence[R]:
        """Queue ``items`` for the next call of this kind and wait for their results.

        Args:
            items: the items, answered in order.
            urgent: never linger for these (e.g. large values, whose copies make
                callers come back at different times): the next call goes as soon
                as possible.

        Returns:
            One result per item, in order.

        Raises:
            Exception: whatever ``send`` raised for the call carrying these items
                (for a submission sent in several calls: the first call that
                failed; the later parts are not sent).
        """
        if not items:
            return []
        if self._weight is None and len(items) > self._max_items:
            # Over the master's limit in one call: consecutive calls, in order.
            out: list[R] = []
            step = self._max_items
            for i in range(0, len(items), step):
                out.extend(await self.submit(items[i:i + step], urgent=urgent))
            return out
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Sequence[R]] = loop.create_future()
        self._queue.append((items, fut))
        self._queued_items += len(items)
        if urgent:
            self._urgent = True
        if self._linger is not None and (urgent or self._queued_items >= self._expected):
            self._linger.cancel()  # the cohort is complete: go now
            self._linger = None
            loop.call_soon(self._launch)
        else:
            self._kick()
        return await fut

    def _kick(self) -> None:
        if self._scheduled or not self._queue or self._in_flight >= self._max_in_flight:
            return
        self._scheduled = True
        loop = asyncio.get_running_loop()
        if self._linger_fraction and not self._urgent and 1 < self._expected > self._queued_items:
            delay = min(self._last_latency_s * self._linger_fraction, self._max_linger_s)
            if delay > 0:
                self._linger = loop.call_later(delay, self._launch)
                return
        loop.call_soon(self._launch)

    def _launch(self) -> None:
        self._scheduled = False
        self._linger = None
        self._urgent = False
        while self._queue and self._in_flight < self._max_in_flight:
            entries: list[tuple[list[I], asyncio.Future[Sequence[R]]]] = []
            n = 0
            counted = 0  # n, or the items' weights
            weight = self._weight
            while self._queue:
                items, fut = self._queue[0]
                if fut.done():  # the submitter was cancelled before we sent
                    self._queue.popleft()
                    self._queued_items -= len(items)
                    continue
                size = len(items) if weight is None else sum(weight(i) for i in items)
                if entries and counted + size > self._max_items:
                    break
                self._queue.popleft()
                self._queued_items -= len(items)
                entries.append((items, fut))
                n += len(items)
                counted += size
            if not entries:
                return
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(entries, n))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, entries: list[tuple[list[I], asyncio.Future[Sequence[R]]]], n: int) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            if len(entries) == 1:
                flat = entries[0][0]
            else:
                flat = [item for items, _ in entries for item in items]
            self.calls += 1
            self.items += n
            try:
                results = await self._send(flat)
            except BaseException as exc:  # noqa: BLE001 - handed to every submitter
                for _, fut in entries:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                return
            if len(results) != n:
                err = RuntimeError(f"{self.name}: {len(results)} results for {n} items")
                for _, fut in entries:
                    if not fut.done():
                        fut.set_exception(err)
                return
            if len(entries) == 1:
                fut = entries[0][1]
                if not fut.done():
                    fut.set_result(results)
                return
            pos = 0
            for items, fut in entries:
                k = len(items)
                if not fut.done():
                    fut.set_result(results[pos:pos + k])
                pos += k
        finally:
            self._in_flight -= 1
            self._expected = n + self._queued_items
            self._last_latency_s = loop.time() - t0
            self._kick()

    async def drain(self) -> None:
        """Wait until nothing is queued or in flight (used at shutdown)."""
        while self._queue or self._in_flight or self._tasks:
            tasks = list(self._tasks)
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            else:
                await asyncio.sleep(0)
