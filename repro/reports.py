"""Reports of a run: loading a run dir (finished or not), the views every format shares,
the summary object, and writing the formats into the run dir. The renderers live in render_*.py.

A renderer reads only the stored run: never today's case, matrix or oracle modules, so an
old run renders as it was judged. Axis order comes from the run's `axes` when it has them,
else from the order the results were stored in (matrix order).

A run that did not finish has no run.json; its results.jsonl is read instead, and
run-meta.json (written when the run starts) says which results were expected, so the
report can say how many are missing.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.errors import UsageError
from harness.model import SCHEMA, Run
from harness.runner import rundir, status
from harness.runner.status import counts, summarize, target_specs
from harness.runner.textsafe import safe_text, safe_value

OUTCOMES = ("pass", "crash", "wrong_output", "wrong_grad", "side_effect", "harness_error", "not_applicable",
            "skipped")
# The run model's verdicts, in its order, and those that need a person (harness/runner/status.py).
VERDICTS = status.VERDICTS
BAD_VERDICTS = status.BAD
# The axes a result may carry, in the order a case id is built from them; a run's own
# `axes` ({axis: [values]}), when it stores them, takes precedence.
AXIS_FIELDS = ("client", "pipeline", "grad_mode", "input", "params", "recompute", "sequence", "grad_form", "dtype",
               "device")
GRID_AXES = ("pipeline", "input", "grad_mode", "recompute")
# Worst first: the outcome a grid cell shows for a target when it holds several cases.
SEVERITY = ("harness_error", "crash", "wrong_output", "wrong_grad", "side_effect", "pass", "not_applicable",
            "skipped")
SYMBOLS = {"pass": "✓", "crash": "C", "wrong_output": "O", "wrong_grad": "G", "side_effect": "S",
           "harness_error": "H", "not_applicable": "-", "skipped": "·", "missing": "?"}
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
        return _checked_run(path)
    except RecursionError:  # in the decoder or in any check below it
        raise UsageError(f"cannot read {path}: it nests too deep to be a run") from None


def _checked_run(path: Path) -> dict[str, Any]:
    try:
        run = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"cannot read {path}: it is not UTF-8 text") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    if isinstance(run, dict) and run.get("schema") == "repro.run/1":
        raise UsageError(f"{path} is a repro.run/1 run, written before regressions were declared units; "
                         f"run it again with this version (repro run --matrix {run.get('matrix', 'issue22')})")
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        raise UsageError(f"{path} is not a {SCHEMA} run")
    rundir.check_run_document(run, path)
    run = safe_value(run)  # an escaped lone surrogate reads back as one
    try:
        return Run.model_validate(run).model_dump(mode="json", by_alias=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"{path} is not a valid {SCHEMA} run: {where}: {first['msg']}") from None


def _run_from_jsonl(run_dir: Path) -> dict[str, Any]:
    """What an unfinished run holds. run-meta.json names every (target, case id) the run was
    asked for (`expected_keys`), so every missing one can be listed."""
    found, problems = rundir.read_results(run_dir / "results.jsonl")
    meta = _read_meta(run_dir)
    by_key = {(r["target"], r["case_id"]): r for r in found}  # a repeated record: the last one counts
    specs = list(meta.get("targets") or dict.fromkeys(r["target"] for r in found))
    keys = meta.get("expected_keys")
    missing_keys: list[tuple[str, str]] = []
    if isinstance(keys, list):
        expected_keys = [(str(k[0]), str(k[1])) for k in keys if isinstance(k, list) and len(k) == 2]
        missing_keys = [k for k in expected_keys if k not in by_key]
        missing: int | None = len(missing_keys)
    else:
        expected = meta.get("expected_results")
        missing = expected - len(by_key) if isinstance(expected, int) else None
    run = {
        "schema": SCHEMA, "matrix": meta.get("matrix", "?"), "started_at": meta.get("started_at"),
        "environment": {"torch": "?", "python": "?", "platform": "?", "machine": "?",
                        "targets": [_bare_target(spec, run_dir, meta) for spec in specs]},
        "complete": False, "missing": missing, "problems": problems,
        "excluded": meta.get("excluded") or {}, "regressions": meta.get("regressions") or [],
        "headlines": {}, "results": list(by_key.values()),
        "report_source": "results.jsonl", "found_results": len(by_key),
        "missing_results": [{"target": t, "case_id": c} for t, c in missing_keys],
    }
    run["summary"] = summarize(run)
    return run


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _table(value: Any, cell: Callable[[Any], bool]) -> bool:
    return isinstance(value, dict) and all(isinstance(v, dict) and all(cell(c) for c in v.values())
                                           for v in value.values())


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


JSON_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}
# What each key of run-meta.json holds (harness.runner.sessions writes it; older runs held more), and how
# to say it: a run dir is anyone's to edit, and the report reads these before any record.
META_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "matrix": (lambda v: isinstance(v, str), "a matrix name (text)"),
    "only": (_texts, 'a list of "AXIS=VALUES" texts'),
    "targets": (_texts, 'a list of target specs (texts, e.g. ["te-2.13.0"])'),
    "started_at": (lambda v: v is None or isinstance(v, str), "a time as text"),
    "expected_results": (_count, "a count of results (a whole number, 0 or more)"),
    "expected_keys": (lambda v: isinstance(v, list) and all(_texts(k) and len(k) == 2 for k in v),
                      "a list of [target, case id] pairs of texts"),
    "excluded": (lambda v: _table(v, _count), "{regression: {reason: count}}"),
    "regressions": (lambda v: isinstance(v, list) and all(isinstance(r, dict) and isinstance(r.get("id"), str)
                                                          for r in v), "a list of regressions, each with its id"),
    "roles": (lambda v: _table(v, lambda c: isinstance(c, str)), "{target: {regression: role}}"),
}


def _read_meta(run_dir: Path) -> dict[str, Any]:
    """run-meta.json, each key checked against what a run writes there; none there: {}. One that is
    damaged is a usage error saying what is wrong, never a traceback in a report or a diff."""
    path = run_dir / "run-meta.json"
    if not path.is_file():
        return {}
    fix = f"fix or remove {path} (a report reads the results without it)"
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UsageError(f"cannot read {path}: {exc}; {fix}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path} is a JSON {JSON_KINDS.get(type(meta), '?')}, not an object of the run's facts; {fix}")
    for key, (valid, what) in META_KEYS.items():
        if key in meta and not valid(meta[key]):
            shown = safe_text(json.dumps(meta[key])[:60])
            raise UsageError(f"{path}: {key!r} is {shown} (a JSON {JSON_KINDS.get(type(meta[key]), '?')}); it must be "
                             f"{what}; {fix}")
    return meta


def _bare_target(spec: str, run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    from harness.runner.rundir import session_name

    description = run_dir / "sessions" / f"{session_name(spec)}.description"
    return {"spec": spec, "version": "?", "fuser_sha": "?", "patch": None, "patch_status": "?",
            "patch_detail": "", "backend": "?", "source": "?", "roles": (meta.get("roles") or {}).get(spec, {}),
            "description": description.read_text() if description.is_file() else ""}


# ---- views shared by the formats ----

def roles(run: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per target, its role for each regression (from the environment, else from the results)."""
    found: dict[str, dict[str, str]] = {t["spec"]: dict(t.get("roles") or {}) for t in run["environment"]["targets"]}
    for r in run["results"]:
        if r.get("role"):
            found.setdefault(r["target"], {}).setdefault(regression_of(r), r["role"])
    return found


