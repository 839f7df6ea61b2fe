"""The trace simulator reproduces the published figures of the conversation trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from cxlkv.trace.replay import block_content, fill_blocks, region_bytes_for, verify_blocks
from cxlkv.trace.sim import Request, TraceError, load_trace, simulate, simulate_unbounded, unique_blocks

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="shared trace not present")


@needs_trace
def test_lru_and_bound_match_published_figures() -> None:
    trace = load_trace(TRACE)
    assert len(trace) == 12031
    uniq = unique_blocks(trace)
    assert uniq == 182790
    assert sum(len(r.hash_ids) for r in trace) == 288500
    assert simulate_unbounded(trace).block_hit_rate == pytest.approx(0.366, abs=0.001)
    for fraction, published in ((0.01, 0.052), (0.10, 0.278)):
        rate = simulate(trace, int(fraction * uniq), policy="lru_builtin").block_hit_rate
        assert rate == pytest.approx(published, abs=0.002), fraction


def test_prefix_semantics_and_watermark() -> None:
    trace = [
        Request(0.0, 1024, 1, (1, 2)),
        Request(0.0, 1536, 1, (1, 3, 2)),  # 1 hits; 3 misses; 2 is resident but after a miss: no hit
        Request(0.0, 1536, 1, (1, 3, 2)),  # all three hit
    ]
    r = simulate(trace, 10, policy="lru_builtin")
    assert (r.blocks, r.hit_blocks) == (8, 1 + 3)
    assert r.tokens == 1024 + 1536 + 1536 and r.hit_tokens == 512 + 1536
    # capacity 2: request 2 inserts 3 (evicting 2), then 2 (evicting 1, now the LRU block),
    # so request 3 misses its head block and hits nothing
    r = simulate(trace, 2, policy="lru_builtin")
    assert r.hit_blocks == 1
    # low watermark 0.5 of 2 → evict down to 1 block on a full insert
    r = simulate(trace, 2, policy="lru_builtin", low_watermark=0.5)
    assert r.hit_blocks <= 3


def test_partial_last_block_tokens() -> None:
    r = Request(0.0, 1100, 1, (7, 8, 9))
    assert [r.block_tokens(i) for i in range(3)] == [512, 512, 76]
    assert r.prefix_tokens(3) == 1100 and r.prefix_tokens(2) == 1024


def test_load_trace_errors(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n{"nope": 1}\n')
    with pytest.raises(TraceError, match=":2:"):
        load_trace(bad)
    assert len(load_trace(bad, limit=1)) == 1


@pytest.mark.parametrize("content", ["root:x:0:0:root:/root:/bin/bash\n",
                                     '{"timestamp": 0, "output_length": 1, "hash_ids": [1]}\n'])
def test_replay_of_a_file_that_is_not_a_trace_is_one_line_not_a_traceback(tmp_path: Path, content: str) -> None:
    from click.testing import CliRunner

    from cxlkv.trace.replay import replay_cmd

    bad = tmp_path / "not-a-trace.jsonl"
    bad.write_text(content)
    res = CliRunner().invoke(replay_cmd, [str(bad), "--embedded", "--limit", "10"])
    assert res.exit_code == 1, res.output
    assert f"Error: {bad}:1: not a trace request" in res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)  # click's own exit


def test_block_content_is_distinct_and_sized() -> None:
    a, b = block_content(1, 65536), block_content(2, 65536)
    assert len(a) == 65536 and a != b
    assert len(block_content(5, 100)) == 100
    assert block_content(3, 4096) == block_content(3, 4096)
    assert region_bytes_for(10, 65536) == 4096 + 10 * (65536 + 128)  # + object header and key
    assert region_bytes_for(10, 100) == 4096 + 10 * 256


@needs_trace
def test_store_policies_in_the_simulator_beat_lru_at_ten_percent() -> None:
    """The master's own ARC, driven as the master drives it (evictions leave ghosts),
    beats LRU on the whole trace at 10 % capacity; LRU through the plugin equals the built-in."""
    trace = load_trace(TRACE)
    cap = int(0.1 * unique_blocks(trace))
    lru = simulate(trace, cap, policy="lru", low_watermark=0.999).block_hit_rate
    assert lru == pytest.approx(simulate(trace, cap, policy="lru_builtin", low_watermark=0.999).block_hit_rate)
    arc = simulate(trace, cap, policy="arc", low_watermark=0.999).block_hit_rate
    assert arc >= 0.279 > lru


@pytest.mark.parametrize("block_bytes", [65536, 4096, 16, 100, 7])
def test_fill_and_verify_blocks_match_block_content(block_bytes: int) -> None:
    ids = [0, 1, 2**63 + 5, 2**64 - 1, 12345]
    buf = bytearray(len(ids) * block_bytes + 3)
    fill_blocks(buf, ids, block_bytes)
    assert bytes(buf[:len(ids) * block_bytes]) == b"".join(block_content(b, block_bytes) for b in ids)
    assert verify_blocks(buf, ids, block_bytes) == [True] * len(ids)
    assert verify_blocks(buf, [1, 0, 2**63 + 5, 2**64 - 1, 12345], block_bytes) == [False, False, True, True, True]
    buf[3 * block_bytes + block_bytes // 2] ^= 1  # one flipped bit in block 3
    assert verify_blocks(buf, ids, block_bytes) == [True, True, True, False, True]
    fill_blocks(buf, [], block_bytes)
    assert verify_blocks(buf, [], block_bytes) == []
