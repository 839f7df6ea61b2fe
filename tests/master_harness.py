"""Test harness for the master: a real ``cxlkv master`` subprocess over real gRPC.

``MasterProcess`` writes a TOML config, starts ``python -m cxlkv.cli master
--listen 127.0.0.1:0 --address-file …`` as a :class:`~cxlkv.deploy.cluster.ManagedProcess`
(the one process harness the cluster fixtures use too), waits for the address file, and
stops with SIGTERM → SIGKILL (a master that had to be killed fails the test).
``assert_invariant`` checks the space accounting from outside (Stat, ListKeys,
GetReplicaList) and asks the master to verify it from scratch too. ``Writer`` and
``locate`` call the master's batch forms for one key, raising the position's error
as the single-key calls of a client would.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import grpc
import tomli_w

from cxlkv.deploy.cluster import ClusterError, ManagedProcess, wait_for_file
from cxlkv.clientd.master_link import Location, StartedPut, unpack_locations, unpack_put_starts
from cxlkv.errors import CxlkvError, error_for, from_rpc_error
from cxlkv.layout.region import REGION_HEADER_BYTES
from cxlkv.v1 import common_pb2, master_pb2, master_pb2_grpc

MiB = 1 << 20
KiB = 1 << 10


class MasterProcess:
    """One master subprocess.

    Args:
        tmp_path: directory for the config, address file and log.
        config: MasterConfig keys (TOML top level); ``segments`` defaults to one
            64 MiB segment ``cxl0``.
        env: extra environment variables.
    """

    def __init__(self, tmp_path: Path, config: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.dir = tmp_path
        cfg = {"segments": [{"name": "cxl0", "size_bytes": 64 * MiB}], "sweep_interval_s": 0.05}
        cfg.update(config or {})
        self.config = cfg
        self.config_path = tmp_path / "master.toml"
        self.address_file = tmp_path / "master.address"
        self.log_path = tmp_path / "master.log"
        self.env = dict(env or {})
        self.process: ManagedProcess | None = None
        self.address = ""
        self.channel: grpc.Channel | None = None
        self.stub: master_pb2_grpc.MasterServiceStub | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "cxlkv.cli", "master", "--config", str(self.config_path),
                "--listen", "127.0.0.1:0", "--address-file", str(self.address_file)]

    def start(self, timeout_s: float = 30.0) -> "MasterProcess":
        """Start and wait until serving.

        Raises:
            AssertionError: the master exited or did not write its address in time.
        """
        self.config_path.write_text(tomli_w.dumps(self.config))
        self.address_file.unlink(missing_ok=True)
        self.process = ManagedProcess("master", self.argv(), self.log_path, env=self.env)
        self.process.start()
        try:
            wait_for_file(self.address_file, timeout_s, self.process)
        except ClusterError as exc:
            raise AssertionError(f"{exc}\n{self.log()}") from None
        self.address = self.address_file.read_text().strip()
        self.channel = grpc.insecure_channel(self.address)
        self.stub = master_pb2_grpc.MasterServiceStub(self.channel)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``.

        Returns:
            The exit code.

        Raises:
            AssertionError: the master had to be killed.
        """
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.process is None:
            return 0
        rc, killed = self.process.stop(timeout_s)
        if killed:
            raise AssertionError(f"master ignored SIGTERM and was killed:\n{self.log()}")
        return rc or 0

    def __enter__(self) -> "MasterProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        rc = self.stop()
        if exc[0] is None:
            assert rc == 0, f"master exited with {rc}:\n{self.log()}"


def rpc_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CxlkvError:
    """Call a stub method (or a helper here) that must fail; return the cxlkv
    error it carried (a failed call's status, or a failed position's code)."""
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as exc:
        return from_rpc_error(exc)
    except CxlkvError as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '_method', fn)!r} succeeded, expected an error")


def check_items(resp: Any, keys: list[str] | None = None) -> None:
    """Raise the first failed position of an ``ItemResults`` (or any packed answer
    with ``codes`` / ``error_positions`` / ``messages``) as its cxlkv error."""
    if resp.error_positions:
        i = resp.error_positions[0]
        raise error_for(resp.codes[i], resp.messages[0], key=keys[i] if keys else None)


def locate(stub: master_pb2_grpc.MasterServiceStub, key: str, client_id: str = "",
           no_lease: bool = False) -> Location:
    """GetReplicaList of one key: its :class:`Location`, or its error raised."""
    (loc,) = unpack_locations(stub.GetReplicaList(master_pb2.GetReplicaListRequest(
        client_id=client_id, keys=[key], no_lease=no_lease)))
    if loc.status.code:
        raise error_for(loc.status.code, loc.status.message, key=key)
    return loc


def exists(stub: master_pb2_grpc.MasterServiceStub, key: str) -> bool:
    """ExistKey of one key (its INVALID_KEY raised)."""
    resp = stub.ExistKey(master_pb2.ExistKeyRequest(keys=[key]))
    if resp.results[0].code:
        raise error_for(resp.results[0].code, resp.results[0].message, key=key)
    return resp.exists[0]


def remove(stub: master_pb2_grpc.MasterServiceStub, key: str, force: bool = False) -> None:
    """Remove of one key (its error raised)."""
    st = stub.Remove(master_pb2.RemoveRequest(keys=[key], force=force)).results[0]
    if st.code:
        raise error_for(st.code, st.message, key=key)


