"""The stale-cache emulator (test-only transport mode) and the flush discipline on it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cxlkv.errors import ChecksumMismatch
from cxlkv.transport import Region
from cxlkv.transport.emulate import EMULATE_ENV, NoncoherentRegion

KiB, MiB = 1 << 10, 1 << 20


def _counters(client) -> dict[str, int]:
    return {k: int(v) for k, v in client.stat()["counters"].items()}


def test_emulator_models_private_caches(tmp_path: Path) -> None:
    path = tmp_path / "region"
    with Region.open(path, size=MiB, create=True) as plain:
        plain.copy_in(4096, b"old!" * 32)
    a = Region.open(path, emulate_noncoherent=True)
    b = Region.open(path, emulate_noncoherent=True)
    try:
        assert isinstance(a, NoncoherentRegion) and "emulated" in repr(a)
        assert b.read(4096, 128) == b"old!" * 32  # b caches the lines
        a.copy_in(4096 + 64, b"new!" * 16)  # one line, dirty in a's cache
        assert a.read(4096, 128) == b"old!" * 16 + b"new!" * 16  # a sees its own write
        b.invalidate(4096, 128)
        assert b.read(4096, 128) == b"old!" * 32  # not flushed: invisible to b
        a.flush(4096, 128)
        assert b.read(4096, 128) == b"old!" * 32  # flushed, but b reads its stale line
        assert b.stale_line_reads == 1
        b.invalidate(4096, 128)
        assert b.read(4096, 128) == b"old!" * 16 + b"new!" * 16  # invalidate: from memory
        # the batched entry points go through the same cache
        buf = bytearray(8)
        a.copy_in_ranges(b"12345678", [0], [8192], [8])
        b.copy_out_ranges(buf, [0], [8192], [8])
        assert bytes(buf) == bytes(8)
        a.flush(8192, 8)
        b.invalidate(8192, 8)
        b.copy_out_ranges(buf, [0], [8192], [8])
        assert bytes(buf) == b"12345678" and b.checksum(8192, 8) == a.checksum(8192, 8)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("coherence", ["flush", "coherent"])
def test_two_clientds_on_the_emulator(make_cluster, monkeypatch, coherence: str) -> None:
    """flush mode: never a stale or torn value across hosts. coherent mode (no
    flush, no invalidate): the emulator makes stale reads happen, and the object
    header and checksum turn every one into a miss rather than wrong data."""
    monkeypatch.setenv(EMULATE_ENV, "1")
    cl = make_cluster(region_size_bytes=16 * MiB, clientd_options={"coherence": coherence})
    sizes = (100, 4 * KiB, 200 * KiB)
    wrong = misses = 0
    with cl.client(0) as a, cl.client(1) as b:
        for rnd in range(4):  # each round overwrites every key with a new version
            values = {f"nc/{n}": os.urandom(n) for n in sizes}
            for k, v in values.items():
                a.put(k, v, upsert=True)
            for k, v in values.items():
                try:
                    got = b.get(k)
                except ChecksumMismatch:
                    misses += 1
                    continue
                wrong += got != v
        failures = _counters(b).get("checksum_failures", 0)
    assert wrong == 0  # never wrong bytes as data, in either mode
    if coherence == "flush":
        assert misses == 0 and failures == 0
    else:
        assert misses > 0 and failures == misses  # the unsafe path is caught
    cl.assert_invariants()


@pytest.mark.parametrize("flush_reads", ["verify_first", "invalidate_first"])
@pytest.mark.parametrize("path", ["sdk-index", "sdk-leased", "clientd-leased"])
def test_verify_first_reads_catch_every_stale_line(make_cluster, monkeypatch, path: str, flush_reads: str) -> None:
    """Flush mode verifies first (docs/transport.md): a value's first copy goes
    through the cache. On the emulator, whose caches never evict, a reader that
    read an extent keeps its lines, so once the extent is reused the first copy
    IS stale: every such copy must fail its check and be copied again with every
    line dropped — never answered, never a miss. Each read path: the SDK's index
    reads, the SDK's leased direct reads, clientd's leased reads. With
    ``flush_reads = "invalidate_first"`` no stale line is ever read (every line
    dropped before the first copy), with the same answers."""
    monkeypatch.setenv(EMULATE_ENV, "1")
    opts = {"coherence": "flush", "flush_reads": flush_reads}
    if path == "clientd-leased":
        opts["index_reads"] = False
    cl = make_cluster(region_size_bytes=8 * MiB, clientd_options=opts)
    keys = [f"vf/{i}" for i in range(6)]
    wrong = 0
    kw = {"direct": False} if path == "clientd-leased" else {"direct_threshold_bytes": 1}
    with cl.client(0) as a, cl.client(1, **kw) as b:
        if path == "sdk-leased":
            assert b._direct is not None
            b._direct.index = None  # the leased direct path only
        for rnd in range(6):  # new versions; freed extents are reused, b's cached lines go stale
            values = {k: os.urandom(64 * KiB + 100 * (rnd + 1)) for k in keys}
            for k, v in values.items():
                a.put(k, v, upsert=True)
            for k, v in values.items():
                dst = np.zeros(len(v) + 64, np.uint8)
                n = b.get_into(k, dst)  # a ChecksumMismatch (a miss) fails the test
                wrong += n != len(v) or dst[:n].tobytes() != v
        regions = list(b._direct.regions.values()) if b._direct is not None else []
        sdk_verify_first = b._direct.verify_first if b._direct is not None else None
    with cl.client(1) as c:  # b's reports are in once b has closed
        counters = _counters(c)
    assert wrong == 0
    assert counters.get("checksum_failures", 0) == 0
    verify_first = flush_reads == "verify_first"
    # stale first copies happened and were redone — and counted on the daemon, whichever
    # process read — or, with invalidate_first, no line was ever stale
    assert (counters.get("reads_copied_again", 0) > 0) == verify_first
    if path != "clientd-leased":
        assert (sum(r.stale_line_reads for r in regions) > 0) == verify_first
        assert sdk_verify_first == verify_first  # the SDK follows its daemon
    cl.assert_invariants()
