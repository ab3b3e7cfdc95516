"""Reproducers for upstream: one short Python file per case that needs only torch and an
installed Transformer Engine (`import transformer_engine.pytorch as te`), no harness.

It builds the case's pipeline with `te.ops`, its inputs, grad mode and recompute wrapper,
and asserts what unfused PyTorch does: the call completes, the caller's tensors keep their
flags, computed outputs need grad only where autograd is on, a pass-through output is the
input's value, and backward reaches the caller's leaf. On a host without TE's compiled
parts, `repro exec --target SPEC -- python case.py` runs it against any release or fork.

The pipeline's ops are written out by building the catalogue's pipeline against a recorder
that renders each op call as source, so the script and a run build the same ops.
"""

from __future__ import annotations

from typing import Any

import torch

from cases.case import Case
from cases.ops.database import needs_process_group
from cases.pipelines import HIDDEN, PIPELINES
from harness.errors import UsageError

GRAD_MODES = {"enabled": "torch.enable_grad()", "no_grad": "torch.no_grad()",
              "inference_mode": "torch.inference_mode()",
              "enable_grad_inside_no_grad": "torch.no_grad(), torch.enable_grad()"}
GRAD_OFF = ("no_grad", "inference_mode")
INPUTS = {
    "leaf": ["x = values.clone()"],
    "leaf_requires_grad": ["x = values.clone().requires_grad_()"],
    "non_leaf": ["base = (values / 2).requires_grad_()  # the leaf behind x", "x = base * 2  # a computed activation"],
    "view": ["base = values.clone().reshape(-1).requires_grad_()  # the leaf behind x",
             f"x = base.view(4, {HIDDEN})  # a view"],
    "detached": ["base = values.clone().requires_grad_()", "x = (base * 1).detach()"],
}
RECOMPUTES = {
    "none": ["run = model"],
    "checkpoint_reentrant": ["def run(*args):",
                             "    return torch.utils.checkpoint.checkpoint(model, *args, use_reentrant=True)"],
    "checkpoint_non_reentrant": ["def run(*args):",
                                 "    return torch.utils.checkpoint.checkpoint(model, *args, use_reentrant=False)"],
    "megatron": ["# Megatron's activation recompute (megatron-core; on a CPU-only host use `repro exec --megatron`).",
                 "from megatron.core.tensor_parallel import random as megatron_random",
                 "",
                 "def run(*args):",
                 "    return megatron_random.checkpoint(model, False, *args)"],
}


class _Source:
    """An expression as source text; its repr is the text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _OpsRecorder(dict):
    """Stands in for a target's ops: each op call returns its `te.ops.Name(...)` source."""

    def __missing__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> _Source:
            parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            return _Source(f"te.ops.{name}({', '.join(parts)})")

        return call


def _op_sources(case: Case) -> list[str]:
    kwargs = {"device": _Source("DEVICE"), "dtype": _Source("DTYPE")}
    sources = []
    for op in PIPELINES[case.pipeline].build(_OpsRecorder(), kwargs):
        if isinstance(op, _Source):
            sources.append(op.text)
        elif isinstance(op, torch.nn.Module):  # a plain torch module between TE ops (it splits the fuser)
            sources.append(f"{type(op).__name__}()")
        else:
            raise TypeError(f"pipeline {case.pipeline} builds {op!r}, which has no source form")
    return sources


def _plain_modules(case: Case) -> list[str]:
    """Source of the plain torch modules a pipeline puts between TE ops."""
    from cases import pipelines

    lines = []
    for op in PIPELINES[case.pipeline].build(_OpsRecorder(), {"device": None, "dtype": None}):
        if isinstance(op, torch.nn.Module):
            name = type(op).__name__
            if name != "Tanh" or not hasattr(pipelines, name):
                raise TypeError(f"no source form for the module {name}")
            lines += [f"class {name}(torch.nn.Module):", "    def forward(self, x):", "        return torch.tanh(x)",
                      "", ""]
    return lines


