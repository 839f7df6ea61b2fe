"""Build hooks (everything else is in pyproject.toml): the cffi transport
extension, built for the stable ABI (one abi3 wheel serves every CPython >= 3.11),
and the git commit recorded in the package (``cxlkv --version``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent


def _git_commit() -> str | None:
    try:
        sha = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def _write_commit(package_dir: Path) -> None:
    sha = _git_commit()
    if sha is None:  # building from an sdist: it carries the file already
        return
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / "_commit.txt").write_text(sha + "\n")


def _copy_protos(package_dir: Path) -> None:
    """proto/cxlkv/v1/*.proto beside the generated modules (cxlkv/v1/), so the
    installed tree is an include root for protoc (``import "cxlkv/v1/common.proto"``)."""
    src = HERE / "proto" / "cxlkv" / "v1"
    if not src.is_dir():
        return
    dst = package_dir / "v1"
    dst.mkdir(parents=True, exist_ok=True)
    for proto in sorted(src.glob("*.proto")):
        (dst / proto.name).write_bytes(proto.read_bytes())


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads the checkout itself
            _write_commit(Path(self.build_lib) / "cxlkv")
            _copy_protos(Path(self.build_lib) / "cxlkv")


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        _write_commit(Path(base_dir) / "cxlkv")


setup(
    # cffi builds the extension with py_limited_api (the .abi3.so); the wheel's tag
    # says so: cp311-abi3, installable on every CPython >= 3.11 (PEP 384, PEP 425).
    cffi_modules=["transport/build_transport.py:ffibuilder"],
    cmdclass={"build_py": BuildPy, "sdist": Sdist},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
