"""Configuration: sizes, durations, precedence and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from cxlkv.config import ClientdConfig, MasterConfig, load_config, parse_duration, parse_size
from cxlkv.errors import ConfigError


def test_sizes_and_durations() -> None:
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size(4096) == 4096
    assert parse_size("10GB") == 10 * 10**9
    assert parse_duration("250ms") == pytest.approx(0.25)
    assert parse_duration("2m") == 120.0
    assert parse_duration(3) == 3.0
    for bad in ("12 parsecs", "-1", "MiB", True):
        with pytest.raises(ConfigError):
            parse_size(bad)
    with pytest.raises(ConfigError, match="lease_ttl_s"):
        parse_duration("soon", name="lease_ttl_s")


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text('lease_ttl_s = "2s"\nclient_ttl_s = 30\n[[segments]]\nname = "cxl0"\nsize_bytes = "64MiB"\n')
    cfg = load_config(MasterConfig, f, env={"CXLKV_MASTER_CLIENT_TTL_S": "20s"}, env_prefix="CXLKV_MASTER_",
                      overrides={"lease_ttl_s": 1.5, "put_timeout_s": None})
    assert cfg.lease_ttl_s == 1.5          # flag beats file
    assert cfg.client_ttl_s == 20.0        # env beats file
    assert cfg.put_timeout_s == 60.0       # default
    assert cfg.segments[0].size_bytes == 64 << 20


def test_errors_name_the_key(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text("lease_ttl = 3\n")
    with pytest.raises(ConfigError, match="unknown key.*lease_ttl"):
        load_config(MasterConfig, f)
    f.write_text("low_watermark = 0.99\nhigh_watermark = 0.5\n")
    with pytest.raises(ConfigError, match="watermark"):
        load_config(MasterConfig, f)
    f.write_text("lease_ttl_s = = 3\n")
    with pytest.raises(ConfigError, match="m.toml"):
        load_config(MasterConfig, f)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(MasterConfig, tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="CXLKV_CLIENTD_NOPE"):
        load_config(ClientdConfig, env={"CXLKV_CLIENTD_NOPE": "1"}, env_prefix="CXLKV_CLIENTD_")
    with pytest.raises(ConfigError, match="coherence"):
        load_config(ClientdConfig, overrides={"coherence": "maybe"})
    with pytest.raises(ConfigError, match='flush_reads: must be "verify_first" or "invalidate_first"'):
        load_config(ClientdConfig, overrides={"flush_reads": "sometimes"})
    for size in (0, 100, 4096):  # no room after the region header: the allocator's range would be empty
        f.write_text(f'[[segments]]\nname = "a"\nsize_bytes = {size}\n')
        with pytest.raises(ConfigError, match=rf"segments\[a\]\.size_bytes: must be more than the 4096-byte region "
                                              rf"header, got {size}"):
            load_config(MasterConfig, f)
    # not UTF-8, a directory: ConfigError (one line, exit 2), not a traceback
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="m.toml.*utf-8"):
        load_config(MasterConfig, f)
    with pytest.raises(ConfigError, match="directory"):
        load_config(MasterConfig, tmp_path)
    # a list of strings is not a list of tables: say how to write it
    f.write_text('recover_from_region = "/dev/dax0.0"\n')
    with pytest.raises(ConfigError, match=r'recover_from_region = \["'):
        load_config(MasterConfig, f)


def test_clientd_socket_defaults() -> None:
    cfg = load_config(ClientdConfig, overrides={"name": "host-a", "socket_path": "/tmp/x.sock"})
    assert cfg.resolved_lean_socket_path() == "/tmp/x.sock.lean"
    assert load_config(ClientdConfig).resolved_socket_path().endswith("clientd.sock")


@pytest.mark.parametrize("line, message", [
    ("max_batch_items = inf", "max_batch_items: expected an integer, got inf"),
    ("max_batch_items = nan", "max_batch_items: expected an integer, got nan"),
    ("max_batch_items = 2048.5", "max_batch_items: expected an integer, got 2048.5"),
    ("max_batch_items = true", "max_batch_items: expected an integer, got True"),
    ("max_request_bytes = nan", "max_request_bytes: size must be a finite number"),
    ("max_request_bytes = inf", "max_request_bytes: size must be a finite number"),
    ('segments = [{name = "a", size_bytes = inf, path = "/tmp/x"}]', "size_bytes: size must be a finite number"),
    ('segments = [{name = "a", size_bytes = "1e400GiB", path = "/tmp/x"}]', "size must be a finite number"),
    ("lease_ttl_s = nan", "lease_ttl_s: duration must be a finite number of seconds"),
    ("client_ttl_s = inf", "client_ttl_s: duration must be a finite number of seconds"),
    ('put_timeout_s = "1e400s"', "put_timeout_s: duration must be a finite number of seconds"),
    ("high_watermark = true", "high_watermark: expected a number, got True"),
    ("copy_ahead_watermark = nan", "copy_ahead_watermark: expected a finite number"),
])
def test_non_finite_fractional_and_boolean_numbers_are_refused_in_one_line(tmp_path: Path, line: str,
                                                                           message: str) -> None:
    """TOML has inf, nan and booleans: an integer or size key given inf/nan raised a
    Python OverflowError/ValueError (a traceback, exit 1, instead of one line and exit
    2); a duration given nan or inf was accepted (lease_ttl_s = nan); a number key took
    `true` as 1.0 and an integer key truncated 2048.5 to 2048."""
    f = tmp_path / "m.toml"
    f.write_text(line + "\n")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        load_config(MasterConfig, f)


def test_integral_floats_and_plain_numbers_still_load(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text("max_batch_items = 4096.0\nhigh_watermark = 1\nlease_ttl_s = 2.5\n")
    cfg = load_config(MasterConfig, f)
    assert cfg.max_batch_items == 4096 and isinstance(cfg.max_batch_items, int)
    assert cfg.high_watermark == 1.0 and cfg.lease_ttl_s == 2.5
    with pytest.raises(ConfigError, match="dram_tier_bytes: size must be a finite number"):
        load_config(ClientdConfig, overrides={"dram_tier_bytes": float("inf")})


@pytest.mark.parametrize("mode", [-1, 0o7777, 0o1000, 99999999999])
def test_socket_mode_outside_the_permission_bits_is_refused(mode: int) -> None:
    """socket_mode = -1 gave both sockets mode 7777 (world read-write: anyone on the
    host could read and write every key); 99999999999 crashed the daemon's start with
    an OverflowError traceback."""
    with pytest.raises(ConfigError, match="socket_mode: must be permission bits"):
        load_config(ClientdConfig, overrides={"socket_mode": mode})
    assert load_config(ClientdConfig, overrides={"socket_mode": 0o600}).socket_mode == 0o600


def test_a_negative_reservation_count_is_refused() -> None:
    """reserve_max_extents = -1 was taken as 0 without a word."""
    from cxlkv.config import MasterConfig

    with pytest.raises(ConfigError, match="reserve_max_extents: must be >= 0"):
        load_config(MasterConfig, overrides={"reserve_max_extents": -1})
    assert load_config(MasterConfig, overrides={"reserve_max_extents": 0}).reserve_max_extents == 0


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:1,bad"])
def test_a_master_address_that_is_not_host_port_says_so(address: str) -> None:
    # before: "'nonsense' is not a loopback address and TLS is not configured"
    with pytest.raises(ConfigError, match=r"master_address: expected HOST:PORT"):
        load_config(ClientdConfig, overrides={"master_address": address})