def render_standalone(case: Case, case_id: str, target: str) -> str:
    """The call scenario's case as a script (cases/scenarios.py says which cases have one)."""
    info = PIPELINES[case.pipeline]
    grad_form = getattr(case, "grad_form", "dense")
    wants_grad = case.input in ("leaf_requires_grad", "non_leaf", "view")
    lines = [
        "#!/usr/bin/env python3",
        f'"""Reproducer: {case_id} (recorded on {target}).',
        "",
        f"Pipeline: {info.description}. Needs only torch and Transformer Engine. On a host without TE's",
        "compiled parts, run it against any release, fork or patch with te-fuser-repro:",
        f"    repro exec --target {target} -- python {{this file}}",
        "Exit status 0 when TE behaves as unfused PyTorch does; an exception or AssertionError otherwise.",
        '"""',
        "",
        "import torch",
        "import transformer_engine.pytorch as te",
        "",
        *(["# TE's communication ops at world size 1: one process, gloo, an in-process store.",
           'torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)',
           ""] if needs_process_group(info.op_keys) else []),
        f'DEVICE, DTYPE = "{case.device}", torch.{case.dtype}',
        "torch.manual_seed(0)",
        "",
        "",
        *_plain_modules(case),
        "model = te.ops.Sequential(",
        *(f"    {source}," for source in _op_sources(case)),
        ")",
        "for p in model.parameters():",
        f"    p.requires_grad_({case.params == 'trainable'})  # params: {case.params}",
        "",
        f"values = torch.randn(4, {HIDDEN}, device=DEVICE, dtype=DTYPE)",
        f"# input: {case.input}",
        *INPUTS[case.input],
    ]
    args = ["x"]
    if info.num_extra_inputs:
        shape = ", ".join(str(n) for n in (info.extra_input_shapes or [(4, HIDDEN)])[0])
        if info.fixed_extra_input is not None:  # integers (split sizes)
            lines.append(f"residual = torch.tensor({list(info.fixed_extra_input)}, device=DEVICE)")
        else:
            lines.append(f"residual = torch.randn({shape}, device=DEVICE, dtype=DTYPE).requires_grad_({wants_grad})")
        args.append("residual")
    callers = args + (["base"] if case.input in ("non_leaf", "view", "detached") else [])
    lines += [
        f"caller = {{{', '.join(f'{n!r}: {n}' for n in callers)}}}",
        "flags_before = {name: (t.requires_grad, t.is_leaf) for name, t in caller.items()}",
        "",
        f"# recompute: {case.recompute}",
        *RECOMPUTES[case.recompute],
        "",
    ]
    if case.sequence == "recompute_pattern":
        lines += ["# sequence: recompute_pattern: a no-grad forward, then the same forward with grad",
                  "with torch.no_grad():",
                  f"    run({', '.join(args)})",
                  f"out = run({', '.join(args)})"]
        final_grad_off = False
    else:
        lines += [f"with {GRAD_MODES[case.grad_mode]}:  # grad_mode: {case.grad_mode}",
                  f"    out = run({', '.join(args)})"]
        final_grad_off = case.grad_mode in GRAD_OFF
    lines += [
        "outputs = out if isinstance(out, tuple) else (out,)",
        "",
        "# What unfused PyTorch does:",
        "flags_after = {name: (t.requires_grad, t.is_leaf) for name, t in caller.items()}",
        'assert flags_after == flags_before, f"the call changed the caller\'s tensors: {flags_before} -> {flags_after}"',
    ]
    computed = "outputs[:-1]" if info.exposes_input else "outputs"
    if info.exposes_input:
        lines += [
            "# The last output hands the input back unchanged: same values, same requires_grad as x.",
            "torch.testing.assert_close(outputs[-1], x)",
            'assert outputs[-1].requires_grad == x.requires_grad, "the pass-through output\'s requires_grad differs from x"',
        ]
    if final_grad_off:
        lines.append(f'assert not any(o.requires_grad for o in {computed}), "a computed output requires grad with'
                     ' autograd off"')
    weights = ("o.sum()" if grad_form == "expanded" else "(o.float() * torch.randn(o.shape, device=DEVICE)).sum()")
    lines += [
        "if any(o.requires_grad for o in outputs):",
        f"    sum({weights} for o in outputs if o.requires_grad).backward()",
    ]
    if wants_grad and not final_grad_off:
        leaf = "base" if case.input in ("non_leaf", "view") else "x"
        lines += [f'    assert {leaf}.grad is not None, "backward did not reach the caller\'s leaf"']
    lines += ["print(\"OK: behaves as unfused PyTorch\")", ""]
    return "\n".join(lines)


def standalone_refusal(case: Case) -> str | None:
    """Why no standalone script (torch and TE only) can be written for the case, or None."""
    from cases.regressions import REGRESSIONS

    scenario = REGRESSIONS[case.regression].scenario
    if scenario.trial is not None and scenario.standalone is None:
        return f"--standalone: the {scenario.name} scenario of {case.regression} has no standalone form; use --script"
    return scenario.standalone_refusal(case)


def write_standalone(case: Case, target: str) -> str:
    """The case's own steps as a standalone script; UsageError (one line) when it has none."""
    from cases.regressions import REGRESSIONS

    if refusal := standalone_refusal(case):
        raise UsageError(refusal)
    scenario = REGRESSIONS[case.regression].scenario
    if scenario.trial is None:  # the engine's own call scenario: written here
        return render_standalone(case, case.case_id, target)
    assert scenario.standalone is not None
    return scenario.standalone(case, target)
