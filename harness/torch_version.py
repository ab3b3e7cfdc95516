"""The installed torch's version, read from its metadata: the CLI and the run's controller
record it without importing torch (two seconds, paid before any worker could start)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def torch_version() -> str:
    try:
        return version("torch")
    except PackageNotFoundError:
        return "not installed"
