"""Direct commit: puts this process commits to the master itself (docs/sdk.md "Direct commit").

A direct-mode process already copies values into the region and writes their
object headers itself. With direct commit it also names them: the daemon hands
it extents the master reserved for the daemon's registration (``DirectReserve``,
a stack per object size, asked for ahead of need), and the process commits them
with one lean ``Commit`` call to the master — a put, or a batch of puts, costs
one round trip between this process and the master, and none through the daemon
(two processes woken instead of four).

Fencing is the daemon's, unchanged: the reservations are the daemon's
registration's, recorded as this process's pending direct puts (pid watched), so
a writer that stalls however long writes only into space nobody else was given
(docs/master.md, "Reservations and fencing"). A commit under a registration that
ended answers STALE_TOKEN or UNKNOWN_CLIENT: nothing was committed, every held
reservation is reported done, and the put goes through the daemon.

The process tells the daemon which reservations it used (``committed_put_tokens``
with their keys; the daemon checks each against the index) and which it will not
use (``done_put_tokens``), on its next ``DirectReserve`` and at close.

A commit whose answer is lost (the master's connection broke after the request
was sent) is asked again once on a new connection; still unanswered, or answered
STALE_TOKEN, the index decides: the key committed at this reservation's version
is this put's success, anything else sends the put through the daemon. (Only a
master that takes the lost request in after both tries can make that put answer
ALREADY_EXISTS; the value is then the one this process wrote.)

Not for: values whose object is larger than :data:`MAX_OBJECT_BYTES`, upserts,
replicas, a preferred segment, keys repeated in one call — those answer
:data:`~cxlkv.client._direct.FALLBACK` and take the daemon's paths.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from cxlkv.client.framing import service_methods
from cxlkv.errors import CxlkvError, DaemonUnreachable, ErrorCode, Unavailable, error_for
from cxlkv.layout.objheader import header_bytes_for
from cxlkv.v1 import client_pb2, master_pb2

__all__ = ["DirectCommits", "MAX_OBJECT_BYTES", "MAX_VALUE_BYTES"]

log = logging.getLogger(__name__)

#: Largest object (header + value, bytes) committed directly: the daemon's
#: reservations end there (clientd/reserve.py ``MAX_RESERVED_BYTES``).
MAX_OBJECT_BYTES = (1 << 20) + 64 + 4096
#: Largest value committed directly with any key.
MAX_VALUE_BYTES = 1 << 20
#: Reservations asked for beyond what a call needs, per size: none the first time
#: a size is asked for, then 2, doubling at every later ask up to the larger of
#: this and the call's need (a lone caller's puts then ask the daemon once per 16,
#: a batch's every other batch), and to :data:`AHEAD_BYTES` of the size — as the
#: daemon's own pool grows its stacks (clientd/reserve.py), so odd sizes hold little.
AHEAD = 16
#: Most bytes held ahead per object size.
AHEAD_BYTES = 4 << 20
#: Most reservations held per object size (the daemon's per-writer bound is 1,024).
MAX_HELD_PER_SIZE = 256
#: Most object sizes held at once (least recently asked for are reported done).
MAX_SIZES = 4
#: Most items in one Commit (the master refuses calls over its max_batch_items, 2,048).
MAX_COMMIT_ITEMS = 512
#: After the daemon declines (or the master cannot be reached), ask again after this long, seconds.
RETRY_OFF_S = 5.0

_COMMIT = next(m for m in service_methods(master_pb2.DESCRIPTOR.services_by_name["MasterService"])
               if m.name == "Commit")
_STALE_TOKEN = int(ErrorCode.STALE_TOKEN)
_UNKNOWN_CLIENT = int(ErrorCode.UNKNOWN_CLIENT)


class DirectCommits:
    """This process's reservations and its commits to the master.

    Args:
        call: ``call(method_name, request) -> response`` on the daemon.
        write: ``write(entries) -> [CxlkvError | None]``, ``entries`` a list of
            ``(item, version, header_bytes, (segment_id, offset_bytes, length_bytes))``:
            copy each value into its extent and write its header, one answer per
            entry (:meth:`DirectPath.write_reserved`).
        probe: ``probe(key_utf8) -> version or 0`` in the region's index, or ``None``
            (no index here: a lost answer sends the put through the daemon).
        timeout_s: longest wait for the master's answer, seconds.

    Thread-safety: safe to share; each concurrent commit uses its own connection.
    """

    def __init__(self, call: Callable[[str, Any], Any], write: Callable[..., CxlkvError | None],
                 probe: Callable[[bytes], int] | None, timeout_s: float) -> None:
        self._call = call
        self._write = write
        self._probe = probe
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pid = os.getpid()
        #: object size → held reservations ``(put_token, DirectExtent)``, least recently used size first.
        self._stacks: dict[int, list[tuple[int, Any]]] = {}
        #: object size → how many it asked for ahead of need last time (:data:`AHEAD`).
        self._ahead: dict[int, int] = {}
        self._route: tuple[str, str, int] | None = None  # (master host:port, client_id, epoch)
        self._conns: list[Any] = []  # idle master connections of the current route
        self._done: list[int] = []
        self._committed: list[tuple[int, str]] = []
        self._off_until = 0.0
        #: Why direct commit is off now ("" while on), for logs and tests.
        self.why_not = ""
        #: Puts committed directly, and those handed to the daemon's paths, since start.
        self.committed = 0
        self.fallbacks = 0

    # ------------------------------------------------------------------ state
    @property
    def available(self) -> bool:
        """Whether a put should try direct commit now (not declined in the last :data:`RETRY_OFF_S`)."""
        return time.monotonic() >= self._off_until

    def _off(self, why: str) -> None:
        self.why_not = why
        self._off_until = time.monotonic() + RETRY_OFF_S
        log.debug("direct commit off for %g s: %s", RETRY_OFF_S, why)

    def _retire_route(self) -> None:
        """The registration of the held reservations ended: all are done (lock held)."""
        for stack in self._stacks.values():
            self._done.extend(t for t, _ in stack)
        self._stacks.clear()
        for c in self._conns:
            c.close()
        self._conns.clear()
        self._route = None

    def _take(self, needs: list[int]) -> tuple[list[tuple[int, Any] | None], dict[int, int]]:
        """Reservations for ``needs`` from the stacks, and how many are missing per size (lock held)."""
        got: list[tuple[int, Any] | None] = []
        missing: dict[int, int] = {}
        for need in needs:
            stack = self._stacks.get(need)
            if stack:
                got.append(stack.pop(0))  # oldest first: a key's later puts get growing versions
            else:
                got.append(None)
                missing[need] = missing.get(need, 0) + 1
        return got, missing

    def _reserve(self, missing: dict[int, int]) -> None:
        """One DirectReserve for the missing sizes (and the reports of what was used)."""
        with self._lock:
            done, self._done = self._done, []
            committed, self._committed = self._committed, []
            for need in missing:  # most recently used last; the oldest sizes beyond MAX_SIZES are done
                self._stacks.setdefault(need, [])
                self._stacks[need] = self._stacks.pop(need)
            while len(self._stacks) > MAX_SIZES:
                old = next(iter(self._stacks))
                self._done.extend(t for t, _ in self._stacks.pop(old))
            counts = []
            for need, n in missing.items():
                extra = self._ahead.get(need)
                extra = 0 if extra is None else min(max(2, 2 * extra), max(AHEAD, n), AHEAD_BYTES // need)
                self._ahead[need] = extra
                counts.append(min(MAX_HELD_PER_SIZE, n + extra))
            while len(self._ahead) > 4 * MAX_SIZES:
                del self._ahead[next(iter(self._ahead))]
        req = client_pb2.DirectReserveRequest(
            pid=os.getpid(), need_bytes=list(missing), counts=counts, done_put_tokens=done,
            committed_put_tokens=[t for t, _ in committed], committed_keys=[k for _, k in committed],
            packed_extents=True)
        try:
            resp = self._call_daemon(req)
        except CxlkvError as exc:
            with self._lock:  # reported again next time (the daemon reaps them when we exit)
                self._done.extend(done)
                self._committed.extend(committed)
            self._off(f"DirectReserve failed: {exc.message}")
            return
        with self._lock:
            if not resp.offered:
                self._retire_route()
                self._off(resp.why_not or "the daemon does not offer direct commit")
                return
            route = (resp.master_address, resp.client_id, int(resp.epoch))
            if route != self._route:
                self._retire_route()
                self._route = route
            tokens = resp.put_tokens
            if resp.segment_ids:  # packed_extents
                exts = list(zip(resp.segment_ids, resp.offsets_bytes, resp.lengths_bytes))
            else:  # a daemon that answers DirectExtent messages: every one is in a region we map
                exts = [(e.extent.segment_id, e.extent.offset_bytes, e.extent.length_bytes) if e.direct else None
                        for e in resp.extents]
            if len(exts) != len(tokens):
                exts = [None] * len(tokens)
            pos = 0
            for need, n in zip(missing, resp.granted):
                stack = self._stacks.setdefault(need, [])
                for j in range(pos, pos + n):
                    if exts[j] is None:
                        self._done.append(int(tokens[j]))
                    else:
                        stack.append((int(tokens[j]), exts[j]))
                pos += n
            self.why_not = ""

    def _call_daemon(self, req: Any) -> Any:
        """DirectReserve, once more on a new connection when the daemon's went away
        (a restarted daemon: the one answering now knows this writer from its
        predecessor's record)."""
        try:
            return self._call("DirectReserve", req)
        except DaemonUnreachable:
            return self._call("DirectReserve", req)

    # ------------------------------------------------------------------ puts
    def put(self, items: list[Any], fallback: Any) -> dict[int, Any]:
        """Commit ``items`` (``_PutItem``: position, key, 1-D uint8 array, size, options) directly.

        Returns:
            Position → version (``int``), a :class:`CxlkvError` (the master's answer
            for that key, e.g. ALREADY_EXISTS; or the copy's failure), or
            ``fallback``: not committed, put it through the daemon.
        """
        out: dict[int, Any] = {}
        todo: list[Any] = []
        needs: list[int] = []
        seen: dict[str, int] = {}
        if len(items) > 1:
            for it in items:
                seen[it.key] = seen.get(it.key, 0) + 1
        for it in items:
            o = it.opts
            need = header_bytes_for(len(it.key.encode("utf-8"))) + it.size
            if (need > MAX_OBJECT_BYTES or seen.get(it.key, 1) > 1
                    or (o is not None and (o.upsert or o.replica_num > 1 or o.preferred_segment))):
                out[it.pos] = fallback
            else:
                todo.append(it)
                needs.append(need)
        if not todo:
            return out
        with self._lock:
            if self._pid != os.getpid():
                # a forked child: what is held is the parent's (its reservations, its
                # connections); the child asks for its own
                self._stacks, self._conns, self._done, self._committed = {}, [], [], []
                self._route, self._pid = None, os.getpid()
            before = self._route
            got, missing = self._take(needs)
        if missing:
            self._reserve(missing)
            with self._lock:
                if self._route != before:  # taken under a registration that ended: done
                    self._done.extend(g[0] for g in got if g is not None)
                    got = [None] * len(needs)
                more, _ = self._take([n for n, g in zip(needs, got) if g is None])
                route = self._route  # what every reservation in `got` was granted under
            it_more = iter(more)
            got = [g if g is not None else next(it_more) for g in got]
        else:
            route = before
        entries: list[tuple[Any, int, int, tuple[int, int, int]]] = []  # (item, token, header bytes, extent)
        for it, need, g in zip(todo, needs, got):
            if g is None or route is None:
                if g is not None:
                    with self._lock:
                        self._done.append(g[0])
                out[it.pos] = fallback
                continue
            entries.append((it, g[0], need - it.size, g[1]))
        ready: list[tuple[Any, int, int]] = []  # (item, token, header bytes)
        for (it, token, hb, _), err in zip(entries, self._write(entries) if entries else ()):
            if err is not None:
                with self._lock:
                    self._done.append(token)
                out[it.pos] = err
                continue
            ready.append((it, token, hb))
        for start in range(0, len(ready), MAX_COMMIT_ITEMS):
            self._commit(route, ready[start:start + MAX_COMMIT_ITEMS], out, fallback)  # type: ignore[arg-type]
        n_fell = sum(1 for v in out.values() if v is fallback)
        self.fallbacks += n_fell
        return out

    def _commit(self, route: tuple[str, str, int], ready: list[tuple[Any, int, int]], out: dict[int, Any],
                fallback: Any) -> None:
        address, client_id, epoch = route
        req = master_pb2.CommitRequest(
            client_id=client_id, epoch=epoch, keys=[it.key for it, _, _ in ready],
            put_tokens=[t for _, t, _ in ready], value_size_bytes=[it.size for it, _, _ in ready],
            header_bytes=[hb for _, _, hb in ready], checksums=[int(it.checksum) for it, _, _ in ready],
            flags=[_flags(it.opts) for it, _, _ in ready])
        resp, sent, why = None, False, ""
        for attempt in range(2):
            try:
                resp = self._send(address, req)
                break
            except _NotConnected as exc:
                why = exc.message
                if not sent:
                    break  # nothing reached the master: the daemon's path, at once
            except Unavailable as exc:  # no answer: lost while or after sending
                why = exc.message
                sent = True
            except CxlkvError as exc:  # the whole call refused (nothing committed)
                self._off(f"the master refused a commit: {exc.message}")
                with self._lock:
                    self._done.extend(t for _, t, _ in ready)
                    if exc.code in (_STALE_TOKEN, _UNKNOWN_CLIENT):
                        self._retire_route()
                for it, _, _ in ready:
                    out[it.pos] = fallback
                return
        if resp is None:
            self._off(f"the master's lean port {address} did not answer: {why}")
        self._settle(ready, resp, out, fallback, sent=sent, retried=sent and resp is not None)

    def _send(self, address: str, req: Any) -> Any:
        """One Commit on an idle connection (a new one if none); its answer.

        Raises:
            _NotConnected: no connection (nothing was sent).
            Unavailable: no answer (the request may have reached the master).
            CxlkvError: the master refused the whole call.
        """
        from cxlkv.client._conn import LeanConnection

        with self._lock:
            conn = self._conns.pop() if self._conns else None
        if conn is None:
            try:
                conn = LeanConnection.service(address, self.timeout_s, peer="the master")
            except Unavailable as exc:
                raise _NotConnected(exc.message) from None
        try:
            resp = conn.call(_COMMIT, req)  # Unavailable: lost after (or while) sending
        except CxlkvError:
            conn.close()
            raise
        with self._lock:
            if self._route is not None and self._route[0] == address:
                self._conns.append(conn)
            else:
                conn.close()
        return resp

    def _settle(self, ready: list[tuple[Any, int, int]], resp: Any, out: dict[int, Any], fallback: Any,
                sent: bool, retried: bool = False) -> None:
        """Each item's answer from ``resp`` (``None``: no answer; ``sent``: the
        request may have reached the master)."""
        if resp is not None and not resp.error_positions and len(resp.codes) == len(ready):  # all committed
            for it, token, _ in ready:
                out[it.pos] = token
            with self._lock:
                self._committed.extend((token, it.key) for it, token, _ in ready)
            self.committed += len(ready)
            return
        codes = list(resp.codes) if resp is not None else None
        messages = dict(zip(resp.error_positions, resp.messages)) if resp is not None else {}
        stale = False
        for i, (it, token, _) in enumerate(ready):
            code = codes[i] if codes is not None else None
            if code == 0:
                out[it.pos] = token
                self._committed_one(token, it.key)
            elif code is None or (code == _STALE_TOKEN and retried):
                # unanswered, or refused on the second try (the first may have landed): the index says
                if (code is not None or sent) and self._probe is not None and self._probe(
                        it.key.encode("utf-8")) == token:
                    out[it.pos] = token
                    self._committed_one(token, it.key)
                else:
                    with self._lock:
                        self._done.append(token)
                    out[it.pos] = fallback
            elif code in (_STALE_TOKEN, _UNKNOWN_CLIENT):
                stale = True  # the registration ended: nothing committed
                with self._lock:
                    self._done.append(token)
                out[it.pos] = fallback
            else:  # the master's answer for this key (the reservation is consumed: the daemon forgets it)
                with self._lock:
                    self._done.append(token)
                out[it.pos] = error_for(code, messages.get(i, ""), key=it.key)
        if stale:
            with self._lock:
                self._retire_route()
            self._report()  # the old registration's space is quarantined until the daemon hears
        self.committed += sum(1 for it, _, _ in ready if isinstance(out.get(it.pos), int))

    def _committed_one(self, token: int, key: str) -> None:
        with self._lock:
            self._committed.append((token, key))

    def close(self) -> None:
        """Report every held reservation done and what was committed (best effort:
        the daemon reclaims what is left when this process exits); close the connections."""
        with self._lock:
            if self._pid != os.getpid():
                return  # the parent's to report
            self._retire_route()
        self._report()

    def _report(self) -> None:
        """Tell the daemon now what was used and what will not be (best effort)."""
        with self._lock:
            done, self._done = self._done, []
            committed, self._committed = self._committed, []
        if not done and not committed:
            return
        try:
            self._call_daemon(client_pb2.DirectReserveRequest(
                pid=os.getpid(), done_put_tokens=done, committed_put_tokens=[t for t, _ in committed],
                committed_keys=[k for _, k in committed]))
        except CxlkvError:
            with self._lock:  # told next time; the daemon reaps them when this process exits
                self._done.extend(done)
                self._committed.extend(committed)


class _NotConnected(Unavailable):
    """The master could not be reached: nothing was sent."""


def _flags(o: Any) -> int:
    """Commit flags of put options: bit 1 soft pin, bit 2 hard pin (upserts never commit directly)."""
    if o is None:
        return 0
    return (2 if o.soft_pin else 0) | (4 if o.hard_pin else 0)
