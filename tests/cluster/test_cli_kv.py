"""The key-value CLI (put/get/exists/rm/ls/stat) against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxlkv.cli import main
from cxlkv.errors import ErrorCode

MiB = 1 << 20


@pytest.fixture(scope="module")
def run(module_cluster):
    runner = CliRunner()
    sock = module_cluster.socket_path(1)

    def invoke(*args: str, input: bytes | None = None, socket: str | None = None):
        return runner.invoke(main, [*args, "--socket", socket or sock], input=input, catch_exceptions=False)

    return invoke


def test_put_get_round_trip_through_files_and_stdin(run, module_cluster, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 17)
    src = tmp_path / "value.bin"
    src.write_bytes(data)
    r = run("put", "cli/file", str(src))
    assert r.exit_code == 0 and "cli/file: version" in r.output
    r = run("put", "cli/stdin", "-", "--json", input=b"from stdin")
    assert r.exit_code == 0 and json.loads(r.output)["size_bytes"] == 10
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert run("put", "cli/empty", str(empty)).exit_code == 0
    out = tmp_path / "out.bin"
    r = run("get", "cli/file", "-o", str(out), socket=module_cluster.socket_path(0))
    assert r.exit_code == 0 and out.read_bytes() == data
    r = run("get", "cli/stdin")
    assert r.exit_code == 0 and r.stdout_bytes == b"from stdin"
    r = run("get", "cli/empty")
    assert r.exit_code == 0 and r.stdout_bytes == b""


def test_errors_are_one_line_with_distinct_exit_codes(run, tmp_path: Path) -> None:
    r = run("get", "cli/nope")
    assert r.exit_code == 10 + ErrorCode.NOT_FOUND
    assert r.stderr.strip().startswith("error: NOT_FOUND:") and len(r.stderr.strip().splitlines()) == 1
    run("put", "cli/dup", "-", input=b"1")
    r = run("put", "cli/dup", "-", input=b"2")
    assert r.exit_code == 10 + ErrorCode.ALREADY_EXISTS and "ALREADY_EXISTS" in r.stderr
    assert run("put", "cli/dup", "-", "--upsert", input=b"2").exit_code == 0
    assert run("get", "cli/dup").stdout_bytes == b"2"
    r = run("put", "x" * 4097, "-", input=b"v")
    assert r.exit_code == 10 + ErrorCode.INVALID_KEY and "INVALID_KEY" in r.stderr
    r = run("get", "k", socket=str(tmp_path / "no-daemon.sock"))
    assert r.exit_code == 10 + ErrorCode.UNAVAILABLE and "no-daemon.sock" in r.stderr
    r = run("put", "cli/x", str(tmp_path / "missing-file"))
    assert r.exit_code == 2 and "missing-file" in r.output + r.stderr
    r = run("get", "cli/dup", "-o", str(tmp_path / "no-dir" / "out"))
    assert r.exit_code == 2 and "no-dir" in r.stderr and "No such file or directory" in r.stderr


def test_exists_rm_ls(run) -> None:
    for k in ("cli/ls/a", "cli/ls/b b", "cli/ls/ü"):
        assert run("put", k, "-", input=b"12345").exit_code == 0
    r = run("exists", "cli/ls/a")
    assert r.exit_code == 0 and r.output.strip() == "true"
    r = run("exists", "cli/ls/zzz")
    assert r.exit_code == 1 and r.output.strip() == "false"
    r = run("ls", "--prefix", "cli/ls/")
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert lines[0].split()[:2] == ["key", "size_bytes"] and len(lines) == 5
    r = run("ls", "--prefix", "cli/ls/", "--json")
    rows = [json.loads(x) for x in r.output.splitlines()]
    assert [x["key"] for x in rows] == ["cli/ls/a", "cli/ls/b b", "cli/ls/ü"]
    assert all(x["size_bytes"] == 5 for x in rows)
    assert run("rm", "cli/ls/a").exit_code == 0
    r = run("rm", "cli/ls/a")
    assert r.exit_code == 10 + ErrorCode.NOT_FOUND
    r = run("rm", "cli/ls/b b", "cli/ls/missing", "cli/ls/ü")
    assert r.exit_code == 10 + ErrorCode.NOT_FOUND and r.stderr.count("error:") == 1
    assert run("ls", "--prefix", "cli/ls/", "--json").output == ""


def test_stat_table_and_json(run) -> None:
    r = run("stat")
    assert r.exit_code == 0
    assert "clientd-1" in r.output and "connected" in r.output and "cxl0" in r.output
    st = json.loads(run("stat", "--json").output)
    assert st["name"] == "clientd-1" and st["master_connected"] is True
    assert isinstance(st["capacity_bytes"], int) and st["capacity_bytes"] > 0
    for name in ("key_count", "epoch", "used_bytes", "buffer_bytes", "reserved_bytes", "quarantined_bytes"):
        assert isinstance(st[name], int), (name, st[name])  # never "9"
    assert all(isinstance(s["capacity_bytes"], int) and s["tier"] == "CXL" for s in st["segments"])
    assert all(isinstance(v, int) for v in st["counters"].values())


def test_put_replicas_says_how_many_were_placed(run) -> None:
    """One segment: `put --replicas 2` commits with 1 replica and says so."""
    r = run("put", "cli/rep", "-", "--replicas", "2", input=b"r")
    assert r.exit_code == 0, r.output
    assert "1 of 2 replicas placed" in r.stderr, r.stderr
    rec = json.loads(run("put", "cli/rep2", "-", "--replicas", "2", "--json", input=b"r").stdout)
    assert rec["replicas_wanted"] == 2 and rec["replicas_placed"] == 1
    assert "replicas placed" not in run("put", "cli/rep3", "-", input=b"r").stderr


def test_cli_as_a_subprocess_uses_cxlkv_socket(module_cluster) -> None:
    env = dict(os.environ, CXLKV_SOCKET=module_cluster.socket_path(0))
    p = subprocess.run([sys.executable, "-m", "cxlkv.cli", "put", "cli/proc", "-"], input=b"abc",
                       env=env, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-m", "cxlkv.cli", "get", "cli/proc"], env=env, capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout == b"abc"
    p = subprocess.run([sys.executable, "-m", "cxlkv.cli", "get", "cli/none"], env=env, capture_output=True, timeout=60)
    assert p.returncode == 11 and b"Traceback" not in p.stderr


def test_put_from_a_file_fails_in_one_line(run, module_cluster, tmp_path: Path) -> None:
    """A refused put of FILE (mmapped) is one line and the error's exit code, not a BufferError traceback."""
    src = tmp_path / "v.bin"
    src.write_bytes(b"file value")
    assert run("put", "cli/fdup", str(src)).exit_code == 0
    for key, code in (("cli/fdup", ErrorCode.ALREADY_EXISTS), ("", ErrorCode.INVALID_KEY)):
        p = subprocess.run([sys.executable, "-m", "cxlkv.cli", "put", key, str(src)], capture_output=True,
                           env=dict(os.environ, CXLKV_SOCKET=module_cluster.socket_path(0)), timeout=60)
        assert p.returncode == 10 + code, p.stderr
        assert b"Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_non_utf8_key_from_argv_is_invalid_key(module_cluster) -> None:
    """argv bytes that are not UTF-8 (surrogate-escaped by Python) are INVALID_KEY, not a traceback."""
    env = dict(os.environ, CXLKV_SOCKET=module_cluster.socket_path(0))
    for args in (["put", b"a\xffb", "-"], ["get", b"\xff"], ["rm", "ok", b"\xff"], ["ls", "--prefix", b"\xff"]):
        p = subprocess.run([sys.executable.encode(), b"-m", b"cxlkv.cli", *[a if isinstance(a, bytes) else a.encode()
                                                                           for a in args]],
                           input=b"v", env=env, capture_output=True, timeout=60)
        assert p.returncode == 10 + ErrorCode.INVALID_KEY, (args, p.stderr)
        assert p.stderr.startswith(b"error: INVALID_KEY:") and b"UTF-8" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_key_twice_in_one_put_batch(module_cluster) -> None:
    """Duplicates in a batch are answered per position (docs/master.md, protocol.md):
    the first position's put commits, a later one of the same key finds that put in
    flight and answers NOT_READY, with or without upsert; the key holds the first value."""
    from cxlkv.errors import NotReady

    with module_cluster.client(0) as c:
        for upsert in (False, True):
            key = f"dup/batch/{upsert}"
            res = c.put_many([(key, b"first"), ("dup/other", b"x") if not upsert else ("dup/other2", b"y"),
                              (key, b"second")], upsert=upsert)
            assert res[0].ok and res[1].ok, res
            assert not res[2].ok and isinstance(res[2].error, NotReady), res[2]
            assert c.get(key) == b"first"
        res = c.get_many(["dup/batch/False", "dup/batch/False"])
        assert [r.value for r in res] == [b"first", b"first"]
        from cxlkv.errors import NotFound

        res = c.remove_many(["dup/batch/False", "dup/batch/False"])
        assert res[0].ok and isinstance(res[1].error, NotFound), res
