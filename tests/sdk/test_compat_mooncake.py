"""Mooncake's Python store API on cxlkv (cxlkv.compat.mooncake), against a real cluster.

One cluster for the module: a master and two clientds (two "hosts") mapping one
64 MiB region. Store ``a`` talks to clientd 0, store ``b`` to clientd 1, so most
round trips cross hosts. Every test works under its own key prefix and removes
it afterwards.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cxlkv.compat.mooncake import (
    MOONCAKE_CODES,
    BufferHandle,
    ErrorCode,
    MooncakeDistributedStore,
    ReplicateConfig,
    SoftPinAction,
    mooncake_code,
)
from cxlkv.compat.mooncake import tensors
from cxlkv.compat.mooncake.config import put_options
from cxlkv.errors import ErrorCode as CxlkvCode
from cxlkv.errors import InvalidArgument, NotFound, error_for

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mooncake_app.py"
SUBPROCESS_TIMEOUT_S = 180

OK = 0
INVALID_PARAMS = int(ErrorCode.INVALID_PARAMS)
INVALID_KEY = int(ErrorCode.INVALID_KEY)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


def _payload(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _setup(store: MooncakeDistributedStore, socket_path: str) -> None:
    rc = store.setup("host", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "127.0.0.1:50051",
                     cxlkv_socket=socket_path, cxlkv_timeout_s=60.0)
    assert rc == OK


@pytest.fixture(scope="module")
def stores(module_cluster):
    a, b = MooncakeDistributedStore(), MooncakeDistributedStore()
    _setup(a, module_cluster.socket_path(0))
    _setup(b, module_cluster.socket_path(1))
    yield a, b
    assert a.close() == OK and b.close() == OK


@pytest.fixture()
def prefix(stores, request):
    name = re.sub(r"\W", "_", request.node.name)
    yield f"mc/{name}/"
    assert stores[0].remove_by_regex(f"^mc/{re.escape(name)}/") >= 0


# ==================================================================== setup
def test_setup_positional_keywords_and_env(module_cluster, monkeypatch) -> None:
    s = MooncakeDistributedStore()
    assert s.put("k", b"v") == INVALID_PARAMS          # before setup
    assert s.get("k") == b"" and s.is_exist("k") == -1 and s.get_buffer("k") is None
    assert s.batch_is_exist(["k"]) == [-1] and s.batch_put_from(["k"], [1], [1]) == [INVALID_PARAMS]
    monkeypatch.setenv("CXLKV_SOCKET", module_cluster.socket_path(0))
    assert s.setup(local_hostname="node-7", metadata_server="http://meta:8080/metadata",
                   global_segment_size=512 * MiB, local_buffer_size=0, protocol="rdma",
                   rdma_devices="mlx5_0,mlx5_1", master_server_addr="10.0.0.1:50051") == OK
    assert s.get_hostname() == "node-7"
    assert s.setup("node-8", "P2PHANDSHAKE") == OK     # Mooncake's defaults for the rest; reconnects
    assert s.get_hostname() == "node-8"
    assert s.is_exist("mc/setup/none") == 0
    assert s.close() == OK and s.close() == OK
    assert s.put("k", b"v") == INVALID_PARAMS          # after close


def test_setup_failures(tmp_path) -> None:
    s = MooncakeDistributedStore()
    assert s.setup("h", "m", cxlkv_socket=str(tmp_path / "nobody.sock")) == int(ErrorCode.RPC_FAIL)
    assert s.setup("h", "m", engine=object(), cxlkv_socket=str(tmp_path / "x")) == INVALID_PARAMS
    assert s.setup("h", "m", -1, cxlkv_socket=str(tmp_path / "x")) == INVALID_PARAMS
    assert s.setup("h", 7, cxlkv_socket=str(tmp_path / "x")) == INVALID_PARAMS  # type: ignore[arg-type]
    assert s.get_hostname() == ""


def test_calls_answer_codes_when_the_daemon_is_gone(make_cluster) -> None:
    cl = make_cluster(clientds=1)
    s = MooncakeDistributedStore()
    _setup(s, cl.socket_path(0))
    buf = ctypes.create_string_buffer(16)
    p = ctypes.addressof(buf)
    assert s.put("mc/gone/k", b"v") == OK
    cl.kill_clientd(0)
    rpc_fail = int(ErrorCode.RPC_FAIL)
    assert s.put("mc/gone/k2", b"v") == rpc_fail
    # Reads are memory operations on the region's index (docs/index.md): they go
    # on without the daemon; everything that changes the cluster needs it.
    assert s.get("mc/gone/k") == b"v" and s.get_batch(["mc/gone/k"]) == [b"v"]
    assert s.is_exist("mc/gone/k") == 1 and s.batch_is_exist(["mc/gone/k"]) == [1]
    assert s.get_into("mc/gone/k", p, 16) == 1 and buf.raw[:1] == b"v"
    assert s.batch_get_into(["mc/gone/k"], [p], [16]) == [1]
    assert s.get("mc/gone/never") == b"" and s.is_exist("mc/gone/never") == 0
    assert s.batch_put_from(["mc/gone/k3"], [p], [16]) == [rpc_fail]
    assert s.get_buffer("mc/gone/k") is None  # its memory is a buffer registered with the daemon
    (h,) = s.batch_get_buffer(["mc/gone/k"])     # read from the index into private memory
    assert h is not None and bytes(memoryview(h)) == b"v"
    assert s.get_size("mc/gone/k") == rpc_fail and s.remove("mc/gone/k") == rpc_fail
    assert s.remove_all() == -1 and s.batch_remove(["mc/gone/k"]) == [rpc_fail]
    assert s.close() == OK


def test_init_all_connects(module_cluster, monkeypatch) -> None:
    monkeypatch.setenv("CXLKV_SOCKET", module_cluster.socket_path(1))
    s = MooncakeDistributedStore()
    assert s.init_all("tcp", "") == OK
    assert s.get_hostname() != ""
    assert s.is_exist("mc/init_all/none") == 0
    assert s.close() == OK


# ============================================================== bytes API
@pytest.mark.parametrize("size", [0, 1, 100_000, 3 * MiB])
def test_put_get_across_hosts(stores, prefix, size: int) -> None:
    a, b = stores
    value = _payload(size, size)
    assert a.put(f"{prefix}k", value) == OK
    assert b.get(f"{prefix}k") == value
    assert b.is_exist(f"{prefix}k") == 1             # an empty value exists, and reads as b""
    assert b.get_size(f"{prefix}k") == size


def test_values_larger_than_16_mib(stores, prefix) -> None:
    a, b = stores                                    # both set up with a 16 MiB local buffer
    value = _payload(20 * MiB + 3, 20)
    assert a.put(f"{prefix}big", value) == OK
    assert b.get(f"{prefix}big") == value
    out = np.zeros(len(value), dtype=np.uint8)
    assert b.get_into(f"{prefix}big", out.ctypes.data, out.nbytes) == len(value)
    assert out.tobytes() == value


def test_objects_outlive_their_writer(module_cluster, stores, prefix) -> None:
    _, b = stores
    code = ("from cxlkv.compat.mooncake import MooncakeDistributedStore as S; s = S(); "
            "assert s.setup('w', 'm') == 0; "
            f"assert s.put({prefix + 'w'!r}, b'written by a process that is gone') == 0")
    env = dict(os.environ, CXLKV_SOCKET=module_cluster.socket_path(0))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=SUBPROCESS_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert b.get(f"{prefix}w") == b"written by a process that is gone"


def test_get_missing_and_invalid_keys(stores, prefix) -> None:
    a, _ = stores
    assert a.get(f"{prefix}absent") == b""
    assert a.get("") == b""
    assert a.get_batch([f"{prefix}absent", ""]) == [b"", b""]
    assert a.put("", b"v") == INVALID_KEY
    assert a.put("bad\x00key", b"v") == INVALID_KEY


def test_duplicate_put_returns_zero_and_keeps_first_value(stores, prefix) -> None:
    a, b = stores
    assert a.put(f"{prefix}k", b"first") == OK
    assert b.put(f"{prefix}k", b"second") == OK      # Mooncake: already exists counts as success
    assert a.get(f"{prefix}k") == b"first"
    assert b.put_from(f"{prefix}k", ctypes.addressof(ctypes.create_string_buffer(b"third")), 5) == OK
    assert b.get(f"{prefix}k") == b"first"
    assert b.upsert(f"{prefix}k", b"replaced") == OK
    assert a.get(f"{prefix}k") == b"replaced"


def test_is_exist_and_batch_is_exist(stores, prefix) -> None:
    a, b = stores
    assert a.put(f"{prefix}here", b"x") == OK
    assert b.is_exist(f"{prefix}here") == 1
    assert b.is_exist(f"{prefix}absent") == 0
    assert b.is_exist("") == -1
    assert b.batch_is_exist([f"{prefix}here", f"{prefix}absent", "", f"{prefix}here"]) == [1, 0, -1, 1]
    assert b.batch_is_exist([]) == []


def test_put_batch_get_batch(stores, prefix) -> None:
    a, b = stores
    keys = [f"{prefix}{i}" for i in range(20)]
    values = [_payload(i * 1000, i) for i in range(20)]
    assert a.put_batch(keys, values) == OK
    assert b.get_batch(keys + [f"{prefix}absent"]) == values + [b""]
    assert a.put_batch(keys[:2], [b"x", b"y"]) == OK   # already committed: success, not overwritten
    assert b.get_batch(keys[:2]) == values[:2]
    assert a.put_batch([], []) == OK


def test_batch_with_duplicate_keys_behaves_as_in_order(stores, prefix) -> None:
    a, b = stores
    assert a.put_batch([f"{prefix}d", f"{prefix}d"], [b"one", b"two"]) == OK
    assert b.get(f"{prefix}d") == b"one"
    assert a.upsert_batch([f"{prefix}u", f"{prefix}u"], [b"one", b"two"]) == OK
    assert b.get(f"{prefix}u") == b"two"


def test_put_batch_reports_the_first_failure(stores, prefix) -> None:
    a, b = stores
    assert a.put_batch([f"{prefix}ok", "", f"{prefix}ok2"], [b"1", b"2", b"3"]) == INVALID_KEY
    assert b.get_batch([f"{prefix}ok", f"{prefix}ok2"]) == [b"1", b"3"]  # one failure fails no other


def test_put_parts_and_upsert_parts(stores, prefix) -> None:
    a, b = stores
    assert a.put_parts(f"{prefix}small", b"Hello, ", bytearray(b"World"), memoryview(b"!")) == OK
    assert b.get(f"{prefix}small") == b"Hello, World!"
    big = [_payload(300_000, 1), np.arange(50_000, dtype=np.int32), _payload(5, 2)]
    assert a.put_parts(f"{prefix}big", *big) == OK
    assert b.get(f"{prefix}big") == big[0] + big[1].tobytes() + big[2]
    assert a.upsert_parts(f"{prefix}small", b"new ", b"value") == OK
    assert b.get(f"{prefix}small") == b"new value"
    assert a.put_parts(f"{prefix}bad", b"x", 17) == INVALID_PARAMS


# =========================================================== mismatches
def test_batch_calls_with_mismatched_lengths_fail_every_position(stores, prefix) -> None:
    a, _ = stores
    buf = ctypes.create_string_buffer(64)
    p = ctypes.addressof(buf)
    keys = [f"{prefix}{i}" for i in range(3)]
    assert a.batch_put_from(keys, [p, p], [8, 8, 8]) == [INVALID_PARAMS] * 3
    assert a.batch_put_from(keys, [p, p, p], [8]) == [INVALID_PARAMS] * 3
    assert a.batch_upsert_from(keys, [p], [8, 8, 8]) == [INVALID_PARAMS] * 3
    assert a.batch_get_into(keys, [p, p], [8, 8]) == [INVALID_PARAMS] * 3
    assert a.batch_get_into(keys[:1], [p, p], [8, 8]) == [INVALID_PARAMS]
    assert a.batch_put_tensor_from(keys, [p], [8]) == [INVALID_PARAMS] * 3
    assert a.batch_pub_tensor(keys, [np.zeros(2)]) == [INVALID_PARAMS] * 3
    assert a.put_batch(keys, [b"1"]) == INVALID_PARAMS
    assert a.upsert_batch(keys, [b"1"] * 4) == INVALID_PARAMS
    assert a.batch_is_exist(keys) == [0, 0, 0]        # nothing was written


# ============================================================== zero-copy
def test_zero_copy_on_plain_ctypes_memory(stores, prefix) -> None:
    a, b = stores
    data = _payload(200_000, 3)
    src = ctypes.create_string_buffer(data, len(data))
    dst = ctypes.create_string_buffer(len(data) + 100)
    assert a.register_buffer(ctypes.addressof(src), len(data)) == OK
    assert b.register_buffer(ctypes.addressof(dst), len(dst)) == OK
    assert a.put_from(f"{prefix}zc", ctypes.addressof(src), len(data)) == OK
    assert b.get_into(f"{prefix}zc", ctypes.addressof(dst), len(dst)) == len(data)
    assert dst.raw[:len(data)] == data and dst.raw[len(data):] == b"\x00" * 100
    assert b.get_into(f"{prefix}zc", ctypes.addressof(dst), len(data) - 1) == INVALID_PARAMS  # too small
    assert b.get_into(f"{prefix}absent", ctypes.addressof(dst), len(dst)) == NOT_FOUND
    assert a.unregister_buffer(ctypes.addressof(src)) == OK
    assert b.unregister_buffer(ctypes.addressof(dst)) == OK
    # registration is optional on cxlkv: unregistered memory works too (staged)
    small = ctypes.create_string_buffer(b"tiny value")
    assert a.put_from(f"{prefix}small", ctypes.addressof(small), 10) == OK
    out = (ctypes.c_char * 10)()
    assert b.get_into(f"{prefix}small", ctypes.addressof(out), 10) == 10 and out.raw == b"tiny value"


def test_bad_addresses_and_registrations(stores, prefix) -> None:
    a, _ = stores
    buf = ctypes.create_string_buffer(4096)
    p = ctypes.addressof(buf)
    assert a.put_from(f"{prefix}k", 0, 10) == INVALID_PARAMS
    assert a.put_from(f"{prefix}k", p, -1) == INVALID_PARAMS
    assert a.get_into(f"{prefix}k", 0, 10) == INVALID_PARAMS
    assert a.register_buffer(0, 10) == INVALID_PARAMS
    assert a.register_buffer(p, 0) == INVALID_PARAMS
    assert a.register_buffer(p, 4096) == OK
    assert a.register_buffer(p, 4096) == OK              # the same range again
    assert a.register_buffer(p + 100, 10) == INVALID_PARAMS  # overlaps
    assert a.unregister_buffer(p) == OK
    assert a.unregister_buffer(p) == INVALID_PARAMS


def test_batch_zero_copy_per_position(stores, prefix) -> None:
    a, b = stores
    block = 96 << 10
    page = ctypes.create_string_buffer(4 * block)
    base = ctypes.addressof(page)
    for i in range(4):
        ctypes.memset(base + i * block, 0x41 + i, block)
    keys = [f"{prefix}{i}" for i in range(4)]
    ptrs = [base + i * block for i in range(4)]
    assert a.batch_put_from(keys[:3] + [""], ptrs, [block] * 4) == [OK, OK, OK, INVALID_KEY]
    assert a.batch_put_from(keys[:2], [ptrs[0], 0], [block, block]) == [OK, INVALID_PARAMS]  # dup: kept
    out = ctypes.create_string_buffer(4 * block)
    obase = ctypes.addressof(out)
    got = b.batch_get_into([keys[0], f"{prefix}absent", keys[2], keys[1]],
                           [obase, obase + block, obase + 2 * block, 0], [block, block, block, block])
    assert got == [block, NOT_FOUND, block, INVALID_PARAMS]
    assert out.raw[:block] == b"A" * block and out.raw[2 * block:3 * block] == b"C" * block
    assert b.batch_upsert_from(keys[:1], [ptrs[3]], [block]) == [OK]
    assert a.get(keys[0]) == b"D" * block


def test_multi_buffer_batches(stores, prefix) -> None:
    a, b = stores
    src = [ctypes.create_string_buffer(_payload(n, n), n) for n in (10, 70_000, 5)]
    ptrs = [ctypes.addressof(x) for x in src]
    keys = [f"{prefix}m0", f"{prefix}m1", f"{prefix}m2"]
    assert a.batch_put_from_multi_buffers(keys, [ptrs, ptrs[:1], ptrs[:2]], [[10, 70_000, 5], [10], [10]]) == [
        OK, OK, INVALID_PARAMS]
    whole = b"".join(x.raw for x in src)
    assert b.get(keys[0]) == whole and b.get(keys[1]) == src[0].raw
    dst = [ctypes.create_string_buffer(n) for n in (50_000, 20_020, 100)]
    dptrs = [ctypes.addressof(x) for x in dst]
    got = b.batch_get_into_multi_buffers([keys[0], f"{prefix}absent", keys[1]],
                                         [dptrs[:2], dptrs[2:], [dptrs[2]]], [[50_000, 20_020], [100], [100]])
    assert got == [len(whole), NOT_FOUND, 10]
    assert dst[0].raw + dst[1].raw[:20_015] == whole and dst[2].raw[:10] == src[0].raw
    assert b.batch_get_into_multi_buffers([keys[0]], [dptrs[2:]], [[100]]) == [INVALID_PARAMS]  # too small
    assert a.batch_put_from_multi_buffers(keys, [ptrs], [[1]]) == [INVALID_PARAMS] * 3


def test_mem_pool_memory_is_zero_copy_and_other_memory_is_staged(stores, prefix, monkeypatch) -> None:
    a, b = stores
    size = 2 * MiB
    taken: list[int] = []
    for store in (a, b):
        pool = store._client._pool  # white box: count staging ranges taken from the SDK's pool
        real_alloc = pool.alloc
        monkeypatch.setattr(pool, "alloc", lambda n, _real=real_alloc: (taken.append(n), _real(n))[1])
    src = a.alloc_from_mem_pool(size)
    dst = b.alloc_from_mem_pool(size)
    assert src and dst and taken == [size, size]    # the two allocations themselves
    taken.clear()
    ctypes.memmove(src, _payload(size, 9), size)
    assert a.put_from(f"{prefix}pool", src, size) == OK
    assert b.get_into(f"{prefix}pool", dst, size) == size
    assert ctypes.string_at(dst, size) == _payload(size, 9)
    assert taken == []                               # zero-copy: no staging range
    plain = np.zeros(size, dtype=np.uint8)           # ordinary process memory
    assert b.get_into(f"{prefix}pool", plain.ctypes.data, size) == size
    assert plain.tobytes() == _payload(size, 9)
    # staged through one pool range (one extra memcpy) — or, in direct mode, copied
    # straight from the region by the SDK (no range at all)
    assert taken == ([] if b._client.direct else [size])
    assert a.free_to_mem_pool(src) == OK and b.free_to_mem_pool(dst) == OK
    assert a.free_to_mem_pool(src) == INVALID_PARAMS
    assert a.alloc_from_mem_pool(0) == 0


def test_get_buffer_and_batch_get_buffer(stores, prefix) -> None:
    a, b = stores
    small, large = _payload(1000, 4), _payload(3 * MiB + 5, 5)
    assert a.put(f"{prefix}small", small) == OK and a.put(f"{prefix}large", large) == OK
    for key, value in ((f"{prefix}small", small), (f"{prefix}large", large)):
        h = b.get_buffer(key)
        assert isinstance(h, BufferHandle)
        assert h.size() == len(h) == len(value)
        assert bytes(h) == value and ctypes.string_at(h.ptr(), h.size()) == value
        assert np.array(h, copy=False).tobytes() == value and memoryview(h).nbytes == len(value)
    h = b.get_buffer(f"{prefix}large")
    assert b.put_from(f"{prefix}copy", h.ptr(), h.size()) == OK   # a handle is shared memory
    assert a.get(f"{prefix}copy") == large
    assert b.get_buffer(f"{prefix}absent") is None
    handles = b.batch_get_buffer([f"{prefix}small", f"{prefix}absent", f"{prefix}large"])
    assert handles[1] is None
    assert bytes(handles[0]) == small and bytes(handles[2]) == large


def test_get_size(stores, prefix) -> None:
    a, b = stores
    assert a.put(f"{prefix}k", b"12345") == OK
    assert a.put(f"{prefix}k2", b"longer value") == OK  # same prefix, sorts after
    assert b.get_size(f"{prefix}k") == 5
    assert b.get_size(f"{prefix}absent") == NOT_FOUND
    assert b.get_size(f"{prefix}") == NOT_FOUND         # a prefix of keys is not a key
    assert b.get_size("") == INVALID_KEY


# ================================================================ removal
def test_remove_after_the_lease(stores, prefix) -> None:
    a, b = stores
    assert a.put(f"{prefix}k", b"value") == OK
    assert b.get(f"{prefix}k") == b"value"            # the read takes and releases a lease
    assert a.remove(f"{prefix}k") == OK               # Mooncake would say -706 until the lease ends
    assert b.get(f"{prefix}k") == b"" and b.is_exist(f"{prefix}k") == 0
    assert a.remove(f"{prefix}k") == NOT_FOUND
    assert a.remove("") == INVALID_KEY
    assert a.put(f"{prefix}k", b"again") == OK        # a removed key can be written anew
    assert b.remove(f"{prefix}k", force=True) == OK


def test_batch_remove(stores, prefix) -> None:
    a, b = stores
    keys = [f"{prefix}{i}" for i in range(3)]
    assert a.put_batch(keys, [b"1", b"2", b"3"]) == OK
    assert b.batch_remove([keys[0], f"{prefix}absent", keys[2], "", keys[0]]) == [
        OK, NOT_FOUND, OK, INVALID_KEY, NOT_FOUND]
    assert a.batch_is_exist(keys) == [0, 1, 0]
    assert a.batch_remove([keys[1]], force=True) == [OK]


def test_remove_by_regex_and_remove_all(stores, prefix) -> None:
    a, b = stores
    keys = [f"{prefix}user_session_{i}" for i in range(5)] + [f"{prefix}keep_{i}" for i in range(3)]
    assert a.put_batch(keys, [b"v"] * len(keys)) == OK
    assert b.remove_by_regex(f"^{re.escape(prefix)}user_session_.*") == 5
    assert a.batch_is_exist(keys) == [0] * 5 + [1] * 3
    assert b.remove_by_regex(f"^{re.escape(prefix)}user_session_") == 0
    assert b.remove_by_regex("([unclosed") == INVALID_PARAMS
    assert a.remove_all() >= 3
    assert a.batch_is_exist(keys[5:]) == [0, 0, 0]


# ============================================================ options/errors
def test_replicate_config_maps_to_put_options(stores, prefix) -> None:
    a, b = stores
    cfg = ReplicateConfig()
    assert put_options(cfg) == {"replica_num": 1, "soft_pin": False, "hard_pin": False}
    cfg.replica_num, cfg.with_soft_pin, cfg.with_hard_pin = 2, True, True
    assert put_options(cfg) == {"replica_num": 2, "soft_pin": True, "hard_pin": True}
    cfg.soft_pin_action = SoftPinAction.DISABLE
    assert put_options(cfg)["soft_pin"] is False
    cfg.with_soft_pin, cfg.soft_pin_action = False, SoftPinAction.ENABLE
    assert put_options(cfg)["soft_pin"] is True
    cfg.preferred_segment, cfg.prefer_alloc_in_same_node, cfg.soft_pin_ttl_ms = "host:1", True, 1000
    assert a.put(f"{prefix}pinned", b"x", cfg) == OK     # placement hints accepted
    assert b.get(f"{prefix}pinned") == b"x"
    with pytest.raises(AttributeError):
        cfg.replicas = 3  # type: ignore[attr-defined]
    cfg.preferred_segments = ["only-one"]                # Mooncake: must hold replica_num entries
    assert a.put(f"{prefix}bad", b"x", cfg) == INVALID_PARAMS
    cfg.preferred_segments, cfg.replica_num = [], 0
    assert a.put(f"{prefix}bad", b"x", cfg) == INVALID_PARAMS
    assert a.put(f"{prefix}bad", b"x", "not a config") == INVALID_PARAMS  # type: ignore[arg-type]
    assert "replica_num=0" in repr(cfg)


def test_error_table_covers_every_cxlkv_code() -> None:
    assert set(MOONCAKE_CODES) == set(CxlkvCode)
    assert MOONCAKE_CODES[CxlkvCode.OK] == 0
    for code, mc in MOONCAKE_CODES.items():
        if code != CxlkvCode.OK:
            assert mc < 0 and mooncake_code(error_for(code, "x")) == int(mc)
    # Mooncake's own values (mooncake-store/include/types.h)
    assert (ErrorCode.OBJECT_NOT_FOUND, ErrorCode.OBJECT_ALREADY_EXISTS,
            ErrorCode.OBJECT_HAS_LEASE) == (-704, -705, -706)
    assert (ErrorCode.INVALID_PARAMS, ErrorCode.INVALID_KEY, ErrorCode.NO_AVAILABLE_HANDLE) == (-600, -400, -200)
    assert mooncake_code(NotFound("x")) == -704
    assert mooncake_code(InvalidArgument("x")) == -600 and mooncake_code(TypeError("x")) == -600


# ================================================================ tensors
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
                                   "uint32", "int64", "uint64", "bool", "float16"])
def test_tensor_codec_round_trip(dtype: str) -> None:
    arr = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype)
    enc = tensors.encode(arr)
    code, ndim, *shape = struct.unpack("<ii4q", enc.header)
    assert tensors.DTYPES[code][0] == dtype and ndim == 3 and shape == [2, 3, 4, -1]
    assert enc.nbytes == 40 + arr.nbytes
    back, name = tensors.decode(enc.header + enc.data.tobytes())
    assert name == dtype and back.shape == (2, 3, 4) and np.array_equal(back, arr)


def test_tensor_codec_rejects_bad_input() -> None:
    with pytest.raises(InvalidArgument):
        tensors.encode(np.zeros((1, 1, 1, 1, 1)))      # over 4 dimensions
    with pytest.raises(InvalidArgument):
        tensors.encode(np.zeros(2, dtype=np.complex64))
    with pytest.raises(InvalidArgument):
        tensors.encode([1, 2])
    header = struct.pack("<ii4q", 0, 1, 4, -1, -1, -1)
    with pytest.raises(InvalidArgument):
        tensors.decode(header[:20])                     # too short
    with pytest.raises(InvalidArgument):
        tensors.decode(header + b"\x00" * 15)           # 4 float32 need 16 bytes
    with pytest.raises(InvalidArgument):
        tensors.decode(struct.pack("<ii4q", 99, 1, 1, -1, -1, -1) + b"\x00")
    back, _ = tensors.decode(struct.pack("<ii4q", 0, 1, 0, -1, -1, -1))
    assert back.shape == (0,)


def test_tensor_from_and_into_raw_memory(stores, prefix) -> None:
    a, b = stores
    arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
    enc = tensors.encode(arr)
    blob = ctypes.create_string_buffer(enc.header + enc.data.tobytes(), enc.nbytes)
    assert a.put_tensor_from(f"{prefix}t", ctypes.addressof(blob), enc.nbytes) == OK
    assert a.put_tensor_from(f"{prefix}junk", ctypes.addressof(blob), 7) == INVALID_PARAMS
    out = ctypes.create_string_buffer(enc.nbytes)
    assert b.get_into(f"{prefix}t", ctypes.addressof(out), enc.nbytes) == enc.nbytes
    back, name = tensors.decode(out)
    assert name == "float32" and np.array_equal(back, arr)
    assert b.batch_put_tensor_from([f"{prefix}t2", f"{prefix}t3"], [ctypes.addressof(blob)] * 2,
                                   [enc.nbytes, 3]) == [OK, INVALID_PARAMS]


def test_tensor_calls_with_torch(stores, prefix) -> None:
    torch = pytest.importorskip("torch")
    a, b = stores
    t = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)
    assert a.put_tensor(f"{prefix}t", t) == OK
    assert torch.equal(b.get_tensor(f"{prefix}t"), t)
    assert b.get_tensor(f"{prefix}absent") is None
    assert a.batch_put_tensor([f"{prefix}x", f"{prefix}y"], [t, t.float()]) == [OK, OK]
    got = b.batch_get_tensor([f"{prefix}x", f"{prefix}absent", f"{prefix}y"])
    assert torch.equal(got[0], t) and got[1] is None and torch.equal(got[2], t.float())
    assert a.put_tensor_with_tp(f"{prefix}tp", t, tp_size=2, split_dim=1) == OK
    assert torch.equal(b.get_tensor_with_tp(f"{prefix}tp", tp_rank=1, tp_size=2), t.chunk(2, 1)[1])
    assert a.batch_put_tensor_with_tp([f"{prefix}b0", f"{prefix}b1"], [t, t * 2], tp_size=3) == [INVALID_PARAMS] * 2
    assert a.batch_put_tensor_with_tp([f"{prefix}b0", f"{prefix}b1"], [t, t * 2], tp_size=2) == [OK, OK]
    shards = b.batch_get_tensor_with_tp([f"{prefix}b0", f"{prefix}b1"], tp_rank=1, tp_size=2)
    assert torch.equal(shards[0], t.chunk(2)[1]) and torch.equal(shards[1], (t * 2).chunk(2)[1])
    assert a.upsert_tensor(f"{prefix}t", t + 1) == OK and torch.equal(b.get_tensor(f"{prefix}t"), t + 1)
    buf = ctypes.create_string_buffer(4096)
    into = b.get_tensor_into(f"{prefix}t", ctypes.addressof(buf), 4096)
    assert torch.equal(into, t + 1) and into.data_ptr() == ctypes.addressof(buf) + 40
    bufs = [ctypes.create_string_buffer(4096) for _ in range(2)]
    got = b.batch_get_tensor_into([f"{prefix}y", f"{prefix}absent"], [ctypes.addressof(x) for x in bufs], [4096] * 2)
    assert torch.equal(got[0], t.float()) and got[1] is None


# ============================================================ concurrency
def test_one_store_shared_by_threads(stores, prefix) -> None:
    a, b = stores
    errors: list[str] = []

    def work(t: int) -> None:
        for i in range(25):
            key, value = f"{prefix}{t}/{i}", _payload(100 + i, t * 100 + i)
            if a.put(key, value) != OK or b.get(key) != value:
                errors.append(key)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert errors == [] and not any(th.is_alive() for th in threads)
    assert a.batch_is_exist([f"{prefix}{t}/24" for t in range(4)]) == [1] * 4


# ============================================================ must-show
def test_example_mooncake_program_runs_on_cxlkv(module_cluster) -> None:
    source = EXAMPLE.read_text()
    assert "# from mooncake.store import MooncakeDistributedStore\n" in source
    assert "\nfrom cxlkv.compat.mooncake import MooncakeDistributedStore\n" in source
    env = dict(os.environ, CXLKV_SOCKET=module_cluster.socket_path(1), MOONCAKE_APP_PREFIX="mc-app/swapped")
    r = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True,
                       timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mooncake_app: all checks passed" in r.stdout


def test_unchanged_mooncake_program_runs_through_the_import_hook(module_cluster, tmp_path) -> None:
    original = EXAMPLE.read_text().replace(
        "# from mooncake.store import MooncakeDistributedStore\nfrom cxlkv.compat.mooncake import "
        "MooncakeDistributedStore\n",
        "from mooncake.store import MooncakeDistributedStore\n")
    assert "cxlkv" not in original.split('"""', 2)[2]    # no cxlkv name left in the code
    app = tmp_path / "original_app.py"
    app.write_text(original)
    env = dict(os.environ, CXLKV_SOCKET=module_cluster.socket_path(0), CXLKV_AS_MOONCAKE="1",
               MOONCAKE_APP_PREFIX="mc-app/hooked")
    code = f"import cxlkv.compat.mooncake_alias, runpy; runpy.run_path({str(app)!r}, run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=SUBPROCESS_TIMEOUT_S, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mooncake_app: all checks passed" in r.stdout


def test_import_hook_install_and_uninstall() -> None:
    from cxlkv.compat import mooncake_alias

    assert not mooncake_alias.installed()
    mooncake_alias.install()
    try:
        from mooncake.store import MooncakeDistributedStore as Hooked  # type: ignore[import-not-found]
        from mooncake.store import ReplicateConfig as HookedConfig  # type: ignore[import-not-found]

        assert Hooked is MooncakeDistributedStore and HookedConfig is ReplicateConfig
        assert mooncake_alias.installed()
    finally:
        mooncake_alias.uninstall()
    assert not mooncake_alias.installed() and "mooncake.store" not in sys.modules
