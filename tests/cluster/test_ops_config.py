"""Configuration files and operator errors: the shipped examples document every
key and pass `cxlkv config check`; the check names the key of a bad value and
exits 2; both daemons turn a bad config, a missing device or plugin and a port
in use into one clear line and exit code 2 (text or JSON logs), never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w

from cxlkv.config import ClientdConfig, MasterConfig, RegionConfig, SegmentConfig
from cxlkv.cli.config import check_config, example_toml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
MiB = 1 << 20


def _cxlkv(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CXLKV_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "cxlkv.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("kind,cls,items", [
    ("master", MasterConfig, SegmentConfig),
    ("clientd", ClientdConfig, RegionConfig),
])
def test_examples_document_every_key_and_are_valid(kind: str, cls: type, items: type) -> None:
    path = EXAMPLES / f"{kind}.toml"
    text = path.read_text()
    assert text == example_toml(kind), (
        f"{path} is out of date: run `cxlkv config example --kind {kind} > {path.relative_to(ROOT)}`")
    lines = text.splitlines()
    for f in [*dataclasses.fields(cls), *dataclasses.fields(items)]:
        if f.name in ("segments", "regions"):
            assert f"[[{f.name}]]" in lines, f.name
            continue
        i = next((n for n, ln in enumerate(lines) if ln.startswith(f"{f.name} = ")), None)
        assert i is not None, f"{f.name} missing from {path}"
        assert lines[i - 2] == f"# {f.metadata['doc']}", (f.name, lines[i - 2])  # its meaning …
        assert lines[i - 1].startswith("#   default: "), (f.name, lines[i - 1])  # … and default
    found, cfg = check_config(str(path))
    assert found == kind and isinstance(cfg, cls)


def test_config_check_cli(tmp_path: Path) -> None:
    good = _cxlkv("config", "check", str(EXAMPLES / "master.toml"), env={"CXLKV_MASTER_LEASE_TTL_S": "2s"})
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith(f"# {EXAMPLES / 'master.toml'}: valid master configuration")
    effective = tomllib.loads(good.stdout)
    assert effective["lease_ttl_s"] == 2.0  # the environment applies, as for the daemon
    assert effective["segments"][0]["size_bytes"] == 256 << 30
    no_env = _cxlkv("config", "check", "--no-env", str(EXAMPLES / "master.toml"), env={"CXLKV_MASTER_LEASE_TTL_S": "2s"})
    assert tomllib.loads(no_env.stdout)["lease_ttl_s"] == 5.0

    def bad(content: str, *extra: str, expect: str) -> None:
        path = tmp_path / "bad.toml"
        path.write_text(content)
        r = _cxlkv("config", "check", *extra, str(path))
        assert r.returncode == 2, (content, r.stdout, r.stderr)
        assert r.stdout == ""
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert expect in r.stderr, r.stderr

    bad('lease_ttl_s = "5 parsecs"\n', expect="lease_ttl_s: cannot parse duration")
    bad('listen_address = "0.0.0.0:50051"\nleese_ttl_s = 5\n',
        expect=f"{tmp_path / 'bad.toml'}: unknown key 'leese_ttl_s' (did you mean 'lease_ttl_s'")
    bad('listen_address = "0.0.0.0:50051"\nzzz = 5\n', expect="unknown key 'zzz'; known keys: ")
    bad('listen_address = "0.0.0.0:50051"\n[[segments]]\nname = "cxl0"\nsize_byte = "1GiB"\n',
        expect="segments[0]: unknown key 'size_byte' (did you mean 'size_bytes'?)")
    bad('listen_address = "0.0.0.0:50051"\n[[segments]]\nname = "cxl0"\nsize_bytes = "1g"\n',
        expect="unit 'g' is ambiguous; write \"1GiB\"")
    bad('eviction_policy = "fifo"\n', expect="eviction_policy: unknown cxlkv.eviction_policies plugin 'fifo'")
    bad('master_address = "m:1"\ncoherence = "maybe"\n', expect='coherence: must be "coherent" or "flush"')
    bad('metrics_address = "9464"\nregions = []\n', expect="metrics_address: expected HOST:PORT")
    bad('log_level = "info"\n', expect="pass --kind master|clientd")
    bad('segments = []\nregions = []\n', expect="mixes master keys (segments) and clientd keys (regions)")
    bad('low_watermark = 0.99\n', expect="low_watermark (0.99) and high_watermark (0.95)")
    bad('[[segments]\n', expect="bad.toml")
    ok = tmp_path / "ok.toml"
    ok.write_text('log_level = "debug"\n')
    r = _cxlkv("config", "check", "--kind", "clientd", str(ok))
    assert r.returncode == 0 and tomllib.loads(r.stdout)["log_level"] == "debug", r.stderr
    r = _cxlkv("config", "check", str(tmp_path / "absent.toml"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    # a decimal size is said, not silently taken as 10^9
    ok.write_text('listen_address = "127.0.0.1:50051"\n[[segments]]\nname = "cxl0"\nsize_bytes = "1GB"\n')
    r = _cxlkv("config", "check", str(ok))
    assert r.returncode == 0 and tomllib.loads(r.stdout)["segments"][0]["size_bytes"] == 10**9, r.stderr
    assert ("# note: segments[0].size_bytes: '1GB' is decimal (SI): 1000000000 bytes (953.7 MiB); "
            '"1GiB" would be 1073741824 bytes') in r.stdout, r.stdout


def test_size_options_exit_2_and_say_decimal_units(tmp_path: Path) -> None:
    """Sizes on the command line: bad ones are usage errors (exit 2, as config check),
    decimal units are said on stderr, no internal path in the message."""
    region = str(tmp_path / "r")
    for argv, expect in [
        (["cluster", "up", "--run-dir", str(tmp_path / "c"), "--region-size", "0"],
         "Invalid value for '--region-size': must be at least 1 byte, got '0'"),
        (["cluster", "up", "--run-dir", str(tmp_path / "c"), "--region-size", "12XB"], "cannot parse size '12XB'"),
        (["cluster", "up", "--run-dir", str(tmp_path / "c"), "--region-size", "1g"], "unit 'g' is ambiguous"),
        (["region", "format", region, "--segment", "s", "--create", "--size", "0"], "must be at least 4097 bytes"),
        (["replay", "--embedded", "--block-bytes", "0"], "'--block-bytes': must be at least 1 byte"),
    ]:
        r = _cxlkv(*argv)
        assert r.returncode == 2, (argv, r.returncode, r.stderr)
        assert expect in r.stderr and "/dev/shm" not in r.stderr, (argv, r.stderr)
    r = _cxlkv("region", "format", region, "--segment", "s", "--create", "--size", "8MB")
    assert r.returncode == 0, r.stderr
    assert ("note: --size '8MB' is decimal (SI): 8000000 bytes (7.6 MiB); \"8MiB\" would be 8388608 bytes"
            in r.stderr), r.stderr
    assert os.path.getsize(region) == 8 * 10**6


# ------------------------------------------------------------ operator errors


@pytest.fixture()
def busy_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that another process (this one) listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture()
def region_file() -> Iterator[str]:
    """A formatted 4 MiB emulated region (segment cxl0) in /dev/shm."""
    from cxlkv.layout.region import format_region
    from cxlkv.transport import Region

    path = f"/dev/shm/cxlkv-opstest-{os.getpid()}"
    with Region.open(path, size=4 * MiB, create=True) as region:
        format_region(region, "cxl0")
    yield path
    Path(path).unlink(missing_ok=True)


def _one_error_line(r: subprocess.CompletedProcess, expect: str, *, json_lines: bool = False) -> None:
    """Exit 2, no traceback, and exactly one line on stderr that is not an INFO log line."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    if json_lines:
        records = [json.loads(ln) for ln in lines]
        errors = [rec for rec in records if rec["level"] != "info"]
        assert len(errors) == 1 and errors[0]["level"] == "error", records
        assert expect in errors[0]["msg"], errors
        return
    errors = [ln for ln in lines if " INFO " not in ln]
    assert len(errors) == 1, r.stderr
    assert expect in errors[0], r.stderr


