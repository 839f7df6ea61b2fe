"""Proof that a registration's writers stopped: what frees quarantined space.

When a clientd's registration ends (it expired while paused or partitioned, the
master restarted, the daemon restarted), the master quarantines the space that
registration's writers may still be writing: in-flight puts, reservations, and
the puts of direct-mode SDK processes (docs/master.md "Reservations and
fencing"). It is freed only when the daemon proves those writers stopped:

* **the same process** re-registered: once every put round it began under the
  old registration is over (:meth:`cxlkv.clientd.core.ClientdCore.release_when_drained`),
  it sends ``ReleaseQuarantine`` for the old epochs, keeping the puts of direct
  writers that are still running; each of those is freed when its writer ends it
  (DirectPutEnd answers STALE_TOKEN, then PutRevoke) or exits (the reaper);
* **a new process** of the daemon: :class:`Incarnation` takes an exclusive
  ``flock`` on ``<socket>.lock`` for the process's life — held, it proves no
  other process of this daemon runs — and reads what the previous process
  recorded beside it (``<socket>.state``: its client id, last epoch, and pending
  direct puts with their writers' pid and start time). It registers under the
  same client id, releases everything of the old epochs but the puts of direct
  writers still alive, and watches those until they exit.

A process that never comes back (its host died) leaves its space quarantined
until an operator runs ``cxlkv admin release-writer`` or ``writer_reclaim_s``
passes.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from cxlkv.clientd.regions import StartupError

__all__ = ["Incarnation", "Previous", "DirectWriter"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DirectWriter:
    """A direct put a process of this daemon had pending: its token, key and writer."""

    put_token: int
    key: str
    pid: int
    pid_start: int | None


@dataclass(slots=True)
class Previous:
    """What the previous process of this daemon recorded."""

    pid: int
    client_id: str
    epoch: int
    direct: list[DirectWriter] = field(default_factory=list)


class Incarnation:
    """This daemon's claim on its socket, and its record for the next process.

    Args:
        socket_path: the daemon's gRPC socket; the lock is ``socket_path + ".lock"``,
            the record ``socket_path + ".state"``.
    """

    def __init__(self, socket_path: str) -> None:
        self.lock_path = socket_path + ".lock"
        self.state_path = socket_path + ".state"
        self._fd = -1
        self._client_id = ""
        self._epoch = 0
        self._direct: list[DirectWriter] = []

    def acquire(self) -> Previous | None:
        """Take the lock; the previous process's record, or ``None`` (none, or unreadable).

        A full filesystem does not stop the daemon: the lock is the ``flock``, not
        the pid written into the file (which only names the holder in the message
        above), and a record that cannot be written is logged (:meth:`_write`).

        Raises:
            StartupError: another process of this daemon holds the lock (one line, its
                pid); the lock file cannot be opened (the message names it and why).
        """
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StartupError(f"cannot open the lock file {self.lock_path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StartupError(f"another clientd process uses {self.lock_path}"
                               + (f" (pid {holder})" if holder else "") + "; stop it first") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # e.g. ENOSPC: the flock is held all the same
            log.warning("cannot write this process's pid into %s: %s", self.lock_path, exc.strerror or exc)
        self._fd = fd
        try:
            with open(self.state_path, encoding="utf-8") as f:
                raw = json.load(f)
            prev = Previous(int(raw["pid"]), str(raw["client_id"]), int(raw["epoch"]),
                            [DirectWriter(int(t), str(k), int(p), None if s is None else int(s))
                             for t, k, p, s in raw.get("direct", [])])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("record of the previous clientd process at %s unreadable (%s): its quarantined "
                        "space waits for an operator (cxlkv admin release-writer)", self.state_path, exc)
            return None
        return prev if prev.client_id else None

    def record_registration(self, client_id: str, epoch: int) -> None:
        """Record the current registration (after each one)."""
        self._client_id, self._epoch = client_id, epoch
        self._write()

    def record_direct(self, pending: list[DirectWriter]) -> None:
        """Record the pending direct puts (whenever they change)."""
        self._direct = pending
        self._write()

    def _write(self) -> None:
        if self._fd < 0:
            return
        body = json.dumps({"pid": os.getpid(), "client_id": self._client_id, "epoch": self._epoch,
                           "direct": [[w.put_token, w.key, w.pid, w.pid_start] for w in self._direct]})
        tmp = f"{self.state_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(body)
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.warning("cannot record the daemon's registration in %s: %s", self.state_path, exc)
            try:  # a full filesystem: leave no partial record behind
                os.unlink(tmp)
            except OSError:
                pass

    def release(self) -> None:
        """Clean stop: drop the lock. The record stays as it is: direct writers
        with puts pending may outlive this process, and the next one watches them."""
        self._write()
        if self._fd >= 0:
            os.close(self._fd)  # drops the flock
            self._fd = -1


def _read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).split(b"\n", 1)[0] or b"0")
    except (OSError, ValueError):
        return 0


def still_running(w: DirectWriter | Any) -> bool:
    """Whether the writer process of ``w`` is the same process still running."""
    from cxlkv.clientd.buffers import process_start_time

    return w.pid > 0 and process_start_time(w.pid) == w.pid_start
