"""Result records: one per (case, target), as streamed to results.jsonl and kept in run.json."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cases import issue22
from cases.matrix import Case
from harness.errors import TargetLoadError
from harness.targets.patching import load_patch

SCHEMA = "repro.run/1"


def target_has_fix(prepared: Any) -> bool:
    """Whether the target's fuser source carries issue 22's fix: patched by us, or
    recognised by the marker the backport declares (as upstream's 2.16.0 fix is)."""
    if prepared.patch_status in ("applied", "already-applied"):
        return True
    patch = load_patch("backport")
    fuser = Path(prepared.root or "") / patch.marker_file if prepared.root and patch.marker_file else None
    return bool(fuser and fuser.is_file() and re.search(patch.marker_pattern or "", fuser.read_text()))


def base_record(case: Case, target_spec: str) -> dict[str, Any]:
    prediction = issue22.predict(case)
    return {"case_id": case.case_id, "target": target_spec, **case.as_dict(),
            "expected": prediction.expected, "predicted_effect": prediction.effect}


def finish(record: dict[str, Any], has_fix: bool) -> dict[str, Any]:
    record["verdict"] = issue22.verdict(record["expected"], record["outcome"], has_fix)
    return record


def skipped_record(case: Case, target_spec: str, reason: str) -> dict[str, Any]:
    record = base_record(case, target_spec)
    record.update(outcome="skipped", failed_checks=[], error=None, details={}, known_deviations=[],
                  note=reason, duration_s=0.0)
    return finish(record, False)


def judge(case: Case, spec: str, target: Any, megatron_error: str | None) -> dict[str, Any]:
    """Run one case on a loaded target (or record why it cannot run), filed under `spec`
    even when the target never loaded, so its results are counted, never lost."""
    from harness.engine.execute import run_case

    if isinstance(target, TargetLoadError):
        record = base_record(case, spec)
        record.update(outcome="harness_error", failed_checks=["load"], error=None, details={},
                      known_deviations=[], note=str(target), duration_s=0.0)
        return finish(record, False)
    if case.recompute == "megatron" and megatron_error:
        return skipped_record(case, spec, megatron_error)
    from cases.pipelines import PIPELINES, ops_used

    missing = [op for op in target.missing_ops if op in ops_used(PIPELINES[case.pipeline])]
    if missing:
        return skipped_record(case, spec, f"target lacks {', '.join(missing)}: {target.missing_ops[missing[0]]}")
    record = base_record(case, spec)
    try:
        record.update(run_case(case, target))
    except Exception as exc:  # noqa: BLE001 — a failure of the harness itself, never a pass
        record.update(outcome="harness_error", failed_checks=["harness"], error={"type": type(exc).__name__,
                      "message": str(exc), "location": None}, details={}, known_deviations=[],
                      note="the harness failed building or judging the case", duration_s=0.0)
    return finish(record, _has_fix_cached(target))


_fix_cache: dict[str, bool] = {}


def _has_fix_cached(target: Any) -> bool:
    spec = target.prepared.spec
    if spec not in _fix_cache:
        _fix_cache[spec] = target_has_fix(target.prepared)
    return _fix_cache[spec]


def lost_case_record(nodeid: str, why: str, text: str) -> dict[str, Any]:
    """The record for a case that never wrote its own: its worker died, or it hung."""
    case = Case(*nodeid.rsplit("::", 1)[1].split("-"))
    from harness.targets import PreparedTarget

    prepared = PreparedTarget.from_json(_prepared_json_from_config() or "{}")
    record = base_record(case, prepared.spec)
    record.update(outcome="crash", failed_checks=["completion"], details={}, known_deviations=[],
                  error={"type": "WorkerDied" if why == "worker died" else "Timeout", "message": why,
                         "location": None, "traceback": text[-4000:]}, note=why, duration_s=0.0)
    return finish(record, target_has_fix(prepared))


def _prepared_json_from_config() -> str:
    from harness.runner.plugin import _state

    config = _state.get("config")
    return config.getoption("--repro-target") if config is not None else "{}"


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Records from a JSONL file; a line that is corrupt, not UTF-8, not an object or
    lacking a record's keys is reported by number and skipped."""
    from harness.runner.rundir import read_results

    return read_results(path)
