"""How the call scenario calls a pipeline and what it observes of one side, with no target in
sight: the worker runs it on the target's pipeline, the run's judge on plain PyTorch.

Every random value of a case (the input, the residual, the parameters, the loss weights) comes
from a generator seeded by the case's id, never from the process's global one, so the
reference computed in a process that never imported a target sees the same values as each
target's worker, whatever a target's constructors draw.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from cases.axes import INPUTS_REQUIRING_GRAD
from cases.case import Case
from cases.clients import BLOCK_RECOMPUTES
from cases.pipelines import PIPELINES
from harness.engine.checks import snapshot


def case_seed(case: Case) -> int:
    """The same on every target: the id without its regression prefix."""
    return zlib.crc32(case.case_id.split(":", 1)[1].encode())


def generator(seed: int, stream: int) -> torch.Generator:
    """A CPU generator of its own for one kind of value (0: inputs, 1: parameters, 2: loss weights)."""
    return torch.Generator().manual_seed(seed * 4 + stream)


def input_values(case: Case, shape: Sequence[int], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's values and its residual's, on the case's device. The residual has the input's
    shape, or the one a generated pipeline declares for the op that takes it."""
    g = generator(case_seed(case), 0)
    pipeline = PIPELINES.get(case.get("pipeline") or "")
    residual_shape = pipeline.extra_input_shapes[0] if pipeline and pipeline.extra_input_shapes else shape
    return (torch.randn(*shape, generator=g).to(case.device, dtype),
            torch.randn(*residual_shape, generator=g).to(case.device, dtype))


def parameter_values(case: Case, params: Sequence[tuple[str, Sequence[int]]], dtype: torch.dtype) -> list[torch.Tensor]:
    """Values for a pipeline's parameters, by name and shape, in order, at the scale TE's own
    initialisation gives them, without its constant values that would hide a wrong product: a
    norm's scale near one, a bias near zero, a linear weight uniform within 1/sqrt(fan-in)."""
    g = generator(case_seed(case), 1)
    values = []
    for name, shape in params:
        if len(shape) > 1:
            value = (torch.rand(*shape, generator=g) * 2 - 1) / math.sqrt(shape[-1])
        elif name.rsplit(".", 1)[-1].startswith("bias"):
            value = 0.1 * torch.randn(*shape, generator=g)
        else:
            value = 1 + 0.1 * torch.randn(*shape, generator=g)
        values.append(value.to(case.device, dtype))
    return values


def loss_weights(case: Case, outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    g = generator(case_seed(case), 2)
    return [torch.randn(*o.shape, generator=g).to(case.device) for o in outputs]


@contextlib.contextmanager
def grad_mode(name: str) -> Iterator[None]:
    if name == "enabled":
        with torch.enable_grad():
            yield
    elif name == "no_grad":
        with torch.no_grad():
            yield
    elif name == "inference_mode":
        with torch.inference_mode():
            yield
    else:  # enable_grad_inside_no_grad
        with torch.no_grad(), torch.enable_grad():
            yield


Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


def torch_checkpoint(reentrant: bool) -> Wrapper:
    return lambda function: lambda *args: torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=reentrant)


def wrap(function: Callable[..., Any], recompute: str, megatron: Wrapper | None = None) -> Callable[..., Any]:
    """The case's recompute wrapper around `function`. `megatron`: Megatron's own checkpoint (in a
    target's worker); without it, its semantics in plain PyTorch: a reentrant checkpoint, which
    also runs the forward under no_grad and again in backward (the reference's)."""
    if recompute == "none" or recompute in BLOCK_RECOMPUTES:  # a block's own recompute is built into it
        return function
    if recompute == "megatron":
        return (megatron or torch_checkpoint(True))(function)
    return torch_checkpoint(recompute == "checkpoint_reentrant")(function)


