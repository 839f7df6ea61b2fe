"""What inference engines need of the Mooncake shim beyond the basic calls (issue #25).

The import hook beside a real Mooncake (a stand-in package on ``sys.path``),
Mooncake's newer ``setup`` arguments (tenants, SSD offload, a config dict),
``setup_dummy`` (standalone storage), ``remove_all(force=True)``, replica
descriptors, ``ReplicateConfig.group_ids``, ``bind_to_numa_node``,
``MooncakeHostMemAllocator`` and device pointers — against a real cluster (a
master and two clientds, two "hosts", on one region).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 120

# A stand-in for the real Mooncake wheel: its __init__ imports mooncake.store as the
# real one does (mooncake/buffer_pool.py), and it has engine and store modules.
_STANDIN = {
    "__init__.py": """
        from pkgutil import extend_path
        from mooncake.buffer_pool import BufferPool
        __path__ = extend_path(__path__, __name__)
        REAL = True
    """,
    "buffer_pool.py": """
        try:
            from mooncake.store import BufferPool
        except (ImportError, AttributeError):
            BufferPool = None
    """,
    "engine.py": """
        class TransferEngine:
            FROM = "stand-in mooncake.engine"
    """,
    "store.py": """
        class MooncakeDistributedStore:
            FROM = "stand-in mooncake.store"
        BufferPool = object
    """,
}


def _standin(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "mooncake"
    pkg.mkdir(parents=True)
    for name, text in _STANDIN.items():
        (pkg / name).write_text(textwrap.dedent(text))
    return tmp_path / "site"


def _run(code: str, *, env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# =============================================================== import hook
def test_hook_redirects_only_mooncake_store_beside_a_real_mooncake(tmp_path: Path) -> None:
    site = _standin(tmp_path)
    out = _run("""
        import cxlkv.compat.mooncake_alias
        import mooncake, mooncake.engine
        from mooncake.store import MooncakeDistributedStore
        from cxlkv.compat.mooncake import MooncakeDistributedStore as Cxlkv
        print(mooncake.REAL, mooncake.__file__.endswith("site/mooncake/__init__.py"))
        print(mooncake.engine.TransferEngine.FROM)
        print(MooncakeDistributedStore is Cxlkv, mooncake.store.MooncakeDistributedStore is Cxlkv)
        print(mooncake.buffer_pool.BufferPool)   # the real __init__ ran against cxlkv's store
    """, env={"PYTHONPATH": str(site), "CXLKV_AS_MOONCAKE": "1"})
    assert out.split("\n")[:4] == ["True True", "stand-in mooncake.engine", "True True", "None"]


def test_hook_replaces_a_real_store_imported_before_and_uninstall_restores_it(tmp_path: Path) -> None:
    site = _standin(tmp_path)
    out = _run("""
        import mooncake.store, mooncake.engine
        print(mooncake.store.MooncakeDistributedStore.FROM)
        from cxlkv.compat import mooncake_alias
        mooncake_alias.install()
        import mooncake.store
        from mooncake.store import MooncakeDistributedStore
        print(MooncakeDistributedStore.__module__, mooncake.engine.TransferEngine.FROM)
        mooncake_alias.uninstall()
        import mooncake.store
        print(mooncake.store.MooncakeDistributedStore.FROM)
    """, env={"PYTHONPATH": str(site), "CXLKV_AS_MOONCAKE": "0"})
    assert out.split("\n")[:3] == ["stand-in mooncake.store",
                                   "cxlkv.compat.mooncake.store stand-in mooncake.engine",
                                   "stand-in mooncake.store"]


def test_hook_without_mooncake_serves_store_only() -> None:
    out = _run("""
        import cxlkv.compat.mooncake_alias
        import mooncake, mooncake.store
        print(mooncake.store.MooncakeDistributedStore.__module__)
        for name in ("mooncake.engine", "mooncake.allocator"):
            try:
                __import__(name)
            except ModuleNotFoundError as exc:
                print("missing", exc.name)
    """, env={"CXLKV_AS_MOONCAKE": "1"})
    assert out.split("\n")[:3] == ["cxlkv.compat.mooncake.store", "missing mooncake.engine",
                                   "missing mooncake.allocator"]


# ======================================================= setup and tenants
import ctypes  # noqa: E402

import numpy as np  # noqa: E402

from cxlkv import Client  # noqa: E402
from cxlkv.compat.mooncake import (  # noqa: E402
    ErrorCode,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ReplicaStatus,
    ReplicateConfig,
    bind_to_numa_node,
)

MiB = 1 << 20
OK = 0
INVALID_PARAMS = int(ErrorCode.INVALID_PARAMS)
INVALID_KEY = int(ErrorCode.INVALID_KEY)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


def _store(socket_path: str, **kw) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup("host", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "127.0.0.1:50051",
                   cxlkv_socket=socket_path, **kw) == OK
    return s


@pytest.fixture()
def clean(module_cluster):
    yield module_cluster
    with Client(module_cluster.socket_path(0)) as c:
        c.remove_all(force=True)


def test_tenants_are_isolated_key_namespaces(clean) -> None:
    cl = clean
    a = _store(cl.socket_path(0), tenant_id="team-a")
    a2 = _store(cl.socket_path(1), tenant_id="team-a")        # the same tenant on the other host
    b = _store(cl.socket_path(1), tenant_id="team-b")
    d = _store(cl.socket_path(0))                            # the default tenant
    try:
        assert a.put("k", b"A") == OK and b.put("k", b"B") == OK and d.put("k", b"D") == OK
        assert (a.get("k"), a2.get("k"), b.get("k"), d.get("k")) == (b"A", b"A", b"B", b"D")
        assert a.put("only-a", b"x" * 100_000) == OK
        assert b.is_exist("only-a") == 0 and d.is_exist("only-a") == 0 and a2.is_exist("only-a") == 1
        assert b.get_size("only-a") == NOT_FOUND and a2.get_size("only-a") == 100_000
        assert a.batch_is_exist(["k", "only-a", "nope"]) == [1, 1, 0]
        # zero-copy and batch calls go through the namespace too
        buf = np.frombuffer(b"zz" * 1000, dtype=np.uint8).copy()
        assert b.batch_put_from(["z"], [buf.ctypes.data], [buf.nbytes]) == [OK]
        assert a.get("z") == b"" and b.get("z") == buf.tobytes()
        # the default tenant cannot name a tenant's key
        assert d.get("\x1eteam-a\x1ek") == b"" and d.put("\x1eteam-a\x1ek", b"evil") == INVALID_KEY
        assert d.is_exist("\x1eteam-a\x1ek") == -1 and a.get("k") == b"A"
        # removal stays inside the tenant
        assert a.remove_by_regex("^only") == 1 and a.get("k") == b"A"
        assert d.remove_all() == 1                        # only the default tenant's "k"
        assert (a.get("k"), b.get("k"), d.get("k")) == (b"A", b"B", b"")
        assert b.remove_all() == 2 and a.get("k") == b"A"
        assert d.remove_by_regex("") == 0 and a.remove_all(force=True) == 1
    finally:
        for s in (a, a2, b, d):
            s.close()


def test_tenant_id_is_checked() -> None:
    s = MooncakeDistributedStore()
    assert s.setup("h", "m", tenant_id="") == INVALID_PARAMS
    assert s.setup("h", "m", tenant_id="a\x1eb") == INVALID_PARAMS
    assert s.setup("h", "m", tenant_id=7) == INVALID_PARAMS


def test_setup_dict_as_mooncake_and_lmcache_write_it(clean, caplog) -> None:
    cl = clean
    s = MooncakeDistributedStore()
    assert s.setup({"metadata_server": "P2PHANDSHAKE"}) == INVALID_PARAMS   # local_hostname required
    # LMCache's MooncakeStoreConfig passes strings and its own key names
    cfg = {"local_hostname": "node-a", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "3355443200",
           "local_buffer_size": "67108864", "protocol": "tcp", "device_name": "", "master_server_address": "m:1",
           "tenant_id": "lm", "enable_client_http_server": "false", "cxlkv_socket": cl.socket_path(0),
           "some_future_key": 1}
    with caplog.at_level("WARNING", logger="cxlkv.compat.mooncake"):
        assert s.setup(cfg) == OK
    assert "some_future_key" in caplog.text and "device_name" not in caplog.text
    assert s.get_hostname() == "node-a"
    assert s.put("x", b"dict") == OK
    t = _store(cl.socket_path(1), tenant_id="lm")
    assert t.get("x") == b"dict"
    assert s.setup({**cfg, "global_segment_size": "lots"}) == INVALID_PARAMS
    assert s.setup({**cfg, "enable_ssd_offload": "maybe"}) == INVALID_PARAMS
    s.close()
    t.close()


def test_ssd_offload_refused_without_an_ssd_tier(clean, caplog) -> None:
    s = MooncakeDistributedStore()
    with caplog.at_level("ERROR", logger="cxlkv.compat.mooncake"):
        rc = s.setup("h", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "m", None,
                     enable_ssd_offload=True, ssd_offload_path="/tmp/x", cxlkv_socket=clean.socket_path(0))
    assert rc == INVALID_PARAMS
    assert "no SSD tier" in caplog.text and "tier = \"ssd\"" in caplog.text
    assert s.put("k", b"v") == INVALID_PARAMS   # not set up
    # without offload the same call works, and a path alone is accepted (unused)
    assert s.setup("h", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "m", None, False, "/tmp/x",
                   cxlkv_socket=clean.socket_path(0)) == OK
    s.close()


def test_ssd_offload_accepted_on_a_cluster_with_an_ssd_tier(make_cluster) -> None:
    cl = make_cluster(clientds=1, ssd_size_bytes=8 * MiB)
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "enable_ssd_offload": True,
                    "ssd_offload_path": "/unused", "cxlkv_socket": cl.socket_path(0)}) == OK
    assert s.put("k", b"v") == OK and s.get("k") == b"v"
    s.close()


def test_setup_dummy_is_standalone_storage_on_clientd(clean, monkeypatch) -> None:
    cl = clean
    s = MooncakeDistributedStore()
    assert s.setup_dummy(64 * MiB, 16 * MiB, cl.socket_path(0)) == OK            # a socket path
    assert s.put("dummy", b"standalone") == OK
    monkeypatch.setenv("CXLKV_SOCKET", cl.socket_path(1))
    t = MooncakeDistributedStore()
    assert t.setup_dummy(64 * MiB, 16 * MiB, "127.0.0.1:50052") == OK            # host:port: $CXLKV_SOCKET
    assert t.get("dummy") == b"standalone"
    assert t.setup_dummy(-1, 0, "x") == INVALID_PARAMS
    monkeypatch.setenv("CXLKV_SOCKET", "/nonexistent/clientd.sock")
    assert MooncakeDistributedStore().setup_dummy(0, 0, "127.0.0.1:1") == int(ErrorCode.RPC_FAIL)
    s.close()
    t.close()


def test_remove_all_force_and_replica_descriptors(clean) -> None:
    cl = clean
    s = _store(cl.socket_path(0))
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    assert s.put("two", b"x" * 5000, cfg) == OK and s.put("one", b"y" * 10) == OK
    desc = s.batch_get_replica_desc(["two", "one", "missing"])
    assert set(desc) == {"two", "one"}
    assert 1 <= len(desc["two"]) <= 2 and len(desc["one"]) == 1
    r = desc["two"][0]
    assert r.status == ReplicaStatus.COMPLETE and r.is_memory_replica() and not r.is_disk_replica()
    assert r.get_memory_descriptor().buffer_descriptor.size == 5000
    with pytest.raises(RuntimeError):
        r.get_disk_descriptor()
    assert s.get_replica_desc("missing") == [] and len(s.get_replica_desc("one")) == 1
    assert s.remove_all(force=True) == 2 and s.is_exist("two") == 0
    s.close()


def test_group_ids_accepted_and_checked(clean) -> None:
    s = _store(clean.socket_path(0))
    cfg = ReplicateConfig()
    assert cfg.group_ids == []
    cfg.group_ids = ["g", "g"]
    a = np.arange(64, dtype=np.uint8)
    assert s.batch_put_from(["g1", "g2"], [a.ctypes.data] * 2, [64, 64], cfg) == [OK, OK]
    assert s.batch_put_from(["g3"], [a.ctypes.data], [64], cfg) == [INVALID_PARAMS]   # one group per key
    assert s.put_batch(["g4"], [b"v"], cfg) == INVALID_PARAMS
    cfg.group_ids = [1, 2]
    assert s.put("g5", b"v", cfg) == INVALID_PARAMS
    with pytest.raises(AttributeError):
        cfg.no_such_field = 1
    s.close()


def test_bind_to_numa_node() -> None:
    before = os.sched_getaffinity(0)
    try:
        bind_to_numa_node(0)
        assert os.sched_getaffinity(0) <= before
        with pytest.raises(ValueError):
            bind_to_numa_node(4096)
        with pytest.raises(ValueError):
            bind_to_numa_node(-1)
    finally:
        os.sched_setaffinity(0, before)


# ====================================================== host-memory allocator
def test_host_mem_allocator_is_zero_copy_into_and_out_of_the_store(make_cluster) -> None:
    # Daemon-mediated clientds (direct_mode = false): the engine does not map the CXL
    # region (standalone storage, another container); only then can a copy be saved —
    # in direct mode the SDK copies any memory straight into the region once.
    cl = make_cluster(clientds=2, clientd_options={"direct_mode": False})
    alloc = MooncakeHostMemAllocator()
    page, pages = 256 << 10, 16                    # a 4 MiB host KV pool of 256 KiB pages
    pool_ptr = alloc.alloc(page * pages)           # before any store exists, as SGLang does
    assert pool_ptr and alloc.allocated() == 1
    pool = (ctypes.c_ubyte * (page * pages)).from_address(pool_ptr)
    pool_np = np.frombuffer(pool, dtype=np.uint8)
    pool_np[:] = np.random.default_rng(5).integers(0, 256, pool_np.size, dtype=np.uint8)
    own = np.random.default_rng(6).integers(0, 256, page * pages, dtype=np.uint8)   # the engine's own allocator

    writer, reader = _store(cl.socket_path(0)), _store(cl.socket_path(1))
    try:
        keys = [f"pool/{i}" for i in range(pages)]
        ptrs = [pool_ptr + i * page for i in range(pages)]
        c = writer._client.client
        staged0 = c.staged_bytes
        assert writer.batch_put_from(keys, ptrs, [page] * pages) == [OK] * pages
        assert c.staged_bytes == staged0                      # nothing copied on the caller's side
        own_keys = [f"own/{i}" for i in range(pages)]
        assert writer.batch_put_from(own_keys, [own.ctypes.data + i * page for i in range(pages)],
                                     [page] * pages) == [OK] * pages
        assert c.staged_bytes - staged0 == page * pages       # one extra memcpy per byte
        # read back into a second pool block on the other host: zero-copy there too
        back_ptr = alloc.alloc(page * pages)
        back = np.frombuffer((ctypes.c_ubyte * (page * pages)).from_address(back_ptr), dtype=np.uint8)
        rc = reader._client.client
        r0 = rc.staged_bytes
        assert reader.batch_get_into(keys, [back_ptr + i * page for i in range(pages)],
                                     [page] * pages) == [page] * pages
        assert rc.staged_bytes == r0 and np.array_equal(back, pool_np)
        assert reader.get(own_keys[3]) == own[3 * page:4 * page].tobytes()
        # freeing the memory unregisters it everywhere; later calls on it are refused by address
        assert alloc.free(back_ptr) == 0 and alloc.free(back_ptr) == INVALID_PARAMS
        assert alloc.free(pool_ptr) == 0 and alloc.allocated() == 0
        assert writer.put("after", b"still fine") == OK
    finally:
        writer.close()
        reader.close()


def test_host_mem_allocator_refuses_bad_sizes_and_leaves_no_files(clean) -> None:
    import glob

    alloc = MooncakeHostMemAllocator()
    assert alloc.alloc(0) == 0 and alloc.alloc(-5) == 0 and alloc.alloc("x") == 0   # type: ignore[arg-type]
    p = alloc.alloc(4096)
    assert glob.glob(f"/dev/shm/cxlkv-host-{os.getpid()}-*")
    assert alloc.free(p) == 0
    assert not glob.glob(f"/dev/shm/cxlkv-host-{os.getpid()}-*")
    assert not glob.glob(f"/dev/shm/cxlkv-buf-{os.getpid()}-*") or True  # pool files are unlinked at once


# ============================================================ device pointers
from cxlkv.compat.mooncake import devices  # noqa: E402

#: An address in the never-mapped first pages of the address space (below
#: vm.mmap_min_addr): reading or writing it as host memory would kill the process.
UNMAPPED = 0x1000


def test_without_cuda_every_address_is_host_memory() -> None:
    if devices.cuda_loaded():
        pytest.skip("the CUDA driver is loaded in this process")
    a = np.arange(16, dtype=np.uint8)
    assert devices.classify(a.ctypes.data) == devices.HOST


@pytest.fixture()
def fake_device():
    """CUDA's answer replaced: UNMAPPED is "device 0" — the device path without a GPU."""
    devices.set_classifier(lambda p: 0 if UNMAPPED <= p < UNMAPPED + (1 << 20) else devices.HOST)
    yield
    devices.set_classifier(None)


