"""The terminal summary of a stored run: per-target counts by outcome and verdict, and each
regression's headline as stored in the run."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tabulate import tabulate

from harness.model import BAD_VERDICTS, Outcome, Verdict

OUTCOMES = tuple(o.value for o in Outcome)
VERDICTS = tuple(v.value for v in Verdict)


def _table(run: dict[str, Any], field: str, columns: tuple[str, ...]) -> str:
    specs = [t["spec"] for t in run["environment"]["targets"]]
    counts = {spec: Counter(r[field] for r in run["results"] if r["target"] == spec) for spec in specs}
    used = [c for c in columns if any(counts[spec][c] for spec in specs)]
    rows = [[spec, *(counts[spec][c] for c in used)] for spec in specs]
    return tabulate(rows, headers=["target", *used])


def headline(run: dict[str, Any]) -> list[str]:
    lines = [f"{rid}: {line}" for rid, found in (run.get("headlines") or {}).items() for line in found]
    if not run.get("complete", True):
        lines.append(f"INCOMPLETE run: {run.get('missing', '?')} case results missing")
    return lines


def render_terminal(run: dict[str, Any]) -> str:
    parts = ["Outcomes", _table(run, "outcome", OUTCOMES), "", "Verdicts", _table(run, "verdict", VERDICTS), ""]
    parts += [f"* {line}" for line in headline(run)]
    return "\n".join(parts)


def exit_status(run: dict[str, Any]) -> int:
    """1 on any bad verdict, and on a run with results missing: it never passes incomplete."""
    bad = any(r["verdict"] in BAD_VERDICTS for r in run["results"])
    return 1 if bad or not run.get("complete", True) else 0
