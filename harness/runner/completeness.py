"""Incomplete is a failure: every selected case of every target has a record, or the run
says which are missing and why, and exits non-zero."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from cases.case import Case
from harness.runner.rundir import session_name


def _last_log_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def not_run(run: dict[str, Any], plan: list[tuple[Any, list[Case]]], exits: dict[str, int],
            sessions_dir: Path) -> list[dict[str, str]]:
    """The selected (target, case) pairs without a record, each with the reason: how its
    target's session ended, and the last line of its log."""
    have = {(r["target"], r["case_id"]) for r in run["results"]}
    missing: list[dict[str, str]] = []
    for target, cases in plan:
        lost = [c.case_id for c in cases if (target.spec, c.case_id) not in have]
        if not lost:
            continue
        log = sessions_dir / f"{session_name(target.spec)}.log"
        code = exits.get(target.spec)
        how = "never ended" if code is None else f"exited with status {code}"
        last = _last_log_line(log)
        reason = f"its session {how} before recording it" + (f" (log {log}: {last})" if last else "")
        missing += [{"target": target.spec, "case_id": case_id, "reason": reason} for case_id in lost]
    return missing


def incomplete_reason(run: dict[str, Any]) -> str | None:
    """One line saying how many results a run is missing and why; None when it has all.
    The command exits non-zero when this is not None."""
    lost = run.get("not_run") or []
    if lost:
        by_target = Counter(item["target"] for item in lost)
        first = lost[0]
        where = ", ".join(f"{spec}: {n}" for spec, n in by_target.items())
        return f"INCOMPLETE run: {len(lost)} case results missing ({where}); {first['target']}: {first['reason']}"
    if run.get("complete") is False:
        missing = run.get("missing")
        count = f"{missing} case results" if isinstance(missing, int) else "case results"
        return f"INCOMPLETE run: {count} missing; the run did not finish"
    return None
