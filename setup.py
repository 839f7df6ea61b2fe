"""Build hook for the cffi transport extension (everything else is in pyproject.toml)."""

from setuptools import setup

setup(cffi_modules=["transport/build_transport.py:ffibuilder"])
