"""Fixtures of the master's in-process tests."""

from __future__ import annotations

import os
import uuid

import pytest

from cxlkv.config import MasterConfig, SegmentConfig
from cxlkv.layout.region import format_region
from cxlkv.transport import Region

MiB = 1 << 20


@pytest.fixture()
def region_cfg():
    """``(path, MasterConfig)``: a formatted 16 MiB region file in /dev/shm (segment
    ``cxl0``, index for 4,096 objects), deleted afterwards."""
    path = f"/dev/shm/cxlkv-test-master-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    size = 16 * MiB
    with Region.open(path, size=size, create=True) as r:
        format_region(r, "cxl0", expected_objects=4096)
    cfg = MasterConfig(listen_address="127.0.0.1:0", metrics_address="", lean_listen_address="off",
                       segments=[SegmentConfig(name="cxl0", size_bytes=size, path=path)], owner_lease_ttl_s=1.0)
    yield path, cfg
    if os.path.exists(path):
        os.unlink(path)