def test_master_operator_errors(tmp_path: Path, busy_port: int) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('listen_address = "127.0.0.1:0"\nhigh_watermark = "high"\n')
    _one_error_line(_cxlkv("master", "--config", str(bad)), "cxlkv master: high_watermark: expected a number")
    # port in use: the gRPC port, then the metrics port
    _one_error_line(_cxlkv("master", "--listen", f"127.0.0.1:{busy_port}"),
                    f"cannot listen on 127.0.0.1:{busy_port} (listen_address): Address already in use")
    _one_error_line(_cxlkv("master", "--listen", "127.0.0.1:0", "--metrics-address", f"127.0.0.1:{busy_port}"),
                    f"cannot serve metrics on 127.0.0.1:{busy_port} (metrics_address): Address already in use")
    # the master maps no device; what it loads at start is its plugins
    missing = tmp_path / "plugin.toml"
    missing.write_text('listen_address = "127.0.0.1:0"\nallocation_strategy = "nearest_dax"\n')
    _one_error_line(_cxlkv("master", "--config", str(missing)), "unknown cxlkv.allocation_strategies plugin")


def test_clientd_operator_errors(tmp_path: Path, busy_port: int, region_file: str) -> None:
    base = ["clientd", "--name", "ops", "--master", "127.0.0.1:1", "--socket", str(tmp_path / "ops.sock")]
    bad = tmp_path / "bad.toml"
    bad.write_text(tomli_w.dumps({"coherence": "maybe", "regions": [{"segment": "cxl0", "path": region_file}]}))
    _one_error_line(_cxlkv(*base, "--config", str(bad)), 'coherence: must be "coherent" or "flush"')
    _one_error_line(_cxlkv(*base, "--region", "cxl0=/dev/dax97.3"), "region /dev/dax97.3 does not exist")
    _one_error_line(_cxlkv(*base, "--region", f"cxl0={region_file}", "--metrics-address", f"127.0.0.1:{busy_port}"),
                    f"cannot serve metrics on 127.0.0.1:{busy_port} (metrics_address): Address already in use")
    # the same, as JSON lines
    _one_error_line(_cxlkv(*base, "--log-json", "--region", "cxl0=/dev/dax97.3"), "region /dev/dax97.3 does not exist",
                    json_lines=True)
    assert not (tmp_path / "ops.sock").exists()


