"""Case generation: the whole matrix of axes, one feasibility predicate, presets and filters.

Every combination is enumerated, and the infeasible ones carry their skip reason, so
case ids are the same on every machine (as asv reports n/a).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from cases.axes import AXES
from cases.pipelines import PIPELINES
from harness.errors import UsageError

MAX_CASES_DEFAULT = 20000


@dataclass(frozen=True)
class Case:
    pipeline: str
    grad_mode: str
    input: str
    params: str
    recompute: str
    sequence: str
    dtype: str
    device: str

    @property
    def case_id(self) -> str:
        return "-".join(asdict(self).values())

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def skip_reason(case: Case) -> str | None:
    """Why a combination makes no sense, or None. The only place such rules live."""
    if case.recompute != "none" and case.grad_mode != "enabled":
        return f"recompute wrappers run inside a training step; not under grad_mode={case.grad_mode}"
    if case.sequence == "recompute_pattern" and (case.grad_mode != "enabled" or case.recompute != "none"):
        return "recompute_pattern sets its own grad modes (no_grad, then grad, then backward)"
    if PIPELINES[case.pipeline].in_place_extra_input and (case.recompute != "none" or case.sequence != "single"):
        return "in-place accumulation into the caller's residual is not recompute-safe: a recompute adds it again"
    if case.params == "frozen" and not PIPELINE_HAS_PARAMS[case.pipeline]:
        return f"{case.pipeline} has no parameters to freeze"
    return None


PIPELINE_HAS_PARAMS = {
    name: name not in {"extra_output_only", "identity", "reshape"} for name in PIPELINES
}

PRESETS: dict[str, dict[str, tuple[str, ...]]] = {
    "smoke": {
        "pipeline": ("fused_residual_rmsnorm", "extra_output_only", "rmsnorm"),
        "grad_mode": ("enabled", "no_grad"),
        "input": ("leaf", "non_leaf"),
        "params": ("trainable",),
        "recompute": ("none", "checkpoint_reentrant"),
        "sequence": ("single",),
        "dtype": ("float32",),
        "device": ("cpu",),
    },
    "issue22": {**AXES, "dtype": ("float32", "bfloat16"), "device": ("cpu",)},
    "full": dict(AXES),
}


def parse_filters(only: list[str] | None) -> dict[str, tuple[str, ...]]:
    """`--only axis=v1,v2` (repeatable) into {axis: values}, checked against AXES."""
    filters: dict[str, tuple[str, ...]] = {}
    for item in only or []:
        axis, sep, values = item.partition("=")
        if not sep or axis not in AXES:
            raise UsageError(f"bad filter {item!r}; use axis=value[,value] with axis one of: {', '.join(AXES)}")
        chosen = tuple(v for v in values.split(",") if v)
        unknown = [v for v in chosen if v not in AXES[axis]]
        if unknown or not chosen:
            raise UsageError(f"unknown {axis} value {','.join(unknown) or '(none)'}; valid: {', '.join(AXES[axis])}")
        filters[axis] = chosen
    return filters


def generate(matrix: str, only: list[str] | None = None, max_cases: int = MAX_CASES_DEFAULT) -> list[Case]:
    if matrix not in PRESETS:
        raise UsageError(f"unknown matrix {matrix!r}; valid: {', '.join(PRESETS)}")
    axes = dict(PRESETS[matrix])
    for axis, values in parse_filters(only).items():
        axes[axis] = tuple(v for v in AXES[axis] if v in values)
    count = 1
    for values in axes.values():
        count *= len(values)
    if count > max_cases:
        raise UsageError(f"selection has {count} cases, above the cap of {max_cases}; narrow it with --only or raise --max-cases")
    return [Case(*combo) for combo in itertools.product(*(axes[a] for a in AXES))]
