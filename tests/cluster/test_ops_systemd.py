"""systemd integration: sd_notify messages of both daemons (READY=1 once bound and
mapped, STATUS=, WATCHDOG=1, STOPPING=1 on SIGTERM), the Notifier itself, and
``systemd-analyze verify`` of the shipped units where the tool exists.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import tomli_w

from cxlkv.runtime.systemd import Notifier

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
MiB = 1 << 20


class NotifyListener:
    """An AF_UNIX datagram socket standing in for systemd's notification socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[list[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            self.messages.append(data.decode().split("\n"))

    def assignments(self) -> list[str]:
        """Every assignment received, in order."""
        return [a for m in list(self.messages) for a in m]

    def wait_for(self, assignment: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> int:
        """Index (in :meth:`assignments`) of the first ``assignment`` received."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.assignments()
            if assignment in got:
                return got.index(assignment)
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.02)
        pytest.fail(f"no {assignment} received; got {self.assignments()}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def _spawn(args: list[str], log: Path, env_extra: dict[str, str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **env_extra)
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "cxlkv.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        pytest.fail("the daemon did not stop within 20 s of SIGTERM")


def _check_order(got: list[str]) -> None:
    ready = got.index("READY=1")
    stopping = got.index("STOPPING=1")
    assert ready < stopping, got
    assert got.count("READY=1") == 1, got
    assert any(a.startswith("STATUS=") for a in got[:ready]), got  # progress before READY
    assert any(a == "WATCHDOG=1" for a in got), got
    assert all(a.split("=", 1)[0] in {"READY", "STATUS", "STOPPING", "WATCHDOG", "EXTEND_TIMEOUT_USEC"}
               for a in got), got


def test_master_notifies_systemd(tmp_path: Path) -> None:
    listener = NotifyListener(tmp_path / "notify.sock")
    address_file = tmp_path / "master.address"
    conf = tmp_path / "master.toml"
    conf.write_text(tomli_w.dumps({
        "listen_address": "127.0.0.1:0", "address_file": str(address_file),
        "metrics_address": "127.0.0.1:0",
        "segments": [{"name": "cxl0", "size_bytes": 64 * MiB}],
    }))
    proc = _spawn(["master", "--config", str(conf)], tmp_path / "master.log",
                  {"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "200000"})
    try:
        listener.wait_for("READY=1", proc=proc)
        # READY=1 comes only once the gRPC port is bound and serving
        host, port = address_file.read_text().strip().rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        status = [a for a in listener.assignments() if a.startswith("STATUS=serving on")]
        assert status and f"{host}:{port}" in status[0], listener.assignments()
        deadline = time.monotonic() + 10
        while listener.assignments().count("WATCHDOG=1") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # every 0.1 s: half of WATCHDOG_USEC
        assert listener.assignments().count("WATCHDOG=1") >= 3
    finally:
        rc = _stop(proc)
        listener.close()
    assert rc == 0, (tmp_path / "master.log").read_text()
    _check_order(listener.assignments())


def test_clientd_notifies_systemd(make_cluster, tmp_path: Path) -> None:
    cl = make_cluster(clientds=0)
    listener = NotifyListener(tmp_path / "notify.sock")
    sock = tmp_path / "cd.sock"
    conf = tmp_path / "clientd.toml"
    conf.write_text(tomli_w.dumps({
        "name": "notify-test", "master_address": cl.master_address, "socket_path": str(sock),
        "metrics_address": "127.0.0.1:0",
        "regions": [{"segment": "cxl0", "path": cl.region_paths[0]}],
    }))
    proc = _spawn(["clientd", "--config", str(conf)], tmp_path / "clientd.log",
                  {"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "200000"})
    try:
        listener.wait_for("READY=1", proc=proc)
        # READY=1 comes once the region is mapped, both sockets serve and the master accepted us
        from cxlkv import Client

        with Client(str(sock)) as c:
            c.put("notify/k", b"v")
            st = c.stat()
        assert st["client_id"] and st["master_connected"]
        ready_status = [a for a in listener.assignments() if a.startswith("STATUS=serving on")]
        assert ready_status and str(sock) in ready_status[0] and st["metrics_url"] in ready_status[0]
        with urllib.request.urlopen(st["metrics_url"], timeout=5) as r:
            assert b"cxlkv_build_info" in r.read()
        got = listener.assignments()
        assert "STATUS=mapping regions" in got[:got.index("READY=1")]
        deadline = time.monotonic() + 10
        while listener.assignments().count("WATCHDOG=1") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rc = _stop(proc)
        listener.close()
    assert rc == 0, (tmp_path / "clientd.log").read_text()
    _check_order(listener.assignments())
    assert not sock.exists()


def test_notifier_protocol_details(tmp_path: Path) -> None:
    # outside systemd: a no-op
    quiet = Notifier.from_env({})
    assert not quiet.enabled and quiet.watchdog_interval_s is None and quiet.ready("x") is False
    # WATCHDOG_PID naming another process disables the watchdog (sd_watchdog_enabled(3))
    other = Notifier.from_env({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s is None
    mine = Notifier.from_env({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval_s == 1.5
    assert Notifier.from_env({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "junk"}).watchdog_interval_s is None
    # abstract-namespace socket ("@name"), one datagram per call, newlines in values flattened
    name = f"cxlkv-test-{os.getpid()}-{time.monotonic_ns()}"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind("\0" + name)
    rx.settimeout(5)
    try:
        n = Notifier("@" + name)
        assert n.ready("line one\nline two")
        assert rx.recv(4096) == b"READY=1\nSTATUS=line one line two"
        assert n.stopping()
        assert rx.recv(4096) == b"STOPPING=1"
        n.close()
    finally:
        rx.close()
    # a socket nobody listens on: logged once, never raised
    gone = Notifier(str(tmp_path / "nobody.sock"))
    assert gone.status("x") is False and gone.status("y") is False


def _verify(unit: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    # ExecStart must name an existing executable for `verify`: point it at this checkout's.
    exe = shutil.which("cxlkv", path=str(Path(sys.executable).parent)) or sys.executable
    text = unit.read_text().replace("/opt/cxlkv/venv/bin/cxlkv", exe)
    copy = tmp_path / unit.name
    copy.write_text(text)
    return subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit", ["cxlkv-master.service", "cxlkv-clientd.service"])
def test_units_pass_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    r = _verify(UNITS / unit, tmp_path)
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if unit in line]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr


def test_units_ask_for_notify_watchdog_and_keep_dax_usable() -> None:
    for name in ("cxlkv-master.service", "cxlkv-clientd.service"):
        lines = {ln.strip() for ln in (UNITS / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")}
        for want in ("Type=notify", "NotifyAccess=main", "Restart=on-failure", "RestartPreventExitStatus=2",
                     "NoNewPrivileges=yes", "ProtectSystem=strict"):
            assert want in lines, (name, want)
        assert any(ln.startswith("WatchdogSec=") for ln in lines), name
        assert not any(ln.startswith("PrivateDevices=") for ln in lines), name  # would hide /dev/dax*, /dev/shm
        assert not any(ln.startswith(("InaccessiblePaths=", "TemporaryFileSystem=")) and "/dev" in ln for ln in lines)
    clientd = (UNITS / "cxlkv-clientd.service").read_text()
    assert "RuntimeDirectory=cxlkv" in clientd
    assert "DeviceAllow=char-dax rw" in clientd


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit", ["cxlkv-master.service", "cxlkv-clientd.service"])
def test_units_score_at_most_2_in_systemd_analyze_security(unit: str, tmp_path: Path) -> None:
    import re

    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(UNITS / unit)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 2.0, r.stdout
    said = re.search(r"systemd-analyze security \S+`: (\d+\.\d+)", (UNITS / unit).read_text())
    assert said and said.group(1) == m.group(1), "the unit's comment states its score"


def test_units_reload_extend_and_give_the_master_dax() -> None:
    for name in ("cxlkv-master.service", "cxlkv-clientd.service"):
        lines = {ln.strip() for ln in (UNITS / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")}
        for want in ("ExecReload=/bin/kill -HUP $MAINPID", "MemoryDenyWriteExecute=yes", "PrivateMounts=yes",
                     "SystemCallFilter=@system-service", "DevicePolicy=closed", "DeviceAllow=char-dax rw"):
            assert want in lines, (name, want)
        assert "RemoveIPC=yes" not in lines  # it would wipe emulated regions in /dev/shm (group cxlkv)
    clientd = [ln for ln in (UNITS / "cxlkv-clientd.service").read_text().splitlines() if not ln.startswith("#")]
    assert "StateDirectory=cxlkv" in clientd  # a writable home for the SSD tier file
    assert not any(ln.startswith(("ProtectProc=", "PrivateUsers=")) for ln in clientd)  # it checks other users' processes


def test_master_reloads_on_sighup_and_extends_its_start(tmp_path: Path) -> None:
    """SIGHUP (ExecReload): RELOADING=1 with MONOTONIC_USEC, the file read again,
    log_level applied, a key needing a restart named, READY=1; a start sends
    EXTEND_TIMEOUT_USEC before READY=1; a file that no longer loads leaves it running."""
    listener = NotifyListener(tmp_path / "notify.sock")
    address_file = tmp_path / "master.address"
    conf = tmp_path / "master.toml"
    base = {"listen_address": "127.0.0.1:0", "address_file": str(address_file), "log_level": "info",
            "segments": [{"name": "cxl0", "size_bytes": 64 * MiB}]}
    conf.write_text(tomli_w.dumps(base))
    log = tmp_path / "master.log"
    proc = _spawn(["master", "--config", str(conf)], log, {"NOTIFY_SOCKET": str(listener.path)})
    try:
        ready = listener.wait_for("READY=1", proc=proc)
        got = listener.assignments()
        assert any(a.startswith("EXTEND_TIMEOUT_USEC=") for a in got[:ready]), got
        conf.write_text(tomli_w.dumps({**base, "log_level": "debug", "lease_ttl_s": 9}))
        n = len(got)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "READY=1" not in listener.assignments()[n:] and time.monotonic() < deadline:
            time.sleep(0.05)
        after = listener.assignments()[n:]
        assert after[0] == "RELOADING=1" and after[1].startswith("MONOTONIC_USEC="), after
        assert "READY=1" in after, after
        status = [a for a in after if a.startswith("STATUS=master: configuration reloaded")]
        assert status and "log_level info → debug" in status[0] and "needs a restart: lease_ttl_s" in status[0]
        conf.write_text("lease_ttl_s = [\n")  # broken TOML: the running master keeps its settings
        n = len(listener.assignments())
        proc.send_signal(signal.SIGHUP)
        listener.wait_for("RELOADING=1", proc=proc)
        deadline = time.monotonic() + 20
        while "READY=1" not in listener.assignments()[n:] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(a.startswith("STATUS=reload failed, running on unchanged") for a in listener.assignments()[n:])
        host, port = address_file.read_text().strip().rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()  # still serving
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.close()
    text = log.read_text()
    assert "Traceback" not in text and "configuration reloaded" in text


MDWE_WRAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN (Linux >= 6.3)
    sys.exit(77)
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_daemons_run_with_memory_deny_write_execute(tmp_path: Path) -> None:
    """MemoryDenyWriteExecute=yes in the units: the master, the clientds and the
    SDK (cffi transport, grpcio, numpy, uvloop) work when no writable mapping may
    become executable — PR_SET_MDWE, the kernel's form of the same rule, inherited
    by every process the replay starts."""
    exe = shutil.which("cxlkv", path=str(Path(sys.executable).parent))
    assert exe is not None
    trace = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
    if not trace.exists():
        pytest.skip("shared trace not present")
    r = subprocess.run([sys.executable, "-c", MDWE_WRAPPER, exe, "replay", str(trace), "--embedded", "--json",
                        "--limit", "200", "--workers", "2", "--block-bytes", "16KiB"],
                       capture_output=True, text=True, timeout=240)
    if r.returncode == 77:
        pytest.skip("the kernel has no PR_SET_MDWE")
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    rec = json.loads(r.stdout)
    assert rec["errors"] == 0 and rec["verified_blocks"] > 0, rec
