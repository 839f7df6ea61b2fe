"""The one error hierarchy and its wire mapping."""

from __future__ import annotations

import pickle

import grpc
import pytest
from grpc_status import rpc_status

from cxlkv import errors
from cxlkv.wire.keys import MAX_KEY_BYTES, key_error, validate_key


def test_builtin_doubles() -> None:
    assert isinstance(errors.NotFound("x"), KeyError)
    assert isinstance(errors.InvalidKey("x"), ValueError)
    assert isinstance(errors.Unavailable("x"), ConnectionError)
    assert str(errors.NotFound("no such key 'a'")) == "no such key 'a'"


def test_round_trip_through_status_and_pickle() -> None:
    err = errors.NoSpace("full", key="k", requested_bytes=10, free_bytes=3)
    back = errors.from_status(err.to_status(), key="k")
    assert isinstance(back, errors.NoSpace) and back.message == "full" and back.key == "k"
    assert errors.from_status(errors.common_pb2.Status()) is None
    p = pickle.loads(pickle.dumps(err))
    assert isinstance(p, errors.NoSpace) and p.requested_bytes == 10 and p.free_bytes == 3
    with pytest.raises(errors.HasLease):
        errors.raise_for_status(errors.HasLease("leased").to_status())
    assert isinstance(errors.error_for(999, "x"), errors.Internal)


def test_rpc_status_carries_detail() -> None:
    err = errors.TooLarge("too big", key="k", requested_bytes=1 << 40)
    st = rpc_status.to_status(errors.rpc_status_for(err))
    assert st.code == grpc.StatusCode.OUT_OF_RANGE

    class FakeCall(grpc.RpcError):
        def code(self):
            return st.code

        def details(self):
            return st.details

        def trailing_metadata(self):
            return st.trailing_metadata

    back = errors.from_rpc_error(FakeCall())
    assert isinstance(back, errors.TooLarge) and back.requested_bytes == 1 << 40 and back.key == "k"


def test_bare_resource_exhausted_is_a_limit_by_code_not_wording() -> None:
    """gRPC's own RESOURCE_EXHAUSTED (no ErrorDetail) is LimitExceeded whatever its
    text; a NO_SPACE carries its detail and stays NoSpace."""

    class Bare(grpc.RpcError):
        def __init__(self, text: str) -> None:
            self.text = text

        def code(self):
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self):
            return self.text

        def trailing_metadata(self):
            return ()

    for text in ("Received message larger than max (40000000 vs. 33554432)", "worded some other way"):
        back = errors.from_rpc_error(Bare(text), target="clientd")
        assert isinstance(back, errors.LimitExceeded) and back.limit_name == "max_request_bytes"
        assert text in back.message
    st = rpc_status.to_status(errors.rpc_status_for(errors.NoSpace("full", free_bytes=3)))

    class Full(Bare):
        def trailing_metadata(self):
            return st.trailing_metadata

    back = errors.from_rpc_error(Full(st.details))
    assert isinstance(back, errors.NoSpace) and back.free_bytes == 3


def test_keys() -> None:
    assert validate_key("a/b c ü🙂") == "a/b c ü🙂"
    assert key_error("x" * MAX_KEY_BYTES) is None
    assert "4097" in key_error("x" * (MAX_KEY_BYTES + 1))
    assert key_error("é" * 2049) is not None  # 4098 UTF-8 bytes
    assert key_error("") and key_error("a\x00b") and key_error(b"bytes")
    assert "surrogate" in key_error("k\udc80")  # short keys too
    with pytest.raises(errors.InvalidKey):
        validate_key("")
