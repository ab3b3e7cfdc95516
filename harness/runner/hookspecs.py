"""Hooks the case runner calls, for plugins loaded into the target sessions (as
pytest-xdist offers `pytest_handlecrashitem`). The fault-injection tests implement
`pytest_repro_case_started` in a plugin under tests/; production code implements none."""

from __future__ import annotations

import pytest


@pytest.hookspec
def pytest_repro_case_started(case_id: str) -> None:
    """Called in the worker just before a case runs."""
