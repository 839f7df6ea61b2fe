"""What a :class:`~cxlkv.client.Client` keeps of its daemon: the connections
(one :class:`~cxlkv.client._conn.Connection` interface, whichever framing), what
the daemon knows of this process (the pool's shared buffers, the regions direct
mode mapped here) and checks again when it may have restarted, and what the
Client may use now (:class:`~cxlkv.client._paths.Offers`).

:class:`DaemonLink` is the Client's base class: it holds no state of its own;
``Client.__init__`` sets the attributes it reads (listed there).
"""

from __future__ import annotations

import os
import time
from typing import Any

from cxlkv.client._conn import Connection, Connector
from cxlkv.client._daemon import registered
from cxlkv.client._direct import DirectPath
from cxlkv.client._index import IndexPath
from cxlkv.client._paths import Offers
from cxlkv.client._pool import BufferPool
from cxlkv.client.framing import METHODS_BY_NAME
from cxlkv.errors import CxlkvError, DaemonUnreachable, InvalidArgument, NotReady, UnknownBuffer
from cxlkv.wire.keys import key_error
from cxlkv.v1 import client_pb2

__all__ = ["DaemonLink", "INDEX_CHECK_S"]

#: This process's pid, kept current across fork by the hook below: the hot paths
#: compare it instead of calling ``os.getpid()`` (a system call, 0.2 µs here).
_pid_now = os.getpid()


def _after_fork_in_child() -> None:
    global _pid_now
    _pid_now = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)

#: How often reads from the index check the daemon connection (seconds): a
#: daemon restarted on another region is noticed within this long.
INDEX_CHECK_S = 0.2
_NO_KEY = object()  # _index_path: a batch call (keys checked per item)
_M = METHODS_BY_NAME


