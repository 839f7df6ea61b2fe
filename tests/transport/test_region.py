"""Tests of the region identity header and the `cxlkv region` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from click.testing import CliRunner

from cxlkv.cli import main
from cxlkv.errors import InvalidArgument, RegionError
from cxlkv.layout.region import (
    FORMAT_VERSION,
    HEADER_MAGIC,
    REGION_HEADER_BYTES,
    RegionIdentity,
    format_region,
    read_identity,
)
from cxlkv.transport import Region

MiB = 1 << 20


@pytest.fixture
def region(tmp_path):
    with Region.open(tmp_path / "region", size=4 * MiB, create=True) as r:
        yield r


def test_format_then_read(region):
    ident = format_region(region, "cxl-0", created_s=1_700_000_000.5)
    assert isinstance(ident, RegionIdentity)
    assert ident.segment_name == "cxl-0" and ident.size_bytes == 4 * MiB
    assert ident.region_uuid.version == 4 and ident.format_version == FORMAT_VERSION
    assert ident.created_s == 1_700_000_000.5
    assert read_identity(region) == ident
    assert region.read(0, 8) == HEADER_MAGIC
    assert region.read(152, REGION_HEADER_BYTES - 152) == bytes(REGION_HEADER_BYTES - 152)
    geo = ident.index
    assert geo is not None and ident.data_end_bytes == geo.index_offset_bytes
    assert geo.index_offset_bytes + geo.index_bytes <= 4 * MiB and geo.index_offset_bytes % 4096 == 0
    with pytest.raises(AttributeError):
        ident.segment_name = "other"  # type: ignore[misc]


def test_identity_survives_reopen_and_is_shared(tmp_path):
    path = tmp_path / "r"
    with Region.open(path, size=MiB, create=True) as r:
        ident = format_region(r, "naïve-ünïcode")
    with Region.open(path) as r:
        assert read_identity(r) == ident
    code = (
        "from cxlkv.transport import Region; from cxlkv.layout.region import read_identity\n"
        f"with Region.open({str(path)!r}) as r: print(read_identity(r).region_uuid)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == str(ident.region_uuid)


def test_refuses_reformat_unless_forced(region):
    first = format_region(region, "a")
    with pytest.raises(RegionError, match=f"already formatted .*'a'.*{first.region_uuid}"):
        format_region(region, "b")
    assert read_identity(region) == first
    second = format_region(region, "b", force=True)
    assert second.region_uuid != first.region_uuid
    assert read_identity(region) == second


def test_unformatted_region(region):
    with pytest.raises(RegionError, match=r"is not formatted \(run `cxlkv region format") as ei:
        read_identity(region)
    assert ei.value.path == region.path
    region.copy_in(0, b"garbage!")
    with pytest.raises(RegionError, match="not formatted"):
        read_identity(region)


@pytest.mark.parametrize("offset", [8, 16, 40, 60, 120])
def test_corrupt_header_detected(region, offset):
    format_region(region, "seg")
    byte = region.read(offset, 1)[0]
    region.copy_in(offset, bytes([byte ^ 0x01]))
    with pytest.raises(RegionError, match="corrupt header"):
        read_identity(region)
    with pytest.raises(RegionError, match="already formatted \\(a corrupt header\\)"):
        format_region(region, "seg")
    format_region(region, "seg", force=True)
    assert read_identity(region).segment_name == "seg"


def test_resized_region_detected(tmp_path):
    path = tmp_path / "r"
    with Region.open(path, size=MiB, create=True) as r:
        format_region(r, "seg")
    os.truncate(path, 2 * MiB)
    with Region.open(path) as r, pytest.raises(RegionError, match=r"2097152 bytes but its header records 1048576"):
        read_identity(r)


def test_region_smaller_than_header(tmp_path):
    with Region.open(tmp_path / "tiny", size=1024, create=True) as r:
        with pytest.raises(RegionError, match="smaller than its 4096-byte header"):
            format_region(r, "seg")
        with pytest.raises(RegionError, match="smaller"):
            read_identity(r)


@pytest.mark.parametrize("name", ["", "x" * 65, "é" * 33, "a\0b"])
def test_bad_segment_names(region, name):
    with pytest.raises(InvalidArgument):
        format_region(region, name)
    with pytest.raises(RegionError, match="not formatted"):
        read_identity(region)  # nothing was written


def test_segment_name_limit_is_64_bytes(region):
    assert format_region(region, "é" * 32).segment_name == "é" * 32


def test_to_dict_is_json_ready(region):
    ident = format_region(region, "seg", region_uuid=uuid.UUID(int=7, version=4))
    d = json.loads(json.dumps(ident.to_dict()))
    assert d["region_uuid"] == str(ident.region_uuid) and d["size_bytes"] == 4 * MiB


# -- CLI ---------------------------------------------------------------------------------

def test_cli_format_and_info(tmp_path):
    path = str(tmp_path / "r")
    runner = CliRunner()
    res = runner.invoke(main, ["region", "format", path, "--segment", "cxl-a", "--size", "8MiB", "--create"])
    assert res.exit_code == 0, res.output
    assert "cxl-a" in res.output and "8388608 bytes" in res.output
    res = runner.invoke(main, ["region", "info", path, "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["segment_name"] == "cxl-a" and info["size_bytes"] == 8 * MiB and info["path"] == path
    res = runner.invoke(main, ["region", "format", path, "--segment", "cxl-b"])
    assert res.exit_code == 1 and "already formatted" in res.output and "Traceback" not in res.output
    res = runner.invoke(main, ["region", "format", path, "--segment", "cxl-b", "--force", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["segment_name"] == "cxl-b"


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    cases = [
        (["region", "info", str(tmp_path / "absent")], "does not exist"),
        (["region", "info", "/dev/null"], "not a regular file"),
        (["region", "format", str(tmp_path / "x"), "--segment", "s", "--create"], "--create needs --size"),
        (["region", "format", str(tmp_path / "x"), "--segment", "s", "--size", "lots"], "cannot parse size"),
    ]
    for args, message in cases:
        res = runner.invoke(main, args)
        assert res.exit_code != 0 and message in res.output, (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    unformatted = tmp_path / "blank"
    unformatted.write_bytes(bytes(MiB))
    for cmd in ("info", "scan", "verify"):  # not "0 object(s) checked" on a file that is not a region
        res = runner.invoke(main, ["region", cmd, str(unformatted)])
        assert res.exit_code == 1 and "is not formatted" in res.output, (cmd, res.output)
    # a refused format --create leaves no file behind (it made one to format)
    for bad in (["--segment", ""], ["--segment", "s", "--expected-objects", "100000000"]):
        made = tmp_path / "refused"
        res = runner.invoke(main, ["region", "format", str(made), "--create", "--size", "8MiB", *bad])
        assert res.exit_code == 1 and not made.exists(), (bad, res.output)
    with Region.open(unformatted) as r:
        format_region(r, "seg")
    res = runner.invoke(main, ["region", "format", str(unformatted), "--segment", "s", "--size", "2MiB"])
    assert res.exit_code == 1 and "1048576 bytes, but 2097152 bytes were requested" in res.output
