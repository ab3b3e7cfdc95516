"""Which of a target's `te.ops` basic ops and fused ops a run reached, and why each other one
was not: a pure function of the target's inventory (harness.targets.inventory) and the run's
records for it. A basic op is reached when a case that builds it ran (any outcome but
not_applicable and harness_error); a fused op when a record's `fused_ops` names it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cases.ops.database import DATABASE_OPS, FUSION_OF, NOT_COVERED
from cases.ops.generated import keys_of
from cases.pipeline_info import ops_used
from cases.pipelines import PIPELINES
from harness.runner.signature import UNJUDGED


@dataclass(frozen=True)
class Row:
    kind: str  # "basic" or "fused"
    name: str  # TE's class name
    reached: bool
    how: str  # the cases that reached it, or why none did


def ops_of(record: Mapping[str, Any]) -> set[str]:
    """TE's op classes a record's case builds (none for a case of no te.ops pipeline)."""
    pipeline = PIPELINES.get(str(record.get("pipeline") or ""))
    if pipeline is None or record.get("client", "ops") != "ops":
        return set()
    return set(ops_used(pipeline))


def _window_cases(records: list[Mapping[str, Any]], windows: Iterable[tuple[str, ...]]) -> int:
    """How many cases that ran hold one of the windows, contiguous."""
    found = 0
    for record in records:
        keys = keys_of(str(record.get("pipeline") or "")) or ()
        if any(keys[i:i + len(w)] == w for w in windows for i in range(len(keys))):
            found += 1
    return found


def coverage(inventory: Mapping[str, list[str]], records: list[Mapping[str, Any]]) -> list[Row]:
    """One row per basic op, then per fused op, of the target, in its inventory's order."""
    ran = [r for r in records if r.get("outcome") not in UNJUDGED]
    built: dict[str, int] = {}
    for record in ran:
        for op in ops_of(record):
            built[op] = built.get(op, 0) + 1
    fused: dict[str, int] = {}
    for record in ran:
        for entry in record.get("fused_ops") or []:
            name = str(entry).partition(":")[2] or str(entry)
            fused[name] = fused.get(name, 0) + 1
    rows = [Row("basic", op, op in built, f"{built[op]} cases" if op in built else _basic_gap(op, records))
            for op in inventory.get("basic", [])]
    rows += [Row("fused", op, op in fused, f"ran in {fused[op]} cases" if op in fused else _fused_gap(op, ran))
             for op in inventory.get("fused", [])]
    return rows


def _basic_gap(op: str, records: list[Mapping[str, Any]]) -> str:
    if op in NOT_COVERED:
        return NOT_COVERED[op]
    if op not in DATABASE_OPS:
        return "no op database entry (cases/ops/database.py)"
    notes = {str(r.get("note")) for r in records if op in ops_of(r) and r.get("outcome") in UNJUDGED}
    if notes:
        return "its cases did not run: " + "; ".join(sorted(notes))[:300]
    return "in the op database, but the run holds no case that builds it (run --matrix generated)"


def _fused_gap(op: str, ran: list[Mapping[str, Any]]) -> str:
    fusion = FUSION_OF.get(op)
    if fusion is None:
        return "no fusion window in the op database (cases/ops/database.py)"
    if fusion.unreachable:
        return fusion.unreachable
    count = _window_cases(ran, fusion.windows)
    windows = ", ".join("[" + ", ".join(w) + "]" for w in fusion.windows)
    if not count:
        return f"no case of the run holds its windows {windows} (run --matrix generated)"
    return f"{count} cases held its windows {windows}; the pass never fired (it also needs: {fusion.condition})"


def summary(rows: list[Row]) -> str:
    parts = []
    for kind in ("basic", "fused"):
        of_kind = [r for r in rows if r.kind == kind]
        parts.append(f"{kind} ops reached: {sum(r.reached for r in of_kind)} of {len(of_kind)}")
    return "; ".join(parts)