class Writer:
    """A registered clientd stand-in: puts through the master."""

    def __init__(self, stub: master_pb2_grpc.MasterServiceStub, name: str = "w",
                 previous_client_id: str = "") -> None:
        self.stub = stub
        resp = stub.RegisterClient(master_pb2.RegisterClientRequest(
            hostname="test", name=name, pid=os.getpid(), previous_client_id=previous_client_id))
        self.client_id = resp.client_id
        self.epoch = resp.epoch
        self.segments = {s.name: s for s in resp.segments}

    def heartbeat(self) -> None:
        self.stub.Heartbeat(master_pb2.HeartbeatRequest(client_id=self.client_id, epoch=self.epoch))

    def start_many(self, keys: list[str], size: int, **options: Any) -> list[StartedPut]:
        """PutStart of ``keys`` (``size`` bytes each, the same options): one
        :class:`StartedPut` per key."""
        opts = common_pb2.PutOptions(**options)
        return unpack_put_starts(self.stub.PutStart(master_pb2.PutStartRequest(
            client_id=self.client_id, epoch=self.epoch, keys=keys, value_size_bytes=[size] * len(keys),
            options=[opts] * len(keys))))

    def start(self, key: str, size: int, **options: Any) -> StartedPut:
        """PutStart of one key; its error raised."""
        (res,) = self.start_many([key], size, **options)
        if res.status.code:
            raise error_for(res.status.code, res.status.message, key=key)
        return res

    def end(self, key: str, token: int, checksum: int = 0) -> None:
        """PutEnd of one key; its error raised."""
        check_items(self.stub.PutEnd(master_pb2.PutEndRequest(
            client_id=self.client_id, epoch=self.epoch, keys=[key], put_tokens=[token], checksums=[checksum])),
            [key])

    def revoke(self, key: str, token: int) -> None:
        """PutRevoke of one key; its error raised."""
        check_items(self.stub.PutRevoke(master_pb2.PutEndRequest(
            client_id=self.client_id, epoch=self.epoch, keys=[key], put_tokens=[token])), [key])

    def put(self, key: str, size: int, **options: Any) -> StartedPut:
        res = self.start(key, size, **options)
        self.end(key, res.put_token)
        return res

    def batch_put(self, keys: list[str], size: int, **options: Any) -> list[common_pb2.Status]:
        """PutStart + PutEnd of the successful ones; the start statuses."""
        started = self.start_many(keys, size, **options)
        ok = [(k, r.put_token) for k, r in zip(keys, started) if r.status.code == 0]
        if ok:
            done = self.stub.PutEnd(master_pb2.PutEndRequest(
                client_id=self.client_id, epoch=self.epoch, keys=[k for k, _ in ok], put_tokens=[t for _, t in ok]))
            assert not done.error_positions, done
        return [r.status for r in started]


def stat(stub: master_pb2_grpc.MasterServiceStub, check: bool = False) -> master_pb2.StatResponse:
    return stub.Stat(master_pb2.StatRequest(check_invariants=check))


def all_keys(stub: master_pb2_grpc.MasterServiceStub, prefix: str = "") -> list[master_pb2.KeyEntry]:
    out: list[master_pb2.KeyEntry] = []
    token = ""
    while True:
        page = stub.ListKeys(master_pb2.ListKeysRequest(prefix=prefix, page_size=5000, page_token=token))
        out.extend(page.entries)
        token = page.next_page_token
        if not token:
            return out


def assert_invariant(stub: master_pb2_grpc.MasterServiceStub) -> master_pb2.StatResponse:
    """The space-accounting invariant, checked from outside and by the master itself.

    * the master's own from-scratch check passes;
    * used == sum over mounted segments, used + free == capacity per segment
      (capacity = size − region header), used <= capacity;
    * key count == committed objects listed by ListKeys;
    * no two live extents of committed objects overlap, all inside
      ``[REGION_HEADER_BYTES, size_bytes)``;
    * used == sum of committed extents when no put is in flight and no lease
      lives (so no deferred free is pending); otherwise used >= that sum.
    """
    st = stat(stub, check=True)
    assert st.invariant_violation == "", st.invariant_violation
    mounted = {s.segment_id: s for s in st.segments if s.mounted}
    assert st.used_bytes == sum(s.used_bytes for s in mounted.values())
    assert st.capacity_bytes == sum(s.capacity_bytes for s in mounted.values())
    for s in mounted.values():
        assert s.capacity_bytes <= s.size_bytes - REGION_HEADER_BYTES
        assert 0 <= s.used_bytes <= s.capacity_bytes
    entries = all_keys(stub)
    assert len(entries) == st.key_count
    keys = [e.key for e in entries]
    assert keys == sorted(keys)
    extents: dict[int, list[tuple[int, int]]] = {sid: [] for sid in mounted}
    for i in range(0, len(keys), 2000):
        locs = unpack_locations(stub.GetReplicaList(master_pb2.GetReplicaListRequest(
            keys=keys[i:i + 2000], no_lease=True)))
        for loc in locs:
            assert loc.status.code == 0, loc.status
            for r in loc.replicas:
                extents[r.segment_id].append((r.offset_bytes, r.length_bytes))
    for sid, exts in extents.items():
        exts.sort()
        seg = mounted[sid]
        for (o1, n1), (o2, _) in zip(exts, exts[1:]):
            assert o1 + n1 <= o2, f"segment {seg.name}: extents ({o1},{n1}) and ({o2},..) overlap"
        for o, n in exts:
            assert REGION_HEADER_BYTES <= o and o + n <= seg.size_bytes
        committed = sum(n for _, n in exts)
        if (st.processing_count == 0 and st.lease_count == 0 and st.fenced_count == 0
                and st.quarantined_count == 0 and st.reserved_count == 0):
            assert seg.used_bytes == committed, (seg.name, seg.used_bytes, committed)
        else:
            assert seg.used_bytes >= committed
        assert seg.object_count >= len(exts)
    return st


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid``, bytes (``VmRSS`` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")
