"""Which results to run again: from a stored run by verdict (`--from-run DIR --verdict ...`
or `--last-failed`), or named case ids (`--case ID`). A pure function of the stored run, so
the selection is the same whatever today's matrix generates; the runner turns the
selections into cases."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from harness.errors import UsageError
from repro import reports

CASE_ID = re.compile(r"[A-Za-z0-9_.]+:[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*|[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)+")
# --last-failed: the verdicts that make a run FAIL, and results a run never wrote.
LAST_FAILED = (*reports.BAD_VERDICTS, "missing")


class Selection(NamedTuple):
    regression: str
    case_id: str
    target: str | None  # None: every target of the new run


def parse_verdicts(text: str) -> list[str]:
    """`other_failure,regression` -> the verdicts; UsageError naming the valid ones."""
    valid = [v for v in reports.VERDICTS if v != "skipped"] + ["missing"]
    chosen = [v.strip() for v in text.split(",") if v.strip()]
    if not chosen or any(v not in valid for v in chosen):
        bad = [v for v in chosen if v not in valid] or [text]
        raise UsageError(f"unknown verdict {bad[0]!r} in --verdict; valid: {', '.join(valid)}")
    return chosen


def parse_case_ids(case_ids: Iterable[str]) -> list[str]:
    found = []
    for case_id in case_ids:
        if not CASE_ID.fullmatch(case_id):
            raise UsageError(f"bad case id {case_id!r} for --case; expected REGRESSION:V1-V2-... as in a report")
        found.append(case_id)
    return found


def _regression(case_id: str) -> str:
    head, sep, _ = case_id.partition(":")
    return head if sep else "issue22"


def select_from_run(run: dict[str, Any], verdicts: Collection[str] = LAST_FAILED,
                    case_ids: Collection[str] | None = None) -> list[Selection]:
    """The (regression, case id, target) of every stored result whose verdict is in `verdicts`
    ("missing": a result the run expected and never wrote), limited to `case_ids` when given."""
    wanted = set(case_ids) if case_ids else None
    picked = [Selection(reports.regression_of(r), r["case_id"], r["target"]) for r in run["results"]
              if r["verdict"] in verdicts and (wanted is None or r["case_id"] in wanted)]
    if "missing" in verdicts:
        picked += [Selection(_regression(m["case_id"]), m["case_id"], m["target"])
                   for m in [*(run.get("missing_results") or []), *(run.get("not_run") or [])]
                   if wanted is None or m["case_id"] in wanted]
    return list(dict.fromkeys(picked))


def select_cases(case_ids: Iterable[str]) -> list[Selection]:
    """`--case ID` without a stored run: those cases on every target of the new run."""
    return [Selection(_regression(c), c, None) for c in dict.fromkeys(parse_case_ids(case_ids))]