def role_text(run: dict[str, Any], spec: str) -> str:
    by_regression = roles(run).get(spec) or {}
    distinct = set(by_regression.values())
    if len(distinct) == 1:
        return distinct.pop()
    return ", ".join(f"{reg}: {role}" for reg, role in by_regression.items()) or "?"


def target_info(run: dict[str, Any], spec: str) -> dict[str, Any]:
    """The stored environment entry of a target; empty when the run has none for it."""
    found: dict[str, Any] = next((t for t in run["environment"]["targets"] if t["spec"] == spec), {})
    return found


def provenance_text(target: dict[str, Any]) -> str:
    """A path: tree's commit (or "detached at COMMIT"), branch and clean/dirty state; "" for others."""
    git = target.get("provenance") or {}
    if not git.get("git_commit"):
        return ""
    branch = git.get("git_branch", "?")
    where = branch if branch.startswith("detached at") else f"({branch})" if git.get("revision") else f"on {branch}"
    return f"git {git['git_commit'][:12]} {where}, {git.get('git_state', '?')}"


def dirty_warnings(run: dict[str, Any]) -> list[str]:
    """One warning per tree with uncommitted changes: its results belong to no commit."""
    return [f"WARNING: {t['spec']} is a dirty tree (uncommitted changes on {(t.get('provenance') or {}).get('git_branch')}"
            f" at {(t.get('provenance') or {}).get('git_commit', '?')[:12]}): its results belong to no commit"
            for t in run["environment"]["targets"] if (t.get("provenance") or {}).get("git_state") == "dirty"]


