"""Packaging as pip and operators see it: one abi3 wheel with the .proto files and
the build's commit, an sdist with proto/, deploy/, docs/ and the licence, a
`make install` that remakes a .venv of another Python. The wheel build is real
(`pip wheel`, about a minute: marked slow)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_licence_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def test_version_names_the_commit() -> None:
    r = subprocess.run([sys.executable, "-m", "cxlkv.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert r.stdout.startswith("cxlkv 0.") and f"(commit {head}" in r.stdout, r.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_install_remakes_a_venv_of_another_python(tmp_path: Path) -> None:
    # a .venv made by this Python, and a PYTHON of another version (a stand-in script reporting 3.99)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    other = tmp_path / "python3.99"
    other.write_text("#!/bin/sh\necho cpython 3 99\n")
    other.chmod(0o755)
    r = subprocess.run(["make", "-n", "-C", str(ROOT), "install", f"VENV={venv}", f"PYTHON={other}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"rm -rf {venv}" in r.stdout and "not by" in r.stdout, r.stdout
    # the same Python: the .venv is kept
    r = subprocess.run(["make", "-n", "-C", str(ROOT), "install", f"VENV={venv}", f"PYTHON={sys.executable}"],
                       capture_output=True, text=True, timeout=60)
    assert f"rm -rf {venv}" not in r.stdout, r.stdout


@pytest.mark.slow
def test_wheel_and_sdist_contents(tmp_path: Path) -> None:
    env = {**os.environ, "PIP_NO_INPUT": "1"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = glob.glob(str(tmp_path / "dist" / "*.whl"))
    assert Path(wheel).name.startswith("cxlkv-") and "-cp311-abi3-" in Path(wheel).name, wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    for proto in ("client", "common", "master"):
        assert f"cxlkv/v1/{proto}.proto" in names
    assert "cxlkv/_commit.txt" in names and any(n.endswith(".abi3.so") for n in names)
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any("bench/results" in n for n in names)
    c_files = sorted(p.name for p in (ROOT / "transport" / "c").iterdir() if p.suffix in (".c", ".h"))
    assert "internal.h" in c_files and "dispatch.c" in c_files
    for name in c_files:  # the C files by concern travel with the package (and the sdist, below)
        assert f"cxlkv/transport/c/{name}" in names, name
    assert "cxlkv/transport/cxlkv_transport.h" in names

    from setuptools import build_meta  # noqa: F401  (the backend pyproject.toml names)

    r = subprocess.run([sys.executable, "-c", f"import os; os.chdir({str(ROOT)!r}); from setuptools import "
                        f"build_meta; print(build_meta.build_sdist({str(tmp_path / 'sdist')!r}))"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (sdist,) = glob.glob(str(tmp_path / "sdist" / "*.tar.gz"))
    members = tarfile.open(sdist).getnames()
    top = members[0].split("/")[0]
    for path in ("LICENSE", "proto/cxlkv/v1/master.proto", "deploy/systemd/cxlkv-master.service",
                 "docs/operations.md", "cxlkv/_commit.txt", "Makefile", "transport/cxlkv_transport.h",
                 *(f"transport/c/{name}" for name in c_files)):
        assert f"{top}/{path}" in members, path
