"""Case generation: the valid cases of a regression's preset, over that regression's own
axes, with the combinations that cannot run counted by reason (counts, not records), and
`--only` filters.

The rules that make a combination meaningless for every regression of a scenario live
with the scenario (`Scenario.exclude`, asked through `common_exclusion`); a regression
adds its own through `Regression.exclude`. Case ids are built from axis values, so they
are stable however many combinations are excluded.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from cases.case import Case
from cases.ops.generated import keys_of, valid
from cases.regression import Regression
from cases.regressions import REGRESSIONS
from harness.errors import UsageError

MAX_CASES_DEFAULT = 20000
# Presets of issue 22 that predate the regression catalogue keep their names.
ISSUE22_PRESETS = {"smoke": "smoke", "full": "full"}
ALL = "all"
GENERATED = "generated"  # cases/generated_matrix.py: not a regression, so not in `all`


def common_exclusion(case: Case) -> str | None:
    """Why a combination makes no sense for any regression of the case's scenario, or None."""
    return REGRESSIONS[case.regression].scenario.exclude(case)


def exclusion(case: Case) -> str | None:
    """Why a combination is not a valid case of its regression, or None."""
    return common_exclusion(case) or REGRESSIONS[case.regression].exclude(case)


@dataclass(frozen=True)
class Selection:
    """The cases of one regression in a run, and what was left out and why."""

    regression: Regression
    cases: list[Case]
    excluded: Counter[str]


def matrix_names() -> list[str]:
    return [*REGRESSIONS, *ISSUE22_PRESETS, ALL]


def known_axes(regressions: list[Regression]) -> dict[str, tuple[str, ...]]:
    """Every axis the regressions vary, with the union of their values, in first-seen order."""
    axes: dict[str, tuple[str, ...]] = {}
    for regression in regressions:
        for axis, values in regression.axes.items():
            axes[axis] = tuple(dict.fromkeys(axes.get(axis, ()) + values))
    return axes


LISTED = 24  # values an error names before it points at `repro list`


def _listed(values: tuple[str, ...]) -> str:
    if len(values) <= LISTED:
        return ", ".join(values)
    return ", ".join(values[:LISTED]) + f", ... ({len(values)} in all; `repro list --matrix NAME` shows them)"


def parse_filters(only: list[str] | None, regressions: list[Regression] | None = None) -> dict[str, tuple[str, ...]]:
    """`--only axis=v1,v2` into {axis: values}, checked against the regressions' axes (every
    regression's when none are given); an axis given twice is refused."""
    axes = known_axes(regressions if regressions is not None else list(REGRESSIONS.values()))
    filters: dict[str, tuple[str, ...]] = {}
    for item in only or []:
        axis, sep, values = item.partition("=")
        if not sep or axis not in axes:
            raise UsageError(f"bad filter {item!r}; use axis=value[,value] with axis one of: {', '.join(axes)}")
        if axis in filters:
            raise UsageError(f"--only names {axis} twice; give its values once, comma-separated: {axis}=v1,v2")
        chosen = tuple(v for v in values.split(",") if v)
        unknown = [v for v in chosen if v not in axes[axis]]
        if unknown or not chosen:
            raise UsageError(f"unknown {axis} value {','.join(unknown) or '(none)'}; valid: {_listed(axes[axis])}")
        filters[axis] = chosen
    return filters


def select(regression: Regression, preset: str, only: list[str] | None = None) -> Selection:
    """The preset's valid cases. A filter on an axis this regression does not vary selects
    none of its cases (no value of it can match)."""
    axes = dict(regression.presets[preset])
    for axis, values in parse_filters(only).items():
        axes[axis] = tuple(v for v in axes.get(axis, ()) if v in values)
        if axis not in regression.axes:
            return Selection(regression, [], Counter())
    cases, excluded = [], Counter[str]()
    for combination in itertools.product(*(axes[axis] for axis in regression.axes)):
        case = Case(regression.id, *combination)
        reason = regression.scenario.exclude(case) or regression.exclude(case)
        if reason:
            excluded[reason] += 1
        else:
            cases.append(case)
    return Selection(regression, cases, excluded)


