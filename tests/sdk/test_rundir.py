"""The runtime directory's XDG rules and the SDK's check of its daemon's peer credentials.

Real daemons and real sockets: a clientd started with the default socket path
refuses an unsafe runtime directory with one line; the SDK refuses one too; a
socket served by a process of another uid is refused before anything is sent.
Tests that need a second uid run as root (``nobody`` owns the directories, a
forked child that became ``nobody`` serves the socket) and skip otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w

from cxlkv import Client
from cxlkv.config import default_runtime_dir
from cxlkv.runtime.rundir import UnsafeRuntimeDir, UntrustedDaemon, check_daemon_peer, check_private_dir

NOBODY_UID = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to give a directory or a socket another owner)")


def test_missing_dir_is_created_0700(tmp_path: Path) -> None:
    d = tmp_path / "cxlkv"
    old = os.umask(0)
    try:
        check_private_dir(d, create=True)
    finally:
        os.umask(old)
    st = os.lstat(d)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    check_private_dir(d, create=True)  # a second time: the existing one passes


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722, 0o1777])
def test_group_or_other_writable_dir_refused(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "cxlkv"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(UnsafeRuntimeDir, match=r"mode .*writable by .*refusing"):
        check_private_dir(d, create=True)


def test_group_readable_dir_allowed(tmp_path: Path) -> None:
    """systemd's RuntimeDirectoryMode=0750 for a socket shared with a group."""
    d = tmp_path / "cxlkv"
    d.mkdir()
    os.chmod(d, 0o750)
    assert check_private_dir(d, create=False) == d


def test_symlink_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "cxlkv").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeRuntimeDir, match="not a directory"):
        check_private_dir(tmp_path / "cxlkv", create=True)


@as_root
def test_dir_of_another_owner_refused(tmp_path: Path) -> None:
    d = tmp_path / "cxlkv"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY_UID, -1)
    with pytest.raises(UnsafeRuntimeDir, match=f"owned by uid {NOBODY_UID}"):
        check_private_dir(d, create=True)