def test_json_log_lines(tmp_path: Path) -> None:
    """With --log-json every line the master writes is one JSON object (ts, level, logger, msg)."""
    import signal
    import time

    address_file = tmp_path / "addr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CXLKV_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cxlkv.cli", "master", "--listen", "127.0.0.1:0", "--address-file", str(address_file),
         "--metrics-address", "127.0.0.1:0", "--log-json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not address_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert address_file.exists(), proc.stderr.read() if proc.poll() is not None else "timeout"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert {"ts", "level", "logger", "msg"} <= set(records[0]), records[0]
    msgs = [r["msg"] for r in records]
    assert any(m.startswith("master ") and " serving on 127.0.0.1:" in m for m in msgs), msgs
    assert any(m.startswith("metrics on http://127.0.0.1:") for m in msgs), msgs
    assert all(r["level"] == "info" for r in records), records


def test_config_check_names_a_bad_environment_variable_not_the_file() -> None:
    """A bad CXLKV_CLIENTD_* value is the variable's fault: the one line names it."""
    r = _cxlkv("config", "check", str(EXAMPLES / "clientd.toml"), env={"CXLKV_CLIENTD_DRAM_TIER_BYTES": "abc"})
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "environment variable CXLKV_CLIENTD_DRAM_TIER_BYTES" in r.stderr, r.stderr
    assert "clientd.toml" not in r.stderr, r.stderr
    r = _cxlkv("config", "check", str(EXAMPLES / "clientd.toml"), env={"CXLKV_CLIENTD_DRAM_TIER_BYTES": "5"})
    assert r.returncode == 2 and "set by environment variable CXLKV_CLIENTD_DRAM_TIER_BYTES" in r.stderr, r.stderr


def test_shipped_ports_are_fixed_and_in_the_port_table() -> None:
    """Every TCP port the shipped configs listen on is fixed (a firewall can follow
    it) and listed in docs/operations.md's port table."""
    docs = (EXAMPLES.parent.parent / "docs" / "operations.md").read_text()
    table = docs[docs.index("| port / path | who | set by |"):].split("\n\n", 1)[0]
    master = tomllib.loads((EXAMPLES / "master.toml").read_text())
    clientd = tomllib.loads((EXAMPLES / "clientd.toml").read_text())
    for key, address in [("listen_address", master["listen_address"]),
                         ("lean_listen_address", master["lean_listen_address"]),
                         ("metrics_address", master["metrics_address"]),
                         ("metrics_address", clientd["metrics_address"])]:
        port = address.rsplit(":", 1)[-1]
        assert port.isdigit() and int(port) > 0, (key, address)
        assert f"| TCP {port} |" in table and f"`{key}`" in table, (key, port)
