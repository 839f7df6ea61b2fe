"""cxlkv's version, and the git commit it was built from."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__version__ = "0.1.0"

#: Written into built wheels and sdists by setup.py (the commit of the checkout
#: they were built from); absent in a source checkout.
_COMMIT_FILE = Path(__file__).with_name("_commit.txt")


@functools.cache
def commit() -> str:
    """The git commit (12 hex digits, ``+dirty`` when the checkout has local
    changes) of this cxlkv: read from the checkout an editable install runs from,
    else the one recorded at build time, else ``"unknown"``."""
    here = Path(__file__).resolve().parent
    if (here.parent / ".git").exists():
        try:
            sha = subprocess.run(["git", "-C", str(here.parent), "rev-parse", "--short=12", "HEAD"],
                                 capture_output=True, text=True, timeout=5, check=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(here.parent), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return sha + ("+dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return _COMMIT_FILE.read_text().strip() or "unknown"
    except OSError:
        return "unknown"
