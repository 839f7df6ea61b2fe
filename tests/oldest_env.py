"""The SDK's oldest supported environment (.venv-oldest, made by `make oldest`).

It holds the floors of the SDK's dependency ranges (grpcio 1.70.0, protobuf
5.29.0, numpy 1.26.4, …: ``OLDEST_PINS`` in the Makefile), the pinned
grpcio-tools that `make proto` runs, and cxlkv installed editable from this
checkout. Tests that need it call :func:`oldest_python`, which runs `make oldest`
first (a no-op when the environment is up to date; about 30 s and ~70 MB of
downloads when it is not).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Longest `make oldest` may take, in seconds (pip downloads on a cold cache).
BUILD_TIMEOUT_S = 600


def oldest_python() -> Path:
    """The interpreter of .venv-oldest, built or refreshed by `make oldest` first.

    Raises:
        subprocess.CalledProcessError: `make oldest` failed (e.g. pip could not
            resolve the pinned floors: the SDK's ranges are wrong). Its output is
            in the exception.
    """
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    subprocess.run(["make", "-s", "oldest"], cwd=ROOT, check=True, timeout=BUILD_TIMEOUT_S, env=env,
                   capture_output=True, text=True)
    return ROOT / ".venv-oldest" / "bin" / "python"
