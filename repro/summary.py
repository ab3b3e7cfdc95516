"""The terminal summary of a run: per-target counts by outcome and verdict, and the headline answers."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tabulate import tabulate

OUTCOMES = ("pass", "crash", "wrong_output", "wrong_grad", "side_effect", "harness_error", "skipped")
VERDICTS = ("reproduced", "fixed", "unaffected", "regression", "unexpected_pass", "harness_error", "skipped")
BAD_VERDICTS = ("regression", "harness_error", "unexpected_pass")


def _table(run: dict[str, Any], field: str, columns: tuple[str, ...]) -> str:
    specs = [t["spec"] for t in run["environment"]["targets"]]
    counts = {spec: Counter(r[field] for r in run["results"] if r["target"] == spec) for spec in specs}
    rows = [[spec, *(counts[spec][c] for c in columns)] for spec in specs]
    return tabulate(rows, headers=["target", *columns])


def headline(run: dict[str, Any], backport: str = "te-2.13.0+backport", upstream: str = "te-2.16.0") -> list[str]:
    results = run["results"]
    lines = []
    specs = {t["spec"] for t in run["environment"]["targets"]}
    if backport in specs:
        affected = [r for r in results if r["target"] == backport and r["expected"] == "affected"
                    and r["outcome"] != "skipped"]
        fixed = sum(r["verdict"] == "fixed" for r in affected)
        lines.append(f"backport fixes {fixed} of {len(affected)} affected cases"
                     + (" — every one" if affected and fixed == len(affected) else ""))
    if backport in specs and upstream in specs:
        ours = {r["case_id"]: r["outcome"] for r in results if r["target"] == backport}
        theirs = {r["case_id"]: r["outcome"] for r in results if r["target"] == upstream}
        differ = sorted(c for c in ours.keys() & theirs.keys() if ours[c] != theirs[c])
        lines.append(f"backport matches upstream {upstream} on every case ({len(ours)} cases)" if not differ else
                     f"backport differs from upstream {upstream} on {len(differ)} cases, e.g. {differ[0]}")
    bad = Counter(r["verdict"] for r in results if r["verdict"] in BAD_VERDICTS)
    lines.append("no regression, harness error or unexpected pass" if not bad else
                 "ATTENTION: " + ", ".join(f"{n} {v}" for v, n in bad.items()))
    if not run.get("complete", True):
        lines.append(f"INCOMPLETE run: {run.get('missing', '?')} case results missing")
    return lines


def render_terminal(run: dict[str, Any]) -> str:
    parts = ["Outcomes", _table(run, "outcome", OUTCOMES), "", "Verdicts", _table(run, "verdict", VERDICTS), ""]
    parts += [f"* {line}" for line in headline(run)]
    return "\n".join(parts)


def exit_status(run: dict[str, Any]) -> int:
    return 1 if any(r["verdict"] in BAD_VERDICTS for r in run["results"]) else 0
