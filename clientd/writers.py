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
import time
from dataclasses import dataclass, field
from typing import Iterable, TypeVar

from cxlkv.clientd.regions import StartupError

__all__ = ["Incarnation", "Previous", "DirectWriter", "parse_record", "running", "RECORD_MAGIC"]

W = TypeVar("W")

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

    The record (``<socket>.state``) is a log of lines, appended as things change
    and rewritten whole (a temporary file, then a rename) only when the
    registration changes, at a clean stop, or once the appended lines outnumber
    twice the live entries (:data:`COMPACT_MIN_LINES` at least). So a direct put's
    start and end cost one ``write(2)`` each, whatever the number pending (a
    rewrite of the whole record per start and end cost 140 µs each on ext4 here,
    and grew with the pending puts)::

        cxlkv-clientd-state 1
        R <pid> <epoch> <client id>
        + <put token> <writer pid> <writer start time or -> <key, a JSON string>
        - <put token>

    Lines are read in order: ``+`` records a pending direct put, ``-`` ends it;
    an unterminated last line (a write the process did not finish) is ignored.

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
        #: Pending direct puts as recorded: put token -> writer.
        self._direct: dict[int, DirectWriter] = {}
        self._log_fd = -1
        #: Lines appended since the record was last written whole.
        self._appended = 0
        #: An append failed (a full filesystem): the record may end in a partial line,
        #: so the next change rewrites it whole (tried again at most once per
        #: :data:`REWRITE_RETRY_S`, from :attr:`_retry_at` on).
        self._dirty = False
        self._retry_at = 0.0
        self.rewrites = 0

    def acquire(self) -> Previous | None:
        """Take the lock; the previous process's record, or ``None`` (none, or unreadable).

        A full filesystem does not stop the daemon: the lock is the ``flock``, not
        the pid written into the file (which only names the holder in the message
        above), and a record that cannot be written is logged (:meth:`_rewrite`).
        The previous process's direct writers stay in this process's record until
        :meth:`direct_ended` says otherwise, so a crash of this process before it
        has looked at them loses none.

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
            with open(self.state_path, "rb") as f:
                raw = f.read()
            prev = parse_record(raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("record of the previous clientd process at %s unreadable (%s): its quarantined "
                        "space waits for an operator (cxlkv admin release-writer)", self.state_path, exc)
            return None
        if not prev.client_id:
            return None
        # carried until this process registers: a rewrite before then (a clean stop while
        # the master is down) must pass the registration on, not an empty client id
        self._client_id, self._epoch = prev.client_id, prev.epoch
        self._direct = {w.put_token: w for w in prev.direct}
        return prev

    def record_registration(self, client_id: str, epoch: int) -> None:
        """Record the current registration (after each one): the record is rewritten whole."""
        self._client_id, self._epoch = client_id, epoch
        self._rewrite()

    def direct_started(self, writers: Iterable[DirectWriter]) -> None:
        """Record direct puts whose writers are about to learn their extents (one append)."""
        ws = list(writers)
        if not ws:
            return
        for w in ws:
            self._direct[w.put_token] = w
        self._append("".join(
            f"+ {w.put_token} {w.pid} {'-' if w.pid_start is None else w.pid_start} {json.dumps(w.key)}\n"
            for w in ws), len(ws))

    def direct_ended(self, tokens: Iterable[int]) -> None:
        """Record that these direct puts ended (committed, revoked, or their writer exited)."""
        ended = [t for t in tokens if self._direct.pop(t, None) is not None]
        if ended:
            self._append("".join(f"- {t}\n" for t in ended), len(ended))

    def _append(self, text: str, lines: int) -> None:
        if self._fd < 0:
            return
        self._appended += lines
        if self._dirty or self._log_fd < 0:
            # the record on disk is stale until a rewrite succeeds; on a full filesystem
            # each attempt formats every entry and fails: one a REWRITE_RETRY_S at most,
            # not one per start and end (O(pending) each, on the daemon's event loop)
            if _monotonic() >= self._retry_at:
                self._rewrite()
            return
        if self._appended > max(COMPACT_MIN_LINES, 2 * len(self._direct)):
            self._rewrite()
            return
        data = text.encode()
        try:
            if os.write(self._log_fd, data) != len(data):
                raise OSError(28, "short write")
        except OSError as exc:
            self._dirty = True
            self._retry_at = 0.0  # the next change tries the rewrite
            log.warning("cannot record a direct put in %s: %s (the record is rewritten at the next change)",
                        self.state_path, exc.strerror or exc)

    def _rewrite(self) -> None:
        """Write the whole record to a temporary file and rename it into place."""
        if self._fd < 0:
            return
        lines = [f"{RECORD_MAGIC}\n", f"R {os.getpid()} {self._epoch} {self._client_id}\n"]
        lines += [f"+ {w.put_token} {w.pid} {'-' if w.pid_start is None else w.pid_start} {json.dumps(w.key)}\n"
                  for w in self._direct.values()]
        tmp = f"{self.state_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("".join(lines))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            if self._retry_at == 0.0:  # once per failing spell, not per retry
                log.warning("cannot record the daemon's registration and pending direct puts in %s: %s "
                            "(retried every %g s)", self.state_path, exc, REWRITE_RETRY_S)
            self._dirty = True
            self._retry_at = _monotonic() + REWRITE_RETRY_S
            try:  # a full filesystem: leave no partial record behind
                os.unlink(tmp)
            except OSError:
                pass
            return
        if self._retry_at:
            log.warning("recorded the registration and %d pending direct put(s) in %s again",
                        len(self._direct), self.state_path)
        self.rewrites += 1
        self._dirty = False
        self._retry_at = 0.0
        self._appended = 0
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        try:
            self._log_fd = os.open(self.state_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot open %s to append to it: %s", self.state_path, exc.strerror or exc)

    def release(self) -> None:
        """Clean stop: drop the lock. The record stays, rewritten whole: direct writers
        with puts pending may outlive this process, and the next one watches them."""
        self._rewrite()
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        if self._fd >= 0:
            os.close(self._fd)  # drops the flock
            self._fd = -1


#: A record that could not be written (a full filesystem) is tried again at most this
#: often, in seconds, while direct puts start and end.
REWRITE_RETRY_S = 1.0
_monotonic = time.monotonic

#: First line of the record (its format version).
RECORD_MAGIC = "cxlkv-clientd-state 1"
#: The record is rewritten whole once more lines than this (and than twice the live
#: entries) were appended since it last was.
COMPACT_MIN_LINES = 4096


def parse_record(raw: bytes) -> Previous:
    """The previous process's record from the bytes of ``<socket>.state``.

    Reads the line format of :class:`Incarnation` and the JSON object of earlier
    versions (``{"pid", "client_id", "epoch", "direct": [[token, key, pid, start]]}``).
    An unterminated last line is ignored (a write the process did not finish).

    Raises:
        ValueError: neither format (the message says which line).
    """
    if raw.lstrip().startswith(b"{"):
        obj = json.loads(raw)
        return Previous(int(obj["pid"]), str(obj["client_id"]), int(obj["epoch"]),
                        [DirectWriter(int(t), str(k), int(p), None if s is None else int(s))
                         for t, k, p, s in obj.get("direct", [])])
    text = raw.decode("utf-8")
    lines = text.split("\n")[:-1]  # the last piece is "" or an unfinished line
    if not lines or lines[0] != RECORD_MAGIC:
        raise ValueError(f"not a clientd record (first line {lines[0][:40] if lines else text[:40]!r})")
    prev = Previous(0, "", 0)
    direct: dict[int, DirectWriter] = {}
    for n, line in enumerate(lines[1:], start=2):
        kind, _, rest = line.partition(" ")
        try:
            if kind == "R":
                pid, epoch, client_id = rest.split(" ", 2)
                prev = Previous(int(pid), client_id, int(epoch))
            elif kind == "+":
                token, pid, start, key = rest.split(" ", 3)
                direct[int(token)] = DirectWriter(int(token), str(json.loads(key)), int(pid),
                                                  None if start == "-" else int(start))
            elif kind == "-":
                direct.pop(int(rest), None)
            else:
                raise ValueError(kind)
        except ValueError:
            raise ValueError(f"line {n} is not a record line: {line[:60]!r}") from None
    prev.direct = list(direct.values())
    return prev


def _read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).split(b"\n", 1)[0] or b"0")
    except (OSError, ValueError):
        return 0


def running(ws: Iterable[W]) -> list[W]:
    """The writers of ``ws`` (anything with ``pid`` and ``pid_start``: a
    :class:`DirectWriter`, a pending direct put) whose process is the same one still
    running, in order; one look at ``/proc`` per writer process (a record holds up to
    ``MAX_PENDING`` puts, most of them from a few writers). A pid of 0 never runs."""
    from cxlkv.clientd import buffers

    starts: dict[int, int | None] = {}
    out = []
    for w in ws:
        if w.pid <= 0:
            continue
        if w.pid not in starts:
            starts[w.pid] = buffers.process_start_time(w.pid)
        if starts[w.pid] == w.pid_start:
            out.append(w)
    return out