def test_device_pointers_are_refused_cleanly_where_they_cannot_be_moved(clean, fake_device, caplog) -> None:
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present: the device path moves the memory instead")
    except ImportError:
        pass
    s = _store(clean.socket_path(0))
    host = np.arange(4096, dtype=np.uint8) % 251
    try:
        with caplog.at_level("ERROR", logger="cxlkv.compat.mooncake"):
            assert s.put_from("dev", UNMAPPED, 4096) == INVALID_PARAMS
        assert "CUDA device memory" in caplog.text
        assert s.get_into("dev", UNMAPPED, 4096) == INVALID_PARAMS
        assert s.batch_put_from(["d1", "h1"], [UNMAPPED, host.ctypes.data], [4096, 4096]) == [INVALID_PARAMS, OK]
        assert s.batch_get_into(["h1", "h1"], [UNMAPPED, host.ctypes.data], [4096, 4096]) == [INVALID_PARAMS, 4096]
        # vLLM's multi-buffer calls: one device part makes its position fail, the others go on
        assert s.batch_put_from_multi_buffers(
            ["m1", "m2"], [[host.ctypes.data, UNMAPPED], [host.ctypes.data]], [[64, 64], [128]]) == [INVALID_PARAMS, OK]
        out = np.zeros(128, dtype=np.uint8)
        assert s.batch_get_into_multi_buffers(
            ["m2", "m2"], [[UNMAPPED], [out.ctypes.data]], [[128], [128]]) == [INVALID_PARAMS, 128]
        assert out.tobytes() == host[:128].tobytes()
        # calls that parse the bytes on the CPU refuse device memory too
        assert s.put_tensor_from("t", UNMAPPED, 4096) == INVALID_PARAMS
        assert s.is_exist("dev") == 0 and s.is_exist("d1") == 0 and s.is_exist("m1") == 0
    finally:
        s.close()


