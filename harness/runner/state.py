"""The conditions a worker observes under: a target shares the worker process with the case's
steps, so what it changes there (at import or in a case: grad mode, default dtype, the torch
functions a case calls) is undone before each case and named in the record. The checks and
the verdict are not here: they are made in the session's controller (harness.engine.compare).

Imported before any target (harness.runner.plugin): the functions a case calls are bound
here at that moment, and the process-wide torch modes a case depends on are taken as they
are then.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.testing
import torch.utils.checkpoint

# The functions a case and its checks call, as torch defines them.
_TOOLS: dict[str, tuple[Any, str]] = {
    "torch.testing.assert_close": (torch.testing, "assert_close"),
    "torch.randn": (torch, "randn"),  # (torch.manual_seed is rebound by torch itself on a lazy import)
    "torch.no_grad": (torch, "no_grad"), "torch.enable_grad": (torch, "enable_grad"),
    "torch.set_grad_enabled": (torch, "set_grad_enabled"),
    "torch.utils.checkpoint.checkpoint": (torch.utils.checkpoint, "checkpoint"),
    "torch.Tensor.backward": (torch.Tensor, "backward"), "torch.autograd.grad": (torch.autograd, "grad"),
}
_ORIGINAL_TOOLS = {name: getattr(owner, attr) for name, (owner, attr) in _TOOLS.items()}

_set_grad_enabled = torch._C._set_grad_enabled
# name: (read, write); the values are those of a fresh process.
_MODES: dict[str, tuple[Any, Any]] = {
    "grad mode": (torch.is_grad_enabled, _set_grad_enabled),
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "deterministic algorithms": (lambda: (torch.are_deterministic_algorithms_enabled(),
                                          torch.is_deterministic_algorithms_warn_only_enabled()),
                                 lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "anomaly detection": (lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                          lambda v: torch.set_anomaly_enabled(*v)),
    "inference mode": (torch.is_inference_mode_enabled, None),
}
_BASELINE = {name: read() for name, (read, _) in _MODES.items()}


def restore(when: str) -> list[str]:
    """Put every tool and mode back as it was before any target; what differed, named."""
    changed = []
    for name, (owner, attr) in _TOOLS.items():
        if getattr(owner, attr) is not _ORIGINAL_TOOLS[name]:
            changed.append(f"{name} was replaced ({when})")
            setattr(owner, attr, _ORIGINAL_TOOLS[name])
    for name, (read, write) in _MODES.items():
        now = read()
        if now != _BASELINE[name]:
            changed.append(f"{name}: {_BASELINE[name]} -> {now} ({when})")
            if write is not None:
                write(_BASELINE[name])
    return changed


@contextmanager
def guarded() -> Iterator[list[str]]:
    """Around one case: state set before it, checked after it. The list it yields is filled
    with what the target had changed (at import, or since the last case) and what the case changed."""
    changed = restore("at import of the target or between cases")
    try:
        yield changed
    finally:
        changed += restore("during the case")
