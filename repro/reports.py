"""Reports of a run: loading a run dir (finished or not), the views every format shares,
and writing the formats into the run dir. The renderers live in render_*.py.

A run that did not finish has no run.json; its results.jsonl is read instead, and
run-meta.json (written when the run starts) says what was expected, so the report can
say how many results are missing.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from cases.axes import AXES
from harness.errors import UsageError
from harness.runner import records, rundir
from repro.summary import BAD_VERDICTS, OUTCOMES, VERDICTS

FORMATS = ("md", "verdict-md", "html", "junit", "json")
# Worst first: the outcome a grid cell shows for a target when it holds several cases.
SEVERITY = ("harness_error", "crash", "wrong_output", "wrong_grad", "side_effect", "pass", "skipped")
SYMBOLS = {"pass": "✓", "crash": "C", "wrong_output": "O", "wrong_grad": "G", "side_effect": "S",
           "harness_error": "H", "skipped": "·", "missing": "?"}
FAILING = ("crash", "wrong_output", "wrong_grad", "side_effect", "harness_error")


def load_run(path: Path) -> dict[str, Any]:
    """A run from a run dir or a run.json; from results.jsonl when run.json is absent."""
    path = Path(path)
    if path.is_file():
        return _read_json(path)
    if not path.is_dir():
        raise UsageError(f"{path} is neither a run dir nor a run.json")
    if (path / "run.json").is_file():
        return _read_json(path / "run.json")
    if (path / "results.jsonl").is_file():
        return _run_from_jsonl(path)
    raise UsageError(f"{path} holds neither run.json nor results.jsonl; pass the --out dir of a `repro run`")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        run = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    if not isinstance(run, dict) or run.get("schema") != records.SCHEMA:
        raise UsageError(f"{path} is not a {records.SCHEMA} run")
    rundir.check_run_document(run, path)
    return run


def _run_from_jsonl(run_dir: Path) -> dict[str, Any]:
    found, problems = records.read_jsonl(run_dir / "results.jsonl")
    meta = _read_meta(run_dir)
    by_key = {(r["target"], r["case_id"]): r for r in found}  # a repeated record: the last one counts
    specs = list(meta.get("targets") or dict.fromkeys(r["target"] for r in found))
    expected_keys = _expected_keys(meta, specs)
    if expected_keys is not None:
        missing_keys = [k for k in expected_keys if k not in by_key]
        missing: int | None = len(missing_keys)
    else:
        missing_keys = []
        expected = meta.get("expected_results")
        missing = expected - len(by_key) if isinstance(expected, int) else None
    return {
        "schema": records.SCHEMA, "matrix": meta.get("matrix", "?"),
        "environment": {"torch": "?", "python": "?", "platform": "?", "machine": "?",
                        "targets": [_bare_target(spec, run_dir) for spec in specs]},
        "complete": False, "missing": missing, "problems": problems,
        "results": list(by_key.values()),
        "report_source": "results.jsonl", "found_results": len(by_key),
        "missing_results": [{"target": t, "case_id": c} for t, c in missing_keys],
    }


def _read_meta(run_dir: Path) -> dict[str, Any]:
    try:
        meta = json.loads((run_dir / "run-meta.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _expected_keys(meta: dict[str, Any], specs: list[str]) -> list[tuple[str, str]] | None:
    """Every (target, case id) the run was asked for, when the matrix still generates."""
    if "matrix" not in meta or not specs:
        return None
    from cases.matrix import generate

    try:
        cases = generate(meta["matrix"], meta.get("only") or None, max_cases=10**9)
    except UsageError:  # the preset changed since the run; fall back to the count
        return None
    return [(spec, case.case_id) for spec in specs for case in cases]


def _bare_target(spec: str, run_dir: Path) -> dict[str, Any]:
    from harness.runner.sessions import session_name

    description = run_dir / "sessions" / f"{session_name(spec)}.description"
    return {"spec": spec, "version": "?", "fuser_sha": "?", "patch": None, "patch_status": "?",
            "patch_detail": "", "backend": "?", "source": "?",
            "description": description.read_text() if description.is_file() else ""}


# ---- views shared by the formats ----

def target_specs(run: dict[str, Any]) -> list[str]:
    specs = [t["spec"] for t in run["environment"]["targets"]]
    return specs + [s for s in dict.fromkeys(r["target"] for r in run["results"]) if s not in specs]


def incomplete_note(run: dict[str, Any]) -> str | None:
    """One sentence for a run that did not finish or lost results; None for a complete one."""
    if run.get("complete", True):
        return None
    missing = run.get("missing")
    count = "an unknown number of" if missing is None else str(missing)
    if run.get("report_source") == "results.jsonl":
        return (f"INCOMPLETE: the run did not finish (no run.json); {run.get('found_results', 0)} results found"
                f" in results.jsonl, {count} results missing.")
    return f"INCOMPLETE: {count} results missing from this run."


def counts(run: dict[str, Any], field: str) -> dict[str, Counter[str]]:
    table: dict[str, Counter[str]] = {spec: Counter() for spec in target_specs(run)}
    for record in run["results"]:
        table[record["target"]][record[field]] += 1
    return table


def totals_rows(run: dict[str, Any], with_time: bool) -> tuple[list[str], list[list[Any]]]:
    """Per target: results, then counts by outcome and by verdict (only columns that occur)."""
    outcomes, verdicts = counts(run, "outcome"), counts(run, "verdict")
    used_o = [o for o in OUTCOMES if any(c[o] for c in outcomes.values())]
    used_v = [v for v in VERDICTS if any(c[v] for c in verdicts.values()) and v not in used_o]
    headers = ["target", "results", *used_o, *used_v] + (["time (s)"] if with_time else [])
    rows = []
    for spec in target_specs(run):
        row = [spec, sum(outcomes[spec].values()), *(outcomes[spec][o] for o in used_o),
               *(verdicts[spec][v] for v in used_v)]
        if with_time:
            row.append(round(sum(r.get("duration_s") or 0.0 for r in run["results"] if r["target"] == spec), 2))
        rows.append(row)
    return headers, rows


def worst(outcomes: list[str]) -> str:
    return min(outcomes, key=lambda o: SEVERITY.index(o) if o in SEVERITY else -1)


def present_values(run: dict[str, Any]) -> dict[str, list[str]]:
    """Per axis, the values the run holds, in AXES order."""
    seen: dict[str, set[str]] = defaultdict(set)
    for record in run["results"]:
        for axis in AXES:
            seen[axis].add(record[axis])
    return {axis: [v for v in AXES[axis] if v in seen[axis]] + sorted(seen[axis] - set(AXES[axis]))
            for axis in AXES}


def pivot(run: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict[Any, dict[str, str]]]:
    """Rows pipeline x input, columns grad_mode x recompute; per cell and target the worst
    outcome over the other axes, with '!' appended when a verdict there is bad."""
    values = present_values(run)
    rows = [(p, i) for p in values["pipeline"] for i in values["input"]]
    cols = [(g, r) for g in values["grad_mode"] for r in values["recompute"]]
    seen: dict[Any, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    bad: set[tuple[Any, str]] = set()
    for record in run["results"]:
        key = ((record["pipeline"], record["input"]), (record["grad_mode"], record["recompute"]))
        seen[key][record["target"]].append(record["outcome"])
        if record["verdict"] in BAD_VERDICTS:
            bad.add((key, record["target"]))
    cells = {key: {spec: worst(found) + ("!" if (key, spec) in bad else "") for spec, found in by_target.items()}
             for key, by_target in seen.items()}
    return rows, cols, cells


def case_order(record: dict[str, Any]) -> tuple[int, ...]:
    """Matrix order (AXES order of each value): the first example is the plainest case."""
    return tuple(AXES[a].index(record[a]) if record[a] in AXES[a] else len(AXES[a]) for a in AXES)


def signature(record: dict[str, Any]) -> tuple[str, str, str]:
    """What groups failures: the error's type, innermost TE frame and message; for a
    failure without an exception, the outcome and the checks that failed."""
    error = record.get("error")
    if error:
        message = (error.get("message") or "").strip().splitlines()
        return error.get("type") or "?", error.get("location") or "", message[0] if message else ""
    return record["outcome"], "", ", ".join(record.get("failed_checks") or []) or (record.get("note") or "")


def failure_groups(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Non-passing, non-skipped results grouped by signature, most frequent first."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in run["results"]:
        if record["outcome"] in FAILING:
            groups[signature(record)].append(record)
    order = {spec: i for i, spec in enumerate(target_specs(run))}
    out: list[dict[str, Any]] = []
    for sig, found in groups.items():
        found.sort(key=lambda r: (order.get(r["target"], len(order)), case_order(r), r["case_id"]))
        by_target = Counter(r["target"] for r in found)
        out.append({"type": sig[0], "location": sig[1], "message": sig[2], "count": len(found),
                    "targets": sorted(by_target.items(), key=lambda kv: order.get(kv[0], len(order))),
                    "verdicts": sorted(Counter(r["verdict"] for r in found).items()),
                    "example": found[0]})
    out.sort(key=lambda g: (-g["count"], g["type"], g["location"], g["message"]))
    return out


def show_command(case_id: str, target: str) -> str:
    return shlex.join(["repro", "show", case_id, "--target", target, "--script"])


def target_has_fix(run: dict[str, Any], spec: str) -> bool | None:
    """Whether the run judged the target as carrying the fix, read off its verdicts."""
    verdicts = {r["verdict"] for r in run["results"] if r["target"] == spec and r["expected"] == "affected"}
    if verdicts & {"fixed", "regression"}:
        return True
    if verdicts & {"reproduced", "unexpected_pass"}:
        return False
    return None


def oracle_rows(run: dict[str, Any]) -> tuple[list[str], list[list[Any]], list[dict[str, Any]]]:
    """Predicted-affected versus observed-failing, per target, and the results where the
    observation contradicts the oracle (unexpected pass, or a failure it did not predict,
    or a failure on a target with the fix)."""
    headers = ["target", "has fix", "predicted affected", "observed failing", "affected & failing",
               "affected, passing", "unaffected, failing"]
    rows, disagreements = [], []
    for spec in target_specs(run):
        ran = [r for r in run["results"] if r["target"] == spec and r["outcome"] not in ("skipped", "harness_error")]
        affected = [r for r in ran if r["expected"] == "affected"]
        failing = [r for r in ran if r["outcome"] != "pass"]
        fix = target_has_fix(run, spec)
        rows.append([spec, {True: "yes", False: "no", None: "?"}[fix], len(affected), len(failing),
                     sum(r["outcome"] != "pass" for r in affected), sum(r["outcome"] == "pass" for r in affected),
                     sum(r["expected"] != "affected" for r in failing)])
        disagreements += [r for r in ran if r["verdict"] in ("regression", "unexpected_pass")]
    return headers, rows, disagreements


def effect_rows(run: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Predicted effect against observed outcome, for the affected cases that failed."""
    table = Counter((r["target"], r["predicted_effect"], r["outcome"]) for r in run["results"]
                    if r["expected"] == "affected" and r["outcome"] in FAILING)
    order = {spec: i for i, spec in enumerate(target_specs(run))}
    rows = [[t, e, o, n] for (t, e, o), n in sorted(table.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0]))]
    return ["target", "predicted effect", "observed outcome", "results"], rows


# ---- formats ----

def render(run: dict[str, Any], fmt: str) -> str:
    # Imported here: the renderers import this module's views.
    if fmt == "md":
        from repro.render_md import render_markdown

        return render_markdown(run)
    if fmt == "verdict-md":
        from repro.render_md import render_verdict_markdown

        return render_verdict_markdown(run)
    if fmt == "html":
        from repro.render_html import render_html

        return render_html(run)
    if fmt == "junit":
        from repro.render_junit import render_junit

        return render_junit(run)
    if fmt == "json":
        return json.dumps(run, indent=1) + "\n"
    raise UsageError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")


def write_all_formats(run: dict[str, Any], out_dir: Path) -> None:
    """report.md, report.html and junit.xml beside the run's run.json."""
    out_dir = Path(out_dir)
    for name, fmt in (("report.md", "md"), ("report.html", "html"), ("junit.xml", "junit")):
        rundir.write_atomic(out_dir / name, render(run, fmt))
