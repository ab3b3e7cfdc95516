"""The checks that compare one run of a target's pipeline with the unfused reference, made by the
judge (harness.engine.compare) outside the target's process, on the values both sides recorded.

Each returns a list of failure descriptions (empty when the check passes), so every
failed check is recorded, not only the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.testing import assert_close  # bound at import, before any target: a target cannot swap the judge's

# Per-dtype tolerances fed to torch.testing.assert_close (as TE's dtype_tols).
TOLERANCES: dict[torch.dtype, dict[str, Any]] = {
    torch.float32: {"rtol": 1.3e-6, "atol": 1e-5},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
    torch.float16: {"rtol": 1e-3, "atol": 1e-3},
}


def tolerance_for(dtype: torch.dtype, compute: torch.dtype | None = None) -> dict[str, Any]:
    """The tolerance for a tensor of `dtype` in a case that computes in `compute`: the looser of
    the two. A float32 parameter's gradient in a bfloat16 model carries bfloat16's rounding (TE's
    own tests pick their tolerance by the model's dtype), and a fused kernel that rounds once
    where the unfused path rounds twice is no bug."""
    if not dtype.is_floating_point:  # integers (split sizes), booleans: exactly
        return {"rtol": 0.0, "atol": 0.0}
    own = TOLERANCES[dtype]
    case = TOLERANCES.get(compute, own) if compute is not None else own
    return {key: max(own[key], case[key]) for key in own}


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str, compute: torch.dtype | None = None,
           largest: float = 0.0) -> list[str]:
    actual, expected = actual.detach(), expected.detach()
    tolerance = scaled(tolerance_for(expected.dtype, compute), max(largest, magnitude(expected)))
    if (actual.shape == expected.shape and actual.dtype == expected.dtype and actual.device == expected.device
            and torch.allclose(actual, expected, **tolerance)):
        return []  # assert_close's own test (|a - e| <= atol + rtol * |e|, NaN unequal), without its setup cost
    try:
        assert_close(actual, expected, **tolerance)
    except AssertionError as exc:
        return [f"{what}: " + "; ".join(line.strip() for line in str(exc).splitlines()[:4] if line.strip())]
    return []


def magnitude(tensor: torch.Tensor | None) -> float:
    """The largest finite magnitude in a floating-point tensor (0 for anything else)."""
    if tensor is None or not tensor.is_floating_point() or tensor.numel() == 0:
        return 0.0
    return float(tensor.detach().abs().max().nan_to_num(0.0, 0.0, 0.0))


def scaled(tolerance: dict[str, Any], largest: float) -> dict[str, Any]:
    """The tolerance with its absolute part at least `rtol` of `largest`, the magnitude of the terms
    that made the tensor. A sum (a weight's gradient over rows, a norm's backward) whose terms round
    in a low precision carries an absolute error of the terms' size, not the result's: an element
    that cancels to near zero is only as exact as the largest term, and a fused kernel that rounds
    once where the unfused path rounds twice moves it by that much. A wrong op is off by the
    terms' own size, far above it."""
    return {**tolerance, "atol": max(tolerance["atol"], tolerance["rtol"] * largest)}


def check_outputs(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], call: str,
                  compute: torch.dtype | None = None) -> list[str]:
    if len(actual) != len(expected):
        return [f"{call}: {len(actual)} outputs, reference has {len(expected)}"]
    failures = []
    for i, (a, e) in enumerate(zip(actual, expected)):
        failures += _close(a, e, f"{call} output {i}", compute)
    return failures


def check_requires_grad_flags(actual: Sequence[bool], expected: Sequence[bool], call: str) -> list[str]:
    """Whether each output requires grad, as the reference's does (flags recorded by each side)."""
    if len(actual) != len(expected):
        return [f"{call}: requires_grad of {len(actual)} outputs, reference {len(expected)}"]
    return [
        f"{call} output {i}: requires_grad={a}, reference {e}"
        for i, (a, e) in enumerate(zip(actual, expected))
        if a != e
    ]


def check_gradients(actual: dict[str, torch.Tensor | None], expected: dict[str, torch.Tensor | None],
                    compute: torch.dtype | None = None) -> list[str]:
    failures = []
    # A gradient is computed from the upstream gradients of the whole backward: bounded by the largest of them.
    largest = max((magnitude(e) for e in expected.values()), default=0.0)
    for name, e in expected.items():
        a = actual.get(name)
        if (a is None) != (e is None):
            failures.append(f"grad of {name}: {'missing' if a is None else 'present'}, reference {'missing' if e is None else 'present'}")
        elif a is not None and e is not None:
            failures += _close(a, e, f"grad of {name}", compute, largest)
    return failures


def snapshot(tensor: torch.Tensor) -> dict[str, Any]:
    """What a caller can observe of its own tensor."""
    return {
        "requires_grad": tensor.requires_grad,
        "is_leaf": tensor.is_leaf,
        "grad_fn": type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else None,
        "version": tensor._version,
        "value": tensor.detach().clone(),
    }


def check_caller_tensors(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
    ref_before: dict[str, dict[str, Any]], ref_after: dict[str, dict[str, Any]], flags_only: bool = False,
) -> list[str]:
    """The call changes the caller's tensors exactly as the reference call does: not at
    all, except what an in-place op changes by design. After a crash (`flags_only`) the
    values are not comparable with a reference that ran to the end; the flags are."""
    failures = []
    if set(before) != set(ref_before) or set(after) != set(ref_before):  # every caller's tensor, seen both times
        failures.append(f"caller's tensors: observed {sorted(before)} before and {sorted(after)} after, "
                        f"reference {sorted(ref_before)}")
    for name in set(before) & set(after) & set(ref_before):
        for key in ("requires_grad", "is_leaf", "grad_fn"):
            if after[name][key] != ref_after[name][key]:
                failures.append(f"caller's {name}.{key}: {before[name][key]} -> {after[name][key]}, reference -> {ref_after[name][key]}")
        if flags_only:
            continue
        bumps = after[name]["version"] - before[name]["version"]
        ref_bumps = ref_after[name]["version"] - ref_before[name]["version"]
        if (bumps > 0) != (ref_bumps > 0):
            failures.append(f"caller's {name} modified in place {bumps} time(s), reference {ref_bumps}")
        failures += _close(after[name]["value"], ref_after[name]["value"], f"caller's {name} value")
    return failures
