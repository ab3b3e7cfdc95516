"""Case generation: the valid cases of a regression's preset, with the combinations that
cannot run counted by reason (counts, not records), and `--only` filters.

The rules that make a combination meaningless for every regression live in
`common_exclusion`; a regression adds its own through `Regression.exclude`. Case ids are
built from axis values, so they are stable however many combinations are excluded.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from cases.axes import AXES
from cases.case import Case
from cases.clients import client_call_exclusion, client_exclusion
from cases.pipelines import PIPELINES
from cases.regression import Regression
from cases.regressions import REGRESSIONS
from harness.errors import UsageError

MAX_CASES_DEFAULT = 20000
# Presets of issue 22 that predate the regression catalogue keep their names.
ISSUE22_PRESETS = {"smoke": "smoke", "full": "full"}
ALL = "all"


def common_exclusion(case: Case) -> str | None:
    """Why a combination makes no sense for any regression, or None."""
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


@dataclass(frozen=True)
class Selection:
    """The cases of one regression in a run, and what was left out and why."""

    regression: Regression
    cases: list[Case]
    excluded: Counter[str]


def matrix_names() -> list[str]:
    return [*REGRESSIONS, *ISSUE22_PRESETS, ALL]


def parse_filters(only: list[str] | None) -> dict[str, tuple[str, ...]]:
    """`--only axis=v1,v2` into {axis: values}, checked against AXES; an axis given twice is refused."""
    filters: dict[str, tuple[str, ...]] = {}
    for item in only or []:
        axis, sep, values = item.partition("=")
        if not sep or axis not in AXES:
            raise UsageError(f"bad filter {item!r}; use axis=value[,value] with axis one of: {', '.join(AXES)}")
        if axis in filters:
            raise UsageError(f"--only names {axis} twice; give its values once, comma-separated: {axis}=v1,v2")
        chosen = tuple(v for v in values.split(",") if v)
        unknown = [v for v in chosen if v not in AXES[axis]]
        if unknown or not chosen:
            raise UsageError(f"unknown {axis} value {','.join(unknown) or '(none)'}; valid: {', '.join(AXES[axis])}")
        filters[axis] = chosen
    return filters


def select(regression: Regression, preset: str, only: list[str] | None = None) -> Selection:
    axes = dict(regression.presets[preset])
    for axis, values in parse_filters(only).items():
        axes[axis] = tuple(v for v in axes.get(axis, ()) if v in values)
    cases, excluded = [], Counter[str]()
    for combination in itertools.product(*(axes[axis] for axis in AXES)):
        case = Case(regression.id, *combination)
        reason = common_exclusion(case) or regression.exclude(case)
        if reason:
            excluded[reason] += 1
        else:
            cases.append(case)
    return Selection(regression, cases, excluded)


def generate(matrix: str, only: list[str] | None = None, max_cases: int = MAX_CASES_DEFAULT,
             preset: str = "default") -> list[Selection]:
    """The selections a `--matrix` name stands for: one regression's preset (`preset` where
    it declares one, else its default), an issue-22 preset (smoke, full), or every
    regression (all)."""
    def preset_of(regression: Regression) -> str:
        return preset if preset in regression.presets else "default"

    if matrix == ALL:
        chosen = [(regression, preset_of(regression)) for regression in REGRESSIONS.values()]
    elif matrix in REGRESSIONS:
        chosen = [(REGRESSIONS[matrix], preset_of(REGRESSIONS[matrix]))]
    elif matrix in ISSUE22_PRESETS:
        chosen = [(REGRESSIONS["issue22"], ISSUE22_PRESETS[matrix])]
    else:
        raise UsageError(f"unknown matrix {matrix!r}; valid: {', '.join(matrix_names())}")
    selections = [select(regression, preset, only) for regression, preset in chosen]
    count = sum(len(s.cases) for s in selections)
    if count > max_cases:
        raise UsageError(f"selection has {count} cases, above the cap of {max_cases}; "
                         "narrow it with --only or raise --max-cases")
    if count == 0:
        raise UsageError(f"the selection of matrix {matrix} with --only {' '.join(only or [])} holds no valid case; "
                         "see `repro list --matrix " + matrix + "` for the values it has")
    return selections


def selections_of(case_ids: list[str]) -> list[Selection]:
    """Named case ids (a re-run) as selections, one per regression; an id that is not a
    valid case of a known regression is refused with the reason."""
    by_regression: dict[str, list[Case]] = {}
    for case_id in dict.fromkeys(case_ids):
        try:
            case = Case.from_id(case_id)
        except ValueError:
            raise UsageError(f"{case_id!r} is not a case id; expected REGRESSION:" + "-".join(AXES)) from None
        if case.regression not in REGRESSIONS:
            raise UsageError(f"case {case_id}: unknown regression {case.regression!r}; valid: {', '.join(REGRESSIONS)}")
        for axis, value in case.axes().items():
            if value not in AXES[axis]:
                raise UsageError(f"case {case_id}: {axis}={value} is not a value of that axis; "
                                 f"valid: {', '.join(AXES[axis])}")
        if reason := common_exclusion(case) or REGRESSIONS[case.regression].exclude(case):
            raise UsageError(f"case {case_id} is not a valid case: {reason}")
        by_regression.setdefault(case.regression, []).append(case)
    return [Selection(REGRESSIONS[rid], cases, Counter()) for rid, cases in by_regression.items()]
