"""Key and put-option rules shared by every component (DESIGN.md, Contracts).

A key is a UTF-8 string of 1–4096 bytes without NUL. Keys are compared as exact
strings; ``/``, spaces and any Unicode are allowed. A put asks for 1 to
:data:`MAX_REPLICA_NUM` replicas (on the wire, ``replica_num`` 0 means 1).
"""

from __future__ import annotations

from typing import Any, Sequence

from cxlkv.errors import InvalidArgument, InvalidKey

__all__ = ["MAX_KEY_BYTES", "MAX_REPLICA_NUM", "validate_key", "key_error", "replica_num_error",
           "validate_replica_num", "options_error", "compile_key_pattern", "MAX_PATTERN_BYTES",
           "prefix_chains", "pack_prefix_chains"]

#: Longest pattern ``remove_all(regex=...)`` accepts, in UTF-8 bytes.
MAX_PATTERN_BYTES = 4096
#: Most memory RE2 may use to compile one pattern, in bytes (RE2's own default is 8 MiB).
_PATTERN_MEM_BYTES = 8 << 20

#: Longest key, in UTF-8 bytes.
MAX_KEY_BYTES = 4096
#: Most replicas one put may ask for (each on a distinct segment; best effort).
MAX_REPLICA_NUM = 16


def replica_num_error(replica_num: object, *, zero_means_one: bool = False) -> str | None:
    """Why ``replica_num`` is not a valid replica count, or ``None`` when it is.

    Args:
        replica_num: the count asked for (1..:data:`MAX_REPLICA_NUM`).
        zero_means_one: accept 0 (the protobuf default on the wire: one replica).
    """
    if isinstance(replica_num, bool) or not isinstance(replica_num, int):
        return f"replica_num must be an int, got {type(replica_num).__name__}"
    low = 0 if zero_means_one else 1
    if not low <= replica_num <= MAX_REPLICA_NUM:
        return f"replica_num must be 1..{MAX_REPLICA_NUM}, got {replica_num}"
    return None


def validate_replica_num(replica_num: object) -> int:
    """Return ``replica_num`` if it is 1..:data:`MAX_REPLICA_NUM`.

    Raises:
        InvalidArgument: not an int, or outside 1..MAX_REPLICA_NUM.
    """
    why = replica_num_error(replica_num)
    if why is not None:
        raise InvalidArgument(why)
    return replica_num  # type: ignore[return-value]


def options_error(options: Any) -> str | None:
    """Why wire ``PutOptions`` (or ``None``) are invalid, or ``None`` when they are fine."""
    if options is None:
        return None
    return replica_num_error(options.replica_num, zero_means_one=True)


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


def compile_key_pattern(pattern: str) -> Any:
    """Compile a key pattern of ``RemoveAll`` (its ``pattern``) / ``remove_all(regex=...)`` with RE2.

    RE2 (the ``google-re2`` package) matches in time linear in the key's length
    whatever the pattern: a pattern such as ``(a+)+$`` that makes a backtracking
    engine (Python's ``re``) run for minutes on one long key costs RE2 microseconds.
    The syntax is RE2's (docs/sdk.md): Python's ``re`` without backreferences and
    look-around. Matching is ``search`` (anywhere in the key; anchor with ``^``).

    Returns:
        The compiled pattern (its ``search(key)`` returns a match or ``None``).

    Raises:
        InvalidArgument: the pattern is over :data:`MAX_PATTERN_BYTES`, or RE2
            cannot compile it (the message says why).
    """
    import re2

    if not isinstance(pattern, str):
        raise InvalidArgument(f"regex must be a str, got {type(pattern).__name__}")
    if len(pattern.encode("utf-8", "surrogatepass")) > MAX_PATTERN_BYTES:
        raise InvalidArgument(f"regex of {len(pattern.encode('utf-8', 'surrogatepass'))} bytes is over the "
                              f"limit of {MAX_PATTERN_BYTES} bytes")
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _PATTERN_MEM_BYTES
    try:
        return re2.compile(pattern, options=options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        if isinstance(why, bytes):
            why = why.decode("utf-8", "replace")
        raise InvalidArgument(f"bad regular expression {pattern!r} (RE2 syntax: no backreferences or "
                              f"look-around): {why}") from None
    except (TypeError, UnicodeError) as exc:
        raise InvalidArgument(f"bad regular expression {pattern!r}: {exc}") from None


def prefix_chains(keys: Sequence[str], lengths: Sequence[int],
                  matched: Sequence[int]) -> list[tuple[Sequence[str], int]]:
    """Split the packed prefix-query columns of a hit report into ``(chain, matched)``.

    ``ReportReadsRequest.prefix_keys / prefix_lengths / prefix_matched`` (and the
    ``chain_*`` fields of the SDK's report to its daemon): query ``i`` asked for the
    ``lengths[i]`` keys after those of the queries before it and found its first
    ``matched[i]`` cached.

    Raises:
        InvalidArgument: the columns disagree (counts, a total other than
            ``len(keys)``, a match longer than its query).
    """
    if len(lengths) != len(matched):
        raise InvalidArgument(f"{len(lengths)} prefix lengths with {len(matched)} matched counts")
    if sum(lengths) != len(keys):
        raise InvalidArgument(f"prefix lengths add up to {sum(lengths)}, not the {len(keys)} prefix keys")
    out: list[tuple[Sequence[str], int]] = []
    at = 0
    for n, m in zip(lengths, matched):
        if m > n:
            raise InvalidArgument(f"a prefix query of {n} keys cannot match {m}")
        out.append((keys[at:at + n], m))
        at += n
    return out


def pack_prefix_chains(chains: Sequence[tuple[Sequence[str], int]]) -> tuple[list[str], list[int], list[int]]:
    """The inverse of :func:`prefix_chains`: ``(keys, lengths, matched)`` columns."""
    keys: list[str] = []
    for chain, _ in chains:
        keys.extend(chain)
    return keys, [len(c) for c, _ in chains], [m for _, m in chains]