def unvouched_text(records: list[dict[str, Any]]) -> str:
    """How many of `records` were judged against a reference the target's own worker computed (a
    record's `reference_from`: Megatron's block), which the judge cannot vouch for."""
    clients = ", ".join(sorted({str(r.get("client", "?")) for r in records}))
    targets = len({r["target"] for r in records})
    return (f"{len(records)} results ({clients}) on {targets} target{'s' * (targets != 1)} were judged against"
            " a reference the target's own worker computed: the judge cannot vouch for them")


def unvouched(run: dict[str, Any], regression: str | None = None) -> list[dict[str, Any]]:
    return [r for r in run["results"] if r.get("reference_from") and regression in (None, r["regression"])]


def run_warnings(run: dict[str, Any], with_references: bool = True) -> list[str]:
    """The lines under a run's verdict: dirty trees, target problems and (unless a rendering says it
    per regression) the results judged against a reference the judge cannot vouch for."""
    lines = [*dirty_warnings(run), *(p["problem"] for p in run.get("target_problems") or [])]
    if with_references and (records := unvouched(run)):
        lines.append(f"NOTE: {unvouched_text(records)}")
    return lines


def patch_text(target: dict[str, Any]) -> str:
    """The patch in two parts, `backport: stale (hunk ...); fix: upstream marker (...)`, or the
    single status of a run stored before the parts were recorded."""
    if not target.get("patch"):
        return target.get("patch_status") or "none"
    if not target.get("patch_text"):
        return f"{target['patch']}: {target.get('patch_status', '?')}"
    text = target["patch_text"]
    if text in ("stale", "conflict"):
        text += f" ({target.get('patch_text_detail', '')})"
    fix = target.get("patch_fix") or "?"
    if target.get("patch_fix_detail") and fix != "our patch in the tree":
        fix += f" ({target['patch_fix_detail']})"
    return f"{target['patch']}: {text}; fix before patching: {fix}"


