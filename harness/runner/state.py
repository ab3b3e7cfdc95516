"""The conditions a worker observes under: a target shares the worker process with the case's
steps, so what it changes there (at import or in a case: grad mode, default dtype, the torch
functions a case calls) is undone before each case and named in the record. The checks and
the verdict are not here: they are made in the session's controller (harness.engine.compare).

Imported before any target (harness.runner.plugin): the functions a case calls are bound
here at that moment, and the process-wide torch modes a case depends on are taken as they
are then.
"""

from __future__ import annotations

import sys
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


# The target's fusion registries (TE's OperationFuser keeps the passes in class-level lists that
# `register_*_fusion` extends, 2.16 on): as they were once the target had loaded, before its first case.
FUSION_LISTS = ("forward_fusion_functions", "backward_fusion_functions", "forward_backward_fusion_functions")
_fusions_loaded: dict[str, list[Any]] | None = None


def _fusion_lists() -> dict[str, list[Any]]:
    fuser = sys.modules.get("transformer_engine.pytorch.ops.fuser")
    owner = getattr(fuser, "OperationFuser", None)
    return {name: found for name in FUSION_LISTS if isinstance(found := getattr(owner, name, None), list)}


def _named(functions: list[Any]) -> str:
    return ", ".join(getattr(f, "__qualname__", repr(f)) for f in functions)


def restore_fusions(when: str) -> list[str]:
    """Put the target's fusion registries back as they were before its first case; what differed, named."""
    global _fusions_loaded
    lists = _fusion_lists()
    if _fusions_loaded is None:
        _fusions_loaded = {name: list(found) for name, found in lists.items()} if lists else None
        return []
    changed = []
    for name, found in lists.items():
        loaded = _fusions_loaded.get(name, [])
        if found != loaded:
            added, removed = [f for f in found if f not in loaded], [f for f in loaded if f not in found]
            changed.append(f"OperationFuser.{name}: " + "; ".join(
                part for part in (f"added {_named(added)}" if added else "",
                                  f"removed {_named(removed)}" if removed else "",
                                  "reordered" if not added and not removed else "") if part) + f" ({when})")
            found[:] = loaded
    return changed


def restore(when: str) -> list[str]:
    """Put every tool and mode back as it was before any target, and the target's fusion
    registries as it loaded them; what differed, named."""
    changed = restore_fusions(when)
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
