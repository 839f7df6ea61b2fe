"""systemd service notifications (``Type=notify``) without libsystemd.

The protocol is the one of sd_notify(3): a daemon started by systemd finds an
``AF_UNIX`` datagram socket in ``$NOTIFY_SOCKET`` (a path, or an abstract
address written with a leading ``@``) and sends newline-separated
``VARIABLE=value`` assignments to it, one datagram per notification:

* ``READY=1`` — start-up is finished (cxlkv: the port or sockets are bound,
  the regions mapped and the daemon serves);
* ``STATUS=…`` — one line of free text that ``systemctl status`` shows;
* ``STOPPING=1`` — the daemon began shutting down;
* ``RELOADING=1`` … ``READY=1`` — a reload (SIGHUP, ``ExecReload=``) runs and ended;
* ``EXTEND_TIMEOUT_USEC=…`` — a long start-up still progresses (region scans);
* ``WATCHDOG=1`` — keep-alive, due every ``$WATCHDOG_USEC`` microseconds when
  the unit sets ``WatchdogSec=`` (sd_watchdog_enabled(3): only for the process
  named by ``$WATCHDOG_PID`` when that is set). cxlkv sends it from the event
  loop at half that period, so a wedged loop stops the pings and systemd
  restarts the daemon.

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a cheap no-op. The
PyPI ``sdnotify`` package does the same sending but has been unmaintained since
2017 and knows nothing of the watchdog variables, so these ~30 lines stand in.

Components receive a :class:`Notifier`; only the command line builds one from
the environment (:meth:`Notifier.from_env`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator, Mapping

__all__ = ["Notifier", "install_reload", "config_reloader"]

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify(3) messages to one notification socket.

    Args:
        address: the ``$NOTIFY_SOCKET`` value (``""``: notifications disabled).
        watchdog_usec: ``$WATCHDOG_USEC`` (0: no watchdog).

    Thread-safety: :meth:`notify` may be called from any thread (one
    ``sendto`` per message).
    """

    def __init__(self, address: str = "", watchdog_usec: int = 0) -> None:
        self.address = address
        self.watchdog_usec = max(0, int(watchdog_usec))
        self._sock: socket.socket | None = None
        self._warned = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Notifier":
        """The notifier systemd asked for in ``env`` (pass ``os.environ``).

        ``WATCHDOG_USEC`` is honoured only when ``WATCHDOG_PID`` is unset or
        names this process (sd_watchdog_enabled(3)); malformed values disable
        the watchdog rather than failing the start.
        """
        usec = 0
        pid = env.get("WATCHDOG_PID", "")
        if not pid or pid == str(os.getpid()):
            try:
                usec = int(env.get("WATCHDOG_USEC", "0") or 0)
            except ValueError:
                usec = 0
        return cls(env.get("NOTIFY_SOCKET", ""), usec)

    @property
    def enabled(self) -> bool:
        """Whether a notification socket is configured."""
        return bool(self.address)

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or ``None``."""
        if not self.enabled or not self.watchdog_usec:
            return None
        return self.watchdog_usec / 2e6

    def notify(self, *assignments: str) -> bool:
        """Send ``VARIABLE=value`` assignments as one datagram.

        Returns:
            Whether it was sent (``False`` outside systemd or when the socket
            refused it; a failure is logged once, never raised: systemd
            bookkeeping must not take the daemon down).
        """
        if not self.address or not assignments:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        message = "\n".join(a.replace("\n", " ") for a in assignments).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, target)
            return True
        except OSError as exc:
            if not self._warned:
                log.warning("cannot notify systemd at %s: %s", self.address, exc.strerror or exc)
                self._warned = True
            return False

    def ready(self, status: str = "") -> bool:
        """``READY=1`` (with ``STATUS=status`` when given)."""
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        """``STATUS=text``: one line for ``systemctl status``."""
        return self.notify(f"STATUS={text}")

    def stopping(self, status: str = "") -> bool:
        """``STOPPING=1`` (with ``STATUS=status`` when given)."""
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: one keep-alive ping."""
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float, status: str = "") -> bool:
        """``EXTEND_TIMEOUT_USEC=…``: the start (or stop) still progresses; systemd
        waits ``seconds`` more from now before it gives up (``TimeoutStartSec=``
        is extended, not replaced). Sent during long work before READY=1, e.g.
        the region scans of ``--recover-from-region``."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(1, int(seconds * 1e6))}",
                           *([f"STATUS={status}"] if status else []))

    @contextlib.contextmanager
    def extending(self, status: str, *, every_s: float = 5.0, extend_s: float = 30.0) -> Iterator[None]:
        """While the block runs (long start-up work that may block the event loop
        or run in one C call: region scans, prefaulting a large region), a thread
        sends ``EXTEND_TIMEOUT_USEC`` (``extend_s`` more) and ``WATCHDOG=1`` every
        ``every_s`` seconds with ``STATUS=status (N s)``, so ``TimeoutStartSec=``
        bounds a start that stopped progressing, not one that is slow. No thread
        outside systemd."""
        if not self.enabled:
            yield
            return
        done = threading.Event()
        t0 = time.monotonic()

        def keepalive() -> None:
            while not done.wait(every_s):
                self.notify(f"EXTEND_TIMEOUT_USEC={int(extend_s * 1e6)}", "WATCHDOG=1",
                            f"STATUS={status} ({time.monotonic() - t0:.0f} s)")

        self.extend_timeout(extend_s, status)
        thread = threading.Thread(target=keepalive, name="systemd-extend", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def reloading(self, status: str = "") -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC`` (sd_notify(3)); ``READY=1`` ends it."""
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *([f"STATUS={status}"] if status else []))

    async def run_watchdog(self) -> None:
        """Ping ``WATCHDOG=1`` every :attr:`watchdog_interval_s` until cancelled.

        Runs on the daemon's event loop, so the pings stop when the loop is
        blocked. Returns at once when no watchdog was asked for.
        """
        interval = self.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(interval)

    def close(self) -> None:
        """Close the sending socket (later calls reopen it)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def install_reload(notifier: Notifier, reload: Callable[[], str]) -> None:
    """Make SIGHUP (``systemctl reload``: ``ExecReload=kill -HUP $MAINPID``) run
    ``reload`` between ``RELOADING=1`` and ``READY=1``, so ``systemctl reload``
    returns once it is done. ``reload`` returns the status line; an exception is
    logged as one line and the daemon runs on unchanged.

    The handler runs ``reload`` on the running event loop (a callback, never
    inside whatever the signal interrupted), else at once. Main thread only.
    """
    def do_reload() -> None:
        notifier.reloading("reloading the configuration")
        try:
            text = reload()
        except Exception as exc:  # a bad file must not take the daemon down
            text = f"reload failed, running on unchanged: {exc}"
            log.error("%s", text)
        notifier.ready(text)

    def on_hup(_signum: int, _frame: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            do_reload()
        else:
            loop.call_soon_threadsafe(do_reload)

    signal.signal(signal.SIGHUP, on_hup)


def config_reloader(load: Callable[[], Any], current: Any, component: str) -> Callable[[], str]:
    """A ``reload`` for :func:`install_reload`: loads the configuration again
    (``load()``: the file, environment and flags the daemon started with) and
    applies what can change while running — ``log_level`` — and names every
    other changed key as needing a restart.

    Raises (from the returned callable):
        ConfigError: the file no longer loads (the daemon keeps its settings).
    """
    state = {"cfg": current}

    def reload() -> str:
        new = load()
        old = state["cfg"]
        changed = [f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)]
        applied = []
        if "log_level" in changed:
            root = logging.getLogger()
            root.setLevel(new.log_level.upper())
            logging.getLogger("grpc").setLevel(max(root.level, logging.WARNING))
            applied.append(f"log_level {old.log_level} → {new.log_level}")
        later = [k for k in changed if k != "log_level"]
        state["cfg"] = dataclasses.replace(old, log_level=new.log_level)
        text = (f"{component}: configuration reloaded: " + (", ".join(applied) or "nothing to apply")
                + (f"; changed, needs a restart: {', '.join(later)}" if later else ""))
        log.log(logging.WARNING if later else logging.INFO, "%s", text)
        return text

    return reload
