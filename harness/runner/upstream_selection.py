"""pytest plugin for `repro upstream-tests`: of upstream's own tests, keep those that run on
the CPU, whatever their ids say.

A test's device is its `device` parametrization (upstream parametrizes with strings and with
`torch.device` objects, whose ids are `device0`, `device1`), else its `device` argument's
default (many tests default to `"cuda"` without a parametrization). A test whose device is
not the CPU is deselected (pytest counts them). A test without a device argument runs where its
helpers put its tensors: it is run, and one that reaches torch's own refusal on a build without
CUDA ("Torch not compiled with CUDA enabled") ran on CUDA: it is skipped with that reason and
the line of the test file that asked, never counted as a failure. A test given the CPU that
reaches it is a failure (a CUDA call where the CPU was asked for). Upstream's file is never
edited or copied.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Generator
from typing import Any

import pytest


def device_of(item: pytest.Item) -> str | None:
    """The device type the test runs on, or None when it takes no device argument."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "device" in callspec.params:
        return _device_type(callspec.params["device"])
    function = getattr(item, "function", None)
    if function is None:
        return None
    try:
        parameter = inspect.signature(function).parameters.get("device")
    except (TypeError, ValueError):
        return None
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return None
    return _device_type(parameter.default)


def _device_type(value: Any) -> str:
    return str(getattr(value, "type", value)).split(":", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    elsewhere: list[pytest.Item] = []
    for item in items:
        (elsewhere if device_of(item) not in (None, "cpu") else kept).append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = kept


NO_CUDA = "Torch not compiled with CUDA enabled"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    error = call.excinfo.value if call.excinfo is not None else None
    if report.failed and device_of(item) is None and error is not None and NO_CUDA in str(error):
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(item.path)]
        where = f" ({item.path.name}:{frames[-1].lineno})" if frames else ""
        why = f"needs CUDA: the test takes no device and its tensors went to CUDA{where}"
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, why)
    return report