class DaemonLink:
    """The Client's connections and what its daemon knows of it (the module's docstring).

    Attributes (set by ``Client.__init__``):
        _links: the :class:`~cxlkv.client._conn.Connector` of the Client's framing.
        _pool: the shared-buffer pool.
        _direct: direct mode's mapped regions (with the index reader), or ``None``.
        _direct_unsure: the daemon could not yet say whether it maps the regions direct mode mapped.
        _closed, _pid: closed; the creating process.
    """

    _links: Connector
    _pool: BufferPool
    _direct: DirectPath | None
    _direct_unsure: bool
    _index_check_at: float
    _offer_table: list[Offers | None]
    _closed: bool
    _pid: int
    inline_threshold_bytes: int
    direct_threshold_bytes: int
    direct_status: str
    reports_dropped: int

    def _index_path(self, key: Any = _NO_KEY) -> IndexPath | None:
        """The index reader when reads may use it now, else ``None`` (the daemon path).

        ``key`` (single-key calls) must be a valid key, else the daemon path says
        why. Every :data:`INDEX_CHECK_S` the daemon connection is checked as any
        call checks it (a restarted daemon on another region turns direct mode
        off); a daemon that is down does not stop reads from the index."""
        d = self._direct
        if d is None or d.index is None or d.disabled or self._closed or self._pid != _pid_now:
            return None
        if key is not _NO_KEY and (type(key) is not str or key_error(key) is not None):
            return None
        now = time.monotonic()
        if now >= self._index_check_at:
            self._index_check_at = now + INDEX_CHECK_S
            try:
                self._conn(check=True)
            except CxlkvError:
                pass
            if d.disabled:
                return None
        return d.index

    def _offers(self, index: bool = False, batch: bool = False) -> Offers:
        """What this Client may use now (:class:`~cxlkv.client._paths.Offers`):
        ``index`` as :meth:`_index_path` found it, direct mode when on."""
        d = self._direct
        on = d is not None and not d.disabled
        slot = (index << 2) | (on << 1) | batch  # one made Offers per state: this runs on every call
        o = self._offer_table[slot]
        if o is None or o.inline_threshold_bytes != self.inline_threshold_bytes or \
                o.direct_threshold_bytes != self.direct_threshold_bytes:  # not made yet, or a threshold set since
            o = self._offer_table[slot] = Offers(index=index, direct=on, batch=batch,
                                                 inline_threshold_bytes=self.inline_threshold_bytes,
                                                 direct_threshold_bytes=self.direct_threshold_bytes)
        return o

    def _check_direct(self, conn: Connection) -> None:
        """On a new connection (the daemon may have restarted): if the daemon now
        maps other regions than the ones direct mode mapped here (it came back on
        a reformatted or another region), turn direct mode off for this Client —
        its values go through the daemon — instead of failing every direct read
        with CHECKSUM_MISMATCH. A daemon that cannot tell yet (not registered)
        is asked again at the next call."""
        d = self._direct
        if d is None or d.disabled:
            return
        try:
            info = conn.call(_M["DirectInfo"], client_pb2.DirectInfoRequest())
        except CxlkvError:
            return  # cannot tell (an older daemon): the identity checks of each copy still hold
        why = d.changed(info)
        self._direct_unsure = why is None
        if why:
            d.disable(why)
            self.direct_status = f"off: {why} since this Client mapped it (make a new Client to map it again)"

    def _forgotten_buffers(self) -> bool:
        """Whether the daemon forgot some of the pool's buffers — it restarted and
        this connection has not noticed yet (gRPC tells of a reconnection only
        after its first call). They are dropped from the pool, and direct mode is
        checked too."""
        conn = self._conn()
        if not self._pool.revalidate(lambda ids: registered(conn, ids)):
            return False
        self._check_direct(conn)
        return True

    # ======================================================== connections
    def _conn(self, check: bool = False) -> Connection:
        """This thread's connection, made (again) when needed.

        Args:
            check: first see whether the daemon closed an idle connection or
                connected again (:meth:`Connector.get`; done once per public
                call). A connection to a daemon that may be a new one asks it
                which of the pool's buffers it knows (BufferStatus) and drops the
                others: a restarted daemon has forgotten them all; in direct
                mode it also checks that the daemon still maps the regions this
                process mapped (:meth:`_check_direct`).
        """
        if self._pid != _pid_now:
            raise InvalidArgument("this Client was created in the parent process; create a new one after fork")
        if self._closed:
            raise InvalidArgument("this Client is closed")
        conn, fresh = self._links.get(check)
        if fresh:
            try:
                self._pool.revalidate(lambda ids: registered(conn, ids))
                self._check_direct(conn)
            except BaseException:
                self._links.unchecked(conn)  # the next call asks again
                raise
        elif check and self._direct_unsure:
            self._check_direct(conn)
        return conn

    def _recheck_buffers_next_call(self) -> None:
        """The daemon went away during a call: check the pool's buffers before the
        next one (a new lean connection does so anyway; the gRPC channel only once
        it has told us it reconnected, which may come after that call)."""
        self._links.lost()

    def _items_lost(self, out: Any, lost: bool) -> bool:
        """Whether a batch answer holds items to read again under ``retry_s``
        (see :func:`~cxlkv.client._api._retried`); ``lost``: an earlier try of this call failed."""
        if not isinstance(out, list):
            return False
        errors = [getattr(r, "error", None) for r in out]
        if any(isinstance(e, (DaemonUnreachable, NotReady)) for e in errors):
            return True
        return any(isinstance(e, UnknownBuffer) for e in errors) and (lost or self._forgotten_buffers())

    def _call(self, name: str, request: Any) -> Any:
        return self._conn().call(_M[name], request)

    def _send(self, name: str, request: Any) -> None:
        """Send without waiting for the answer where the framing allows (lean), else call."""
        self._conn().send(_M[name], request)

    def _send_nowait(self, name: str, request: Any) -> bool:
        """Send without waiting and without ever blocking; ``False`` when the daemon is
        not taking requests now (stopped, or its socket full): the request is dropped
        and counted in :attr:`reports_dropped`."""
        if self._conn().send_nowait(_M[name], request):
            return True
        self.reports_dropped += 1
        return False

    def _call_many(self, name: str, requests: list[Any]) -> list[Any]:
        m = _M[name]
        return self._conn().call_many([(m, r) for r in requests])

    def _register_buffer(self, path: str, size_bytes: int, pid: int) -> int:
        r = self._call("RegisterBuffer", client_pb2.RegisterBufferRequest(path=path, size_bytes=size_bytes, pid=pid))
        return r.buffer_id

    def _unregister_buffer(self, buffer_id: int) -> None:
        if self._pid != os.getpid():
            return
        # A connection idle since a daemon restart is replaced first: else the
        # request is lost and the new daemon keeps the buffer for this process's life.
        self._conn(check=True).call(_M["UnregisterBuffer"], client_pb2.UnregisterBufferRequest(buffer_id=buffer_id))
