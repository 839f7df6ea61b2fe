"""A safe runtime directory, and the check that the daemon on a socket is a trusted one.

The runtime directory holds clientd's sockets (docs/operations.md, "Runtime
directory"). A predictable path such as ``/tmp/cxlkv-<uid>`` is only safe if
nobody else could have created it or may write into it: another local user who
creates it first would otherwise bind the sockets there and receive every value
an application writes. The rules are those of ``XDG_RUNTIME_DIR``:

* the directory is a real directory (not a symbolic link), owned by the user
  (or by root), and neither group- nor other-writable;
* a missing one is created with mode 0700 by one ``mkdir`` (atomic: whoever
  loses a race sees the winner's directory and checks it like any other);
  the system-wide ``/run/cxlkv`` (root's default) is created 0755.

A daemon running as a service user shares its socket with a group through the
socket's mode (``socket_mode``, 0o660) inside a directory that is group-readable,
not group-writable (systemd ``RuntimeDirectoryMode=0750``): those rules allow it.

Before it sends anything the SDK checks who listens on the socket
(:func:`check_daemon_peer`): the peer's uid (``SO_PEERCRED``) must be the
caller's own, root, or the owner of the socket file when the socket's directory
is writable by nobody but that owner (or root).
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from cxlkv.errors import ConfigError

__all__ = ["UnsafeRuntimeDir", "UntrustedDaemon", "check_private_dir", "check_daemon_peer"]


class UnsafeRuntimeDir(ConfigError, PermissionError):
    """The runtime directory could be controlled by another user (code ``INVALID_ARGUMENT``;
    raised locally, never sent on the wire)."""


class UntrustedDaemon(ConfigError, PermissionError):
    """The process serving the daemon's socket runs as a user the caller does not trust
    (code ``INVALID_ARGUMENT``; raised locally before anything was sent)."""


def check_private_dir(path: str | os.PathLike[str], *, create: bool, create_mode: int = 0o700) -> Path:
    """Check (and with ``create``, make) a runtime directory under the XDG rules.

    Args:
        path: the directory.
        create: create it when missing (its parent must exist).
        create_mode: its mode when created: 0700 for a user's own directory; the
            system-wide ``/run/cxlkv`` is made 0755 so that a group may reach a
            shared socket (whose own mode says who may connect).

    Returns:
        The path.

    Raises:
        UnsafeRuntimeDir: it is a symbolic link or not a directory, is owned by
            another user than the caller or root, or is writable by group or others;
            it cannot be created (the message says why).
        FileNotFoundError: missing and ``create`` is false.
    """
    p = Path(path)
    if create:
        try:
            os.mkdir(p, create_mode & 0o755)  # atomic; the umask may only take bits away
        except FileExistsError:
            pass
        except OSError as exc:
            raise UnsafeRuntimeDir(f"runtime directory {p}: cannot create it: {exc.strerror or exc}") from None
    st = os.lstat(p)
    euid = os.geteuid()
    fix = f"remove it (rm -r {p}) or choose another (XDG_RUNTIME_DIR, or socket_path / CXLKV_SOCKET)"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeRuntimeDir(f"runtime directory {p} is not a directory (a symbolic link or a file): "
                               f"refusing it; {fix}")
    if st.st_uid not in (euid, 0):
        raise UnsafeRuntimeDir(f"runtime directory {p} is owned by uid {st.st_uid}, not by you (uid {euid}): "
                               f"refusing it (its owner could read every value sent through it); {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeRuntimeDir(f"runtime directory {p} has mode {stat.S_IMODE(st.st_mode):04o}, writable by "
                               f"{'others' if st.st_mode & stat.S_IWOTH else 'its group'}: refusing it (they could "
                               f"put their own socket there); chmod 0700 {p}, or {fix}")
    return p


def check_daemon_peer(sock: socket.socket, socket_path: str) -> None:
    """Refuse a socket whose listening process runs as an untrusted user.

    Trusted: the caller's own effective uid, root, or the owner of the socket file
    (a daemon running as a service user that shares its socket with a group) when
    the socket's directory is owned by root or that owner and writable by neither
    group nor others (``/run/cxlkv``; never a sticky ``/tmp``). A
    peer whose credentials cannot be read (not a Unix socket, or no ``SO_PEERCRED``
    on this platform) is let through.

    Args:
        sock: a connected Unix socket, before anything was sent on it.
        socket_path: the path it connected to.

    Raises:
        UntrustedDaemon: the peer's uid is none of those.
    """
    from cxlkv.wire.lean import peer_cred

    cred = peer_cred(sock)
    if cred is None:
        return
    pid, uid, _ = cred
    euid = os.geteuid()
    if uid in (euid, 0):
        return
    try:
        owner = os.stat(socket_path).st_uid
        parent = os.stat(os.path.dirname(os.path.abspath(socket_path)))
    except OSError:
        owner = parent = None
    # The socket's owner is trusted only where nobody else could have put the socket:
    # a directory owned by root or by that owner, writable by neither group nor others.
    if (uid == owner and parent is not None and parent.st_uid in (0, owner)
            and not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return
    raise UntrustedDaemon(f"socket {socket_path} is served by process {pid} of uid {uid}, which is neither you "
                          f"(uid {euid}), root, nor the owner of the socket in a directory only it may write "
                          f"to: refusing to send to it")