def test_xdg_runtime_dir_preferred(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_runtime_dir() == tmp_path / "cxlkv"


# ------------------------------------------------------------------ real processes

def _clientd_config(tmp_path: Path, xdg: Path) -> tuple[Path, dict[str, str]]:
    region = tmp_path / "region"
    subprocess.run([sys.executable, "-m", "cxlkv.cli", "region", "format", str(region), "--segment", "cxl0",
                    "--create", "--size", "16MiB"], check=True, capture_output=True)
    conf = tmp_path / "clientd.toml"
    conf.write_text(tomli_w.dumps({
        "name": "clientd", "master_address": "127.0.0.1:1", "socket_path": "",
        "regions": [{"segment": "cxl0", "path": str(region)}],
    }))
    return conf, dict(os.environ, XDG_RUNTIME_DIR=str(xdg))


@pytest.mark.parametrize("unsafe", ["mode", "owner"])
def test_clientd_refuses_unsafe_runtime_dir(tmp_path: Path, unsafe: str) -> None:
    if unsafe == "owner" and os.geteuid() != 0:
        pytest.skip("needs root (to give the directory another owner)")
    xdg = tmp_path / "xdg"
    (xdg / "cxlkv").mkdir(parents=True)
    if unsafe == "mode":
        os.chmod(xdg / "cxlkv", 0o777)
    else:
        os.chown(xdg / "cxlkv", NOBODY_UID, -1)
    conf, env = _clientd_config(tmp_path, xdg)
    p = subprocess.run([sys.executable, "-m", "cxlkv.cli", "clientd", "--config", str(conf)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "runtime directory" in ln]
    assert len(lines) == 1 and "refusing it" in lines[0], p.stderr
    assert not list((xdg / "cxlkv").iterdir())  # no socket was bound there


def test_sdk_refuses_unsafe_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CXLKV_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "cxlkv").mkdir()
    os.chmod(tmp_path / "cxlkv", 0o777)
    with pytest.raises(UnsafeRuntimeDir, match="writable by others"):
        Client()


def test_default_runtime_dir_end_to_end(monkeypatch: pytest.MonkeyPatch, make_cluster, tmp_path: Path) -> None:
    """A clientd with the default socket path creates $XDG_RUNTIME_DIR/cxlkv 0700; the SDK's
    default path finds it, checks the daemon's credentials and works."""
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    monkeypatch.delenv("CXLKV_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    make_cluster(clientds=1, clientd_options={"name": "clientd", "socket_path": ""})
    st = os.lstat(xdg / "cxlkv")
    assert stat.S_IMODE(st.st_mode) == 0o700
    with Client() as c:
        c.put("k", b"v" * 100)
        assert c.get("k") == b"v" * 100
    with Client(protocol="grpc") as c:
        assert c.get("k") == b"v" * 100


# ------------------------------------------------------------------ peer credentials

@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="cxlkv-peer-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _serve_as(uid: int, path: Path) -> int:
    """Fork a child that becomes ``uid`` and listens on ``path``; returns its pid once listening."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest, no threads of its own
        try:
            os.close(r)
            if uid != os.geteuid():
                os.setgid(65534)
                os.setuid(uid)
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(str(path))
            srv.listen(8)
            os.write(w, b"1")
            srv.settimeout(30)
            conn, _ = srv.accept()
            conn.settimeout(5)
            got = conn.recv(16)  # what the caller sent before closing
            os.write(w, b"S" if got else b"N")
        except BaseException:
            pass
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    _serve_as.pipes[pid] = r  # type: ignore[attr-defined]
    return pid


_serve_as.pipes = {}  # type: ignore[attr-defined]


def _connect_and_check(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        check_daemon_peer(s, str(path))
        s.sendall(b"hello")
    finally:
        s.close()


def _reap(pid: int) -> bytes:
    r = _serve_as.pipes.pop(pid)  # type: ignore[attr-defined]
    try:
        deadline = time.monotonic() + 10
        out = b""
        while time.monotonic() < deadline:
            chunk = os.read(r, 1)
            if not chunk:
                break
            out += chunk
        return out
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_peer_of_own_uid_accepted(shared_dir: Path) -> None:
    path = shared_dir / "d.sock"
    pid = _serve_as(os.geteuid(), path)
    _connect_and_check(path)
    assert _reap(pid) == b"S"


@as_root
def test_peer_of_another_uid_refused_before_sending(shared_dir: Path) -> None:
    """A daemon of another user in a directory others may write to (the /tmp squat): refused,
    and the server received nothing."""
    os.chmod(shared_dir, 0o1777)
    path = shared_dir / "d.sock"
    pid = _serve_as(NOBODY_UID, path)
    assert os.stat(path).st_uid == NOBODY_UID
    with pytest.raises(UntrustedDaemon, match=f"uid {NOBODY_UID}"):
        _connect_and_check(path)
    assert _reap(pid) == b"N"


@as_root
def test_sdk_refuses_daemon_of_another_uid(shared_dir: Path) -> None:
    os.chmod(shared_dir, 0o1777)
    path = shared_dir / "d.sock"
    pid = _serve_as(NOBODY_UID, path)
    with pytest.raises(UntrustedDaemon, match="refusing to send"):
        Client(socket_path=str(path), lean_socket_path=str(path))
    assert _reap(pid) == b"N"
    pid = _serve_as(NOBODY_UID, path.with_name("g.sock"))
    with pytest.raises(UntrustedDaemon):
        Client(socket_path=str(path.with_name("g.sock")), protocol="grpc")
    assert _reap(pid) == b"N"


@as_root
def test_service_user_owning_socket_and_directory_accepted(shared_dir: Path) -> None:
    """The shared-daemon case: a service user's socket in a directory only it (or root) writes."""
    os.chown(shared_dir, NOBODY_UID, -1)
    os.chmod(shared_dir, 0o750)
    path = shared_dir / "d.sock"
    pid = _serve_as(NOBODY_UID, path)
    _connect_and_check(path)
    assert _reap(pid) == b"S"
