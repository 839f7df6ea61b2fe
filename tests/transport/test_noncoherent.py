"""The stale-cache emulator (test-only transport mode) and the flush discipline on it."""

from __future__ import annotations

import os
from pathlib import Path

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