def _chosen(name: str, preset: str) -> list[tuple[Regression, str]]:
    """The regressions, each with its preset, that one matrix name stands for."""
    def preset_of(regression: Regression) -> str:
        return preset if preset in regression.presets else "default"

    if name == ALL:  # the catalogue's regressions; the generated matrix is joined by name (all,generated)
        return [(regression, preset_of(regression)) for rid, regression in REGRESSIONS.items() if rid != GENERATED]
    if name in REGRESSIONS:
        return [(REGRESSIONS[name], preset_of(REGRESSIONS[name]))]
    if name in ISSUE22_PRESETS:
        return [(REGRESSIONS["issue22"], ISSUE22_PRESETS[name])]
    raise UsageError(f"unknown matrix {name!r}; valid: {', '.join(matrix_names())}, or several joined with commas")


def generate(matrix: str, only: list[str] | None = None, max_cases: int = MAX_CASES_DEFAULT,
             preset: str = "default") -> list[Selection]:
    """The selections a `--matrix` value stands for: one regression's preset (`preset` where
    it declares one, else its default), an issue-22 preset (smoke, full), every catalogued
    regression (all), or several of these joined with commas (all,generated); a regression named
    twice runs once, with its first preset."""
    chosen: dict[str, tuple[Regression, str]] = {}
    for name in matrix.split(","):
        for regression, its_preset in _chosen(name.strip(), preset):
            chosen.setdefault(regression.id, (regression, its_preset))
    selections = [select(regression, its_preset, only) for regression, its_preset in chosen.values()]
    count = sum(len(s.cases) for s in selections)
    if count > max_cases:
        raise UsageError(f"selection has {count} cases, above the cap of {max_cases}; "
                         "narrow it with --only or raise --max-cases")
    if count == 0:
        raise UsageError(f"the selection of matrix {matrix} with --only {' '.join(only or [])} holds no valid case; "
                         "see `repro list --matrix " + matrix + "` for the values it has")
    return selections


def _any_generated(axis: str, value: str, known: tuple[str, ...]) -> bool:
    """A valid sequence of the op database's keys, on an axis that holds generated pipelines:
    any such sequence names a pipeline (what `repro shrink` tries), not only the matrix's."""
    keys = keys_of(value) if axis == "pipeline" and any(keys_of(v) for v in known) else None
    return keys is not None and valid(keys)


def selections_of(case_ids: list[str]) -> list[Selection]:
    """Named case ids (a re-run) as selections, one per regression; an id that is not a
    valid case of a known regression is refused with the reason."""
    by_regression: dict[str, list[Case]] = {}
    for case_id in dict.fromkeys(case_ids):
        regression_id, sep, _ = case_id.partition(":")
        if not sep:
            raise UsageError(f"{case_id!r} is not a case id; expected REGRESSION:AXIS-VALUES") from None
        if regression_id not in REGRESSIONS:
            raise UsageError(f"case {case_id}: unknown regression {regression_id!r}; valid: {', '.join(REGRESSIONS)}")
        axes = REGRESSIONS[regression_id].axes
        try:
            case = Case.from_id(case_id)
        except ValueError:
            raise UsageError(f"{case_id!r} is not a case id; expected {regression_id}:" + "-".join(axes)) from None
        for axis, value in case.axes().items():
            if value not in axes[axis] and not _any_generated(axis, value, axes[axis]):
                raise UsageError(f"case {case_id}: {axis}={value} is not a value of that axis; "
                                 f"valid: {', '.join(axes[axis])}")
        if reason := exclusion(case):
            raise UsageError(f"case {case_id} is not a valid case: {reason}")
        by_regression.setdefault(case.regression, []).append(case)
    return [Selection(REGRESSIONS[rid], cases, Counter()) for rid, cases in by_regression.items()]
