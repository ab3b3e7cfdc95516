"""Test-only: loaded into a target session through PYTEST_PLUGINS, it notes in the file named
by REPRO_TEST_TEARDOWN_PROBE each worker's session finish and, from an atexit handler, its
interpreter teardown. Production code never imports this module."""

from __future__ import annotations

import atexit
import os

import pytest

ENV = "REPRO_TEST_TEARDOWN_PROBE"
PLUGIN = "tests.teardown_probe"


def _note(what: str) -> None:
    with open(os.environ[ENV], "a") as handle:
        handle.write(f"{os.getpid()} {what}\n")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        atexit.register(_note, "teardown")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        _note("sessionfinish")
