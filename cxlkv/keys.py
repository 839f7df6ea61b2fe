"""Key rules shared by every component (DESIGN.md, Contracts).

A key is a UTF-8 string of 1–4096 bytes without NUL. Keys are compared as exact
strings; ``/``, spaces and any Unicode are allowed.
"""

from __future__ import annotations

from cxlkv.errors import InvalidKey

__all__ = ["MAX_KEY_BYTES", "validate_key", "key_error"]

#: Longest key, in UTF-8 bytes.
MAX_KEY_BYTES = 4096


def key_error(key: object) -> str | None:
    """Why ``key`` is not a valid key, or ``None`` when it is.

    Constant time for ASCII keys (the common case on the master's per-key path);
    other keys are encoded once to count their UTF-8 bytes and catch lone
    surrogates, which no UTF-8 string can hold.
    """
    if not isinstance(key, str):
        return f"key must be a str, got {type(key).__name__}"
    if not key:
        return "key is empty (keys are 1-4096 UTF-8 bytes)"
    if "\x00" in key:
        return "key contains NUL"
    if key.isascii():  # O(1) for ASCII keys (CPython keeps the flag): length is bytes
        if len(key) > MAX_KEY_BYTES:
            return f"key is {len(key)} bytes; the limit is {MAX_KEY_BYTES} UTF-8 bytes"
        return None
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "key is not valid UTF-8 (lone surrogate)"
    if n > MAX_KEY_BYTES:
        return f"key is {n} bytes; the limit is {MAX_KEY_BYTES} UTF-8 bytes"
    return None


def validate_key(key: object) -> str:
    """Return ``key`` if valid.

    Raises:
        InvalidKey: empty, over 4096 UTF-8 bytes, not UTF-8, contains NUL, or not a str.
    """
    why = key_error(key)
    if why is not None:
        shown = key[:64] + "…" if isinstance(key, str) and len(key) > 64 else key
        raise InvalidKey(why, key=shown if isinstance(shown, str) else None)
    return key  # type: ignore[return-value]
