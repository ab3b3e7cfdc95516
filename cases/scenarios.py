"""The shared scenario library. Today one entry: CALL, a client (a te.ops pipeline from
cases/pipelines.py, or Megatron's own modules) called under a grad mode and a recompute
wrapper, then a backward, against the same call on the unfused reference. The engine runs
it itself (harness/engine/execute.py), and writes its standalone script (harness/engine/standalone.py). A regression whose trigger is something else
brings its own `Scenario` in its module (see cases/scenario.py).
"""

from __future__ import annotations

from cases.axes import AXES
from cases.case import Case
from cases.clients import client_call_exclusion, client_exclusion
from cases.pipelines import PIPELINES
from cases.scenario import Scenario


def call_exclusion(case: Case) -> str | None:
    """Why a combination of the call scenario makes no sense for any regression, or None."""
    if reason := client_exclusion(case):
        return reason
    if case.recompute != "none" and case.grad_mode != "enabled":
        return f"recompute wrappers run inside a training step; not under grad_mode={case.grad_mode}"
    if case.sequence == "recompute_pattern" and (case.grad_mode != "enabled" or case.recompute != "none"):
        return "recompute_pattern sets its own grad modes (no_grad, then grad, then backward)"
    pipeline = PIPELINES[case.pipeline]
    if pipeline.in_place_extra_input and (case.recompute != "none" or case.sequence != "single"):
        return "in-place accumulation into the caller's residual is not recompute-safe: a recompute adds it again"
    if case.params == "frozen" and not pipeline.has_params:
        return f"{case.pipeline} has no parameters to freeze"
    if case.grad_form == "expanded" and case.grad_mode in ("no_grad", "inference_mode"):
        return "no backward runs under no_grad or inference_mode, so there is no upstream gradient form"
    return client_call_exclusion(case)


def _call_standalone_refusal(case: Case) -> str | None:
    if case.client != "ops":  # Megatron's modules are not a te.ops pipeline such a script could write out
        return (f"--standalone writes a te.ops pipeline; {case.client} runs Megatron's own modules: use "
                f"--script without --standalone, or repro minimal --client {case.client}")
    return None


CALL = Scenario(
    name="call",
    description="a client called under a grad mode and a recompute wrapper, then backward",
    axes=AXES,
    exclude=call_exclusion,
    standalone_refusal=_call_standalone_refusal,
)
