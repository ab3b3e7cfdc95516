"""pytest plugin for `repro upstream-tests`: upstream's own tests, run on the CPU backend.

A test's device is its `device` parametrization (upstream parametrizes with strings and with
`torch.device` objects, whose ids are `device0`, `device1`), else its `device` argument's
default. Most of upstream's tests default to `device="cuda"` without a parametrization: such a
test is **placed on the CPU**, called with `device="cpu"` (the device the CPU backend computes
on), so that it runs TE's code as it would on a GPU; quantized variants then skip through
upstream's own `maybe_skip_quantization` ("Quantization is only supported on CUDA devices").
A CUDA parametrization is deselected (pytest counts it): upstream runs the same test with a
CPU parametrization beside it. A test without a device argument runs where its helpers put
its tensors, and one that reaches torch's own refusal on a build without CUDA ("Torch not
compiled with CUDA enabled") is skipped with that reason and the line of the test file that
asked, never counted as a failure; a test given the CPU, or placed there, that reaches it is a
failure (a CUDA call where the CPU was asked for). Upstream's file is never edited or copied.
"""

from __future__ import annotations

import inspect
import traceback
import warnings
from collections.abc import Generator
from typing import Any

import pytest

from harness.runner.upstream_failures import NO_CUDA

# The warnings a test's call raised: a failed test carries them to the junit XML, where
# `repro upstream-tests` reads why it failed (harness.runner.upstream_failures).
_CALL_WARNINGS = pytest.StashKey[list[str]]()


def device_of(item: pytest.Item) -> str | None:
    """The device type the test asks for, or None when it takes no device argument."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "device" in callspec.params:
        return _device_type(callspec.params["device"])
    default = _device_default(item)
    return None if default is None else _device_type(default)


def _device_default(item: pytest.Item) -> Any:
    """The default of the test function's `device` argument, or None."""
    function = getattr(item, "function", None)
    try:
        parameter = inspect.signature(function).parameters.get("device") if function else None
    except (TypeError, ValueError):
        return None
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def placed_on_cpu(item: pytest.Item) -> bool:
    """A test whose device comes from its default, and the default is not the CPU."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "device" in callspec.params:
        return False
    default = _device_default(item)
    return default is not None and _device_type(default) != "cpu"


def _device_type(value: Any) -> str:
    return str(getattr(value, "type", value)).split(":", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    elsewhere: list[pytest.Item] = []
    for item in items:
        (elsewhere if device_of(item) not in (None, "cpu") and not placed_on_cpu(item) else kept).append(item)
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Call a test placed on the CPU with `device="cpu"`; pytest passes only its fixtures and
    parametrizations, so an argument with a default is ours to give."""
    if not placed_on_cpu(pyfuncitem):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    pyfuncitem.obj(**arguments, device="cpu")
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # Under the filters in force (pytest's: each warning once per place), not "always": a
    # warning raised in a loop would be kept once per iteration.
    try:
        with warnings.catch_warnings(record=True) as caught:
            return (yield)
    finally:
        item.stash[_CALL_WARNINGS] = list(dict.fromkeys(str(w.message)[:500] for w in caught))[:20]
        # Raised again outside the recording, so that pytest's own warning summary still has them.
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and call.when == "call":
        # On the item: pytest's junit XML writes the properties of the teardown's report, a copy of the item's.
        item.user_properties.extend(("warning", text) for text in item.stash.get(_CALL_WARNINGS, []))
    error = call.excinfo.value if call.excinfo is not None else None
    if report.failed and device_of(item) is None and error is not None and NO_CUDA in str(error):
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(item.path)]
        where = f" ({item.path.name}:{frames[-1].lineno})" if frames else ""
        why = f"needs CUDA: the test takes no device and its tensors went to CUDA{where}"
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, why)
    return report