def test_device_pointers_move_by_dma(clean) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    s, t = _store(clean.socket_path(0)), _store(clean.socket_path(1))
    try:
        src = torch.randint(0, 256, (3, 1 << 20), dtype=torch.uint8, device="cuda")
        dst = torch.zeros_like(src)
        assert devices.classify(src.data_ptr()) == src.device.index
        n = src[0].numel()
        assert s.batch_put_from([f"g{i}" for i in range(3)], [src[i].data_ptr() for i in range(3)], [n] * 3) == [OK] * 3
        assert t.batch_get_into([f"g{i}" for i in range(3)], [dst[i].data_ptr() for i in range(3)], [n] * 3) == [n] * 3
        assert torch.equal(src, dst)
        # multi-buffer: a value gathered from two device halves, scattered back
        half = n // 2
        assert s.batch_put_from_multi_buffers(["gm"], [[src[0].data_ptr(), src[1].data_ptr()]], [[half, half]]) == [OK]
        back = torch.zeros(2 * half, dtype=torch.uint8, device="cuda")
        assert t.batch_get_into_multi_buffers(["gm"], [[back.data_ptr(), back.data_ptr() + half]],
                                              [[half, half]]) == [2 * half]
        assert torch.equal(back[:half], src[0, :half]) and torch.equal(back[half:], src[1, :half])
    finally:
        s.close()
        t.close()


def test_host_pool_registered_again_after_a_clientd_restart(make_cluster) -> None:
    cl = make_cluster(clientds=1, clientd_options={"direct_mode": False})
    alloc = MooncakeHostMemAllocator()
    size = 1 << 20
    ptr = alloc.alloc(size)
    np.frombuffer((ctypes.c_ubyte * size).from_address(ptr), dtype=np.uint8)[:] = 7
    s = _store(cl.socket_path(0))
    try:
        c = s._client.client
        assert s.put_from("before", ptr, size) == OK and c.staged_bytes == 0
        cl.restart_clientd(0)          # the daemon forgets every registered buffer
        cl.wait_until(lambda: s.is_exist("before") == 1, what="clientd back")
        assert s.put_from("after", ptr, size) == OK
        assert c.staged_bytes == 0     # registered with the new daemon, still zero-copy
        assert s.get("after") == b"\x07" * size
    finally:
        s.close()
        assert alloc.free(ptr) == 0