def role_reasons(run: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(target, regression, role, why) for every target and regression the run stored."""
    return [(t["spec"], reg, role, (t.get("role_reasons") or {}).get(reg, ""))
            for t in run["environment"]["targets"] for reg, role in (t.get("roles") or {}).items()]


def regression_of(record: dict[str, Any]) -> str:
    if record.get("regression"):
        return record["regression"]
    head, sep, _ = record["case_id"].partition(":")
    return head if sep else "issue22"  # repro.run/1 held issue 22 only


def regression_ids(run: dict[str, Any]) -> list[str]:
    declared = [r["id"] for r in run.get("regressions") or []]
    seen = dict.fromkeys(regression_of(r) for r in run["results"])
    return declared + [r for r in seen if r not in declared]


def regression_info(run: dict[str, Any], regression: str) -> dict[str, Any]:
    return next((r for r in run.get("regressions") or [] if r["id"] == regression), {"id": regression})


def headlines(run: dict[str, Any]) -> dict[str, list[str]]:
    """Each regression's headline lines, as the run stored them (computed when it was assembled)."""
    stored = run.get("headlines") or {}
    return {reg: list(stored.get(reg) or []) for reg in regression_ids(run)}


def incomplete_note(run: dict[str, Any]) -> str | None:
    """One sentence for a run that did not finish or lost results; None for a complete one."""
    if run.get("complete", True):
        return None
    missing = run.get("missing")
    count = "an unknown number of" if missing is None else str(missing)
    if run.get("report_source") == "results.jsonl":
        return (f"INCOMPLETE: the run did not finish (no run.json); {run.get('found_results', 0)} results found"
                f" in results.jsonl, seals unchecked (the run's key went with it), {count} results missing.")
    return f"INCOMPLETE: {count} results missing from this run."


def verdict_rows(run: dict[str, Any], with_time: bool) -> tuple[list[str], list[list[Any]]]:
    """Per target: its role, results, and counts by verdict (only the verdicts that occur)."""
    verdicts = counts(run, "verdict")
    used = [v for v in VERDICTS if any(c[v] for c in verdicts.values())]
    headers = ["target", "role", "results", *used] + (["time (s)"] if with_time else [])
    rows = []
    for spec in target_specs(run):
        row = [spec, role_text(run, spec), sum(verdicts[spec].values()), *(verdicts[spec][v] for v in used)]
        if with_time:
            row.append(round(sum(r.get("duration_s") or 0.0 for r in run["results"] if r["target"] == spec), 2))
        rows.append(row)
    return headers, rows


def device_calls(run: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    """Per target, each CUDA call the CPU backend answered for TE's files (with the file and line
    that made it) and how many cases made it, most frequent first: what a port of TE to another
    device must replace. A call TE caches is seen in the first case of each worker only."""
    found: dict[str, Counter[str]] = {}
    for record in run["results"]:
        for call in record.get("device_calls") or []:
            found.setdefault(record["target"], Counter())[call] += 1
    return {spec: sorted(calls.items(), key=lambda item: (-item[1], item[0])) for spec, calls in found.items()}


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


def axes_of(run: dict[str, Any]) -> list[str]:
    """The axes the results carry, in case-id order."""
    if run.get("axes"):
        return list(run["axes"])
    present = {a for record in run["results"] for a in AXIS_FIELDS if a in record}
    return [a for a in AXIS_FIELDS if a in present]


def present_values(run: dict[str, Any]) -> dict[str, list[str]]:
    """Per axis, the values the run holds: in the run's declared order, else in stored (matrix) order."""
    declared = run.get("axes") or {}
    seen: dict[str, dict[str, None]] = defaultdict(dict)
    axes = axes_of(run)
    for record in run["results"]:
        for axis in axes:
            if axis in record:  # a regression's own scenario varies its own axes
                seen[axis][record[axis]] = None
    return {axis: [v for v in declared.get(axis, []) if v in seen[axis]] +
            [v for v in seen[axis] if v not in declared.get(axis, [])] for axis in axes}


def row_label(record: dict[str, Any]) -> str:
    """A grid row's first part: the pipeline of an ops case; a Megatron client's name (it builds
    its own pipeline), so its cases never share a cell with the ops pipelines'."""
    client = record.get("client", "ops")
    return record["pipeline"] if client == "ops" else client


def _report_scenario_first(record: dict[str, Any]) -> tuple[bool | str, ...]:
    return (record["recompute"] != "full_block", record["input"] != "non_leaf", record.get("params") != "trainable",
            record.get("dtype") != "float32", record["case_id"])


def frame_tables(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per target, the bug report's traceback frames against the observed traceback of one
    reproduced megatron_block case under full recompute (the report's setting) that raised the
    report's error (`report_error`), from the stored `frame_table`, and how many such cases of that
    target have every frame in order. The example is the report's own scenario where the run has
    it (method block, a non-leaf input)."""
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in run["results"]:
        if (record.get("client") == "megatron_block" and record.get("recompute") != "none"
                and record.get("frame_table") and record.get("report_error") and record["verdict"] == "reproduced"):
            found[record["target"]].append(record)
    tables = []
    for spec in target_specs(run):
        if records := sorted(found.get(spec, []), key=_report_scenario_first):
            complete = sum(all(row["observed"] and row["in_order"] for row in r["frame_table"]) for r in records)
            tables.append({"target": spec, "case_id": records[0]["case_id"], "rows": records[0]["frame_table"],
                           "cases": len(records), "all_frames_in_order": complete})
    return tables


def pivot(run: dict[str, Any], records: list[dict[str, Any]] | None = None,
          ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict[Any, dict[str, str]]]:
    """Rows pipeline x input, columns grad_mode x recompute; per cell and target the worst
    outcome over the other axes, with '!' appended when a verdict there is bad."""
    # The grid draws the call scenario's cases; a regression's own scenario has other axes.
    found = [r for r in (run["results"] if records is None else records)
             if r["outcome"] != "skipped" and all(a in r for a in GRID_AXES)]
    values = present_values(run)
    seen: dict[Any, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    bad: set[tuple[Any, str]] = set()
    for record in found:
        key = ((row_label(record), record["input"]), (record["grad_mode"], record["recompute"]))
        seen[key][record["target"]].append(record["outcome"])
        if record["verdict"] in BAD_VERDICTS:
            bad.add((key, record["target"]))
    labels = [*values.get("pipeline", []), *(c for c in values.get("client", []) if c != "ops")]
    rows = [(p, i) for p in labels for i in values.get("input", []) if any(k[0] == (p, i) for k in seen)]
    cols = [(g, r) for g in values.get("grad_mode", []) for r in values.get("recompute", [])
            if any(k[1] == (g, r) for k in seen)]
    cells = {key: {spec: worst(outs) + ("!" if (key, spec) in bad else "") for spec, outs in by_target.items()}
             for key, by_target in seen.items()}
    return rows, cols, cells


def signature(record: dict[str, Any]) -> tuple[str, str, str]:
    """What groups failures: the error's type, innermost TE frame and message; for a
    failure without an exception, the outcome and the checks that failed."""
    error = record.get("error")
    if error:
        message = (error.get("message") or "").strip().splitlines()
        return error.get("type") or "?", error.get("location") or "", message[0] if message else ""
    return record["outcome"], "", ", ".join(record.get("failed_checks") or []) or (record.get("note") or "")


def failure_groups(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Failing results grouped by signature, most frequent first; the example is the first stored."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in run["results"]:
        if record["outcome"] in FAILING:
            groups[signature(record)].append(record)
    order = {spec: i for i, spec in enumerate(target_specs(run))}
    out: list[dict[str, Any]] = []
    for sig, found in groups.items():
        by_target = Counter(r["target"] for r in found)
        out.append({"type": sig[0], "location": sig[1], "message": sig[2], "count": len(found),
                    "targets": sorted(by_target.items(), key=lambda kv: order.get(kv[0], len(order))),
                    "verdicts": sorted(Counter(r["verdict"] for r in found).items()),
                    "example": found[0]})
    out.sort(key=lambda g: (-g["count"], g["type"], g["location"], g["message"]))
    return out


def needs_attention(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The results whose verdict makes the run FAIL, in stored order."""
    return [r for r in run["results"] if r["verdict"] in BAD_VERDICTS]


def show_command(case_id: str, target: str, standalone: bool | None = None) -> str:
    """The command that writes the case's reproducer: `--standalone` only where the record says
    one can be written (a run stored before records said so: any case but a Megatron client's)."""
    if standalone is None:
        standalone = not case_id.partition(":")[2].startswith("megatron_")
    return shlex.join(["repro", "show", case_id, "--target", target, "--script", *(["--standalone"] * standalone)])


def shrink_command(case_id: str, target: str) -> str:
    """The command that reduces the case to a minimal one failing the same way (`repro shrink`)."""
    return shlex.join(["repro", "shrink", case_id, "--target", target])


def reproduce_command(case_id: str, target: str, standalone: bool) -> str:
    """Write the reproducer and run it: the standalone one through `repro exec`, else the harness's script."""
    run = shlex.join(["repro", "exec", "--target", target, "--", "python", "case.py"]) if standalone else "python case.py"
    return f"{show_command(case_id, target, standalone)} > case.py && {run}"