def make_inputs(case: Case, values: torch.Tensor, residual: torch.Tensor) -> dict[str, torch.Tensor]:
    """The caller's tensors for one input kind: 'x' is what is passed, 'base' the leaf behind it."""
    wants_grad = case.input in INPUTS_REQUIRING_GRAD
    tensors: dict[str, torch.Tensor] = {}
    if case.input == "leaf":
        tensors["x"] = values.clone()
    elif case.input == "leaf_requires_grad":
        tensors["x"] = values.clone().requires_grad_()
    elif case.input == "non_leaf":
        tensors["base"] = (values / 2).requires_grad_()
        tensors["x"] = tensors["base"] * 2
    elif case.input == "view":
        tensors["base"] = values.clone().reshape(-1).requires_grad_()
        tensors["x"] = tensors["base"].view(values.shape)
    else:  # detached
        tensors["base"] = values.clone().requires_grad_()
        tensors["x"] = (tensors["base"] * 1).detach()
    pipeline = PIPELINES[case.pipeline] if case.get("pipeline") else None
    if pipeline is not None and pipeline.fixed_extra_input is not None:  # integers (split sizes): no gradient
        tensors["residual"] = torch.tensor(pipeline.fixed_extra_input, device=case.device)
    elif pipeline is not None and pipeline.num_extra_inputs:
        tensors["residual"] = residual.clone().requires_grad_(wants_grad)
    return tensors


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _calls(case: Case, function: Callable[..., Any], args: list[torch.Tensor],
           megatron: Wrapper | None) -> list[tuple[torch.Tensor, ...]]:
    """Every call the case makes; the last one is the one backward runs through."""
    if case.sequence == "recompute_pattern":
        with torch.no_grad():
            first = _as_tuple(function(*args))
        return [first, _as_tuple(function(*args))]
    wrapped = wrap(function, case.recompute, megatron)
    with grad_mode(case.grad_mode):
        return [_as_tuple(wrapped(*args))]


def _backward(outputs: tuple[torch.Tensor, ...], weights: list[torch.Tensor], grad_form: str) -> None:
    """A weighted loss gives every output a dense gradient; a plain sum gives each an
    expanded (stride-0) one, as `(y + r).sum()` in a training script does."""
    if grad_form == "expanded":
        loss = sum(o.sum() for o in outputs if o.requires_grad)
    else:
        loss = sum((o.float() * w).sum() for o, w in zip(outputs, weights) if o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()


def observe_side(case: Case, function: Callable[..., Any], tensors: dict[str, torch.Tensor],
                 params: dict[str, torch.Tensor], megatron: Wrapper | None = None) -> tuple[dict[str, Any], Exception | None]:
    """Run one side of a call case and return what it observed, as plain data for the judge
    (harness.engine.compare), and the exception that ended it, if any: the outputs of each call
    (as returned: an in-place op may alias a buffer a later call changes), whether each
    requires grad, the gradients of the caller's leaves and the parameters, and the caller's
    tensors before and after (also when the call raised: a side effect followed by a crash is
    recorded as both)."""
    before = {n: snapshot(t) for n, t in tensors.items()}
    after = None
    side: dict[str, Any] = {"outputs": [], "requires_grad": []}
    args = [tensors["x"]] + ([tensors["residual"]] if "residual" in tensors else [])
    error = None
    try:
        outputs = _calls(case, function, args, megatron)
        side["outputs"] = [tuple(o.detach().clone() for o in call) for call in outputs]
        side["requires_grad"] = [[o.requires_grad for o in call] for call in outputs]
        after = {n: snapshot(t) for n, t in tensors.items()}
        last = outputs[-1]
        if any(o.requires_grad for o in last):
            _backward(last, loss_weights(case, last), case.grad_form)
    except Exception as exc:  # noqa: BLE001 — the caller records it
        error = exc
    side["before"] = before
    side["after"] = after if after is not None else {n: snapshot(t) for n, t in tensors.items()}
    leaves = {n: t for n, t in tensors.items() if n != "x" or t.is_leaf}
    side["grads"] = {n: t.grad for n, t in {**leaves, **params}.items()}
    return side, error
