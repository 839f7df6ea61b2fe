"""A click parameter type for sizes: parsed once by :func:`cxlkv.config.parse_size`,
a bad one is a usage error (exit 2, as ``cxlkv config check``), and a decimal unit
is said out loud on stderr (``"1GB" is decimal (SI): 1000000000 bytes (953.7 MiB) …``).
"""

from __future__ import annotations

from typing import Any

import click

from cxlkv.config import parse_size, size_note
from cxlkv.errors import CxlkvError

__all__ = ["Size"]


class Size(click.ParamType):
    """``--size 64MiB`` → ``67108864`` (int, bytes).

    Args:
        min_bytes: the smallest size accepted (``1``: a size must be positive).
        note: print :func:`~cxlkv.config.size_note` for decimal units to stderr.
    """

    name = "size"

    def __init__(self, min_bytes: int = 0, *, note: bool = True) -> None:
        self.min_bytes = min_bytes
        self.note = note

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            name = param.opts[0] if param is not None and param.opts else "size"
            try:
                n = parse_size(value, name=name)
            except CxlkvError as exc:
                # the message already names the option: say the rest only
                self.fail(exc.message.removeprefix(f"{name}: "), param, ctx)
            if self.note and (text := size_note(value, n)) is not None:
                click.echo(f"note: {name} {text}", err=True)
        if n < self.min_bytes:
            self.fail(f"must be at least {self.min_bytes} byte{'s' if self.min_bytes != 1 else ''}, got {value!r}",
                      param, ctx)
        return n
