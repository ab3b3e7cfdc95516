"""The upstream-sync review of a stored run (base and head, each with the patches that apply):
the review's state read off the stored run (`review_state`), its one outcome decided by the
table in harness/runner/decision.py, per regression the state at base and at head and one
advice per patch, and the failure signatures grouped by how the sync changed them. A pure
function of the stored run and the patch assessments.

Every output reads the decision: review.md, review.json, the run's own reports (`run["review"]`),
junit, the terminal's last line and the exit status.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict
from typing import Any

from harness.runner import decision as table
from harness.runner import upstream_diff
from harness.runner.completeness import incomplete_reason
from harness.runner.decision import Decision, PatchState, RegressionState, ReviewState, SideState, SignatureGroup
from harness.runner.expectations import unmet
from harness.runner.status import BAD, JUDGED, known_bug_counts, unjudged
from harness.targets.patching import APPLIES, CONFLICT, FIX_FORK, FIX_UPSTREAM, IN_TREE
from repro import diff, reports
from repro.render_md import pr_paths

EXAMPLES = 2  # example case ids per group of changes
PATCH_STATE = {APPLIES: table.APPLIES, IN_TREE: table.PRESENT, CONFLICT: table.CONFLICTS}  # else stale


def _only(run: dict[str, Any], spec: str) -> dict[str, Any]:
    """The run seen as holding one target's results (for pairing base with head)."""
    targets = [t for t in run["environment"]["targets"] if t["spec"] == spec]
    return {**run, "environment": {**run["environment"], "targets": targets},
            "results": [r for r in run["results"] if r["target"] == spec]}


def labels(run: dict[str, Any], base: str, head: str) -> dict[str, str]:
    """Short names for the review's targets: base, head, base+PATCH, head+PATCH."""
    found = {base: "base", head: "head"}
    for spec in reports.target_specs(run):
        for tree, name in ((base, "base"), (head, "head")):
            if spec.startswith(f"{tree}+"):
                found[spec] = f"{name}+{spec[len(tree) + 1:]}"
    return found


def target_state(run: dict[str, Any], spec: str, regression: str,
                 kernels_own: frozenset[tuple[str, str]] = frozenset()) -> dict[str, Any]:
    """A target's role (and why) for a regression, and what its cases did, counted by verdict:
    "reproduces" counts only the predicted symptom; `state` is the decision table's word for it.
    `kernels_own`: (target, case) failures raised in a fork's own kernel module, counted apart."""
    target = reports.target_info(run, spec)
    mine = [r for r in run["results"] if r["target"] == spec and r["regression"] == regression]
    records = [r for r in mine if (spec, r["case_id"]) not in kernels_own]
    judged = [r for r in records if r["verdict"] in JUDGED]
    affected = [r for r in judged if r["expected"] == "affected"]
    verdicts = Counter(r["verdict"] for r in affected)
    symptom = sum(bool(r.get("symptom")) or r["verdict"] == "reproduced" for r in affected)
    bad = Counter(r["verdict"] for r in records if r["verdict"] in BAD)
    role = (target.get("roles") or {}).get(regression, "?")
    passed = sum(r["outcome"] == "pass" or r["verdict"] == "fixed" for r in affected)
    if not records:
        said = "not run"
    elif not affected:
        said = f"no affected case judged ({len(records)} cases, {len(judged)} judged)"
    elif role in ("unpatched", "unknown"):
        said = f"reproduces on {verdicts['reproduced']} of {len(affected)} affected cases"
    elif symptom:
        said = f"the bug is back: its symptom on {symptom} of {len(affected)} affected cases, expected fixed"
    else:
        said = f"fixed on {verdicts['fixed']} of {len(affected)} affected cases"
    if known := known_bug_counts(run, spec, regression):
        said += "; " + ", ".join(f"{n} show {rid}'s symptom" for rid, n in known.items())
    if bad:
        said += "; needs a look: " + ", ".join(f"{n} {v}" for v, n in sorted(bad.items()))
    if len(mine) > len(records):
        said += f"; {len(mine) - len(records)} failed in the fork's own kernels, not counted"
    if role == "predates":
        state = table.PREDATES
    elif symptom:
        state = table.REPRODUCES
    elif not affected or passed < len(affected):  # nothing judged, or failing otherwise: no fix is shown
        state = table.UNJUDGED
    else:
        state = table.FIXED_UPSTREAM if role == "fixed_upstream" else table.FIXED
    return {"spec": spec, "role": role, "why": (target.get("role_reasons") or {}).get(regression, ""),
            "cases": len(records), "judged": len(judged), "affected": len(affected), "reproduced": verdicts["reproduced"],
            "fixed": verdicts["fixed"], "symptom": symptom, "bad": dict(bad), "known_bugs": dict(known), "said": said,
            "state": state}


def _kernels(run: dict[str, Any], spec: str) -> str:
    """Who computed a target's kernels, from its stored description ("...; kernels: WHO (...); ..."),
    without machine paths."""
    found = re.search(r"kernels: (.*?)(?:; TE's own|$)", reports.target_info(run, spec).get("description") or "")
    return pr_paths(found.group(1)) if found else "?"


def provider(kernels: str) -> str:
    """The kernel provider without its counts: base and head of one provider read the same."""
    return re.sub(r" \((?:\d+ kernels|[^)]*names).*", "", kernels).split("; the harness stands in")[0]


def provider_file(kernels: str) -> str:
    """The tree file of a fork's own kernel module ("transformer_engine/…/x.py"), or ""."""
    found = re.search(r"\((transformer_engine/[^)]+\.py)\)", kernels)
    return found.group(1) if found else ""


# ---- the review's state, read off the stored run ----

def _short_cause(text: str) -> str:
    """A load failure as "file:line Error: message": the TE path's package prefix and the target's name cut."""
    text = re.sub(r"^(?:load error: )?target \S+: ", "", text)
    found = re.search(r"failed at (\S+?): (.*)$", text, re.DOTALL)
    text = f"{found.group(1)} {found.group(2)}" if found else text
    return pr_paths(" ".join(text.removeprefix("transformer_engine/pytorch/").split()))


def side_state(run: dict[str, Any], spec: str) -> SideState:
    records = [r for r in run["results"] if r["target"] == spec]
    description = reports.target_info(run, spec).get("description") or ""
    load_errors = [r for r in records if r["outcome"] == "harness_error" and "load" in (r.get("failed_checks") or [])]
    loads = not description.startswith("load error") and not (records and len(load_errors) == len(records))
    cause = (load_errors[0].get("note") or "") if load_errors else description
    unjudged_reasons = Counter(r.get("verdict_reason") or r["verdict"] for r in records if r["verdict"] not in JUDGED)
    problems = [p["problem"] for p in run.get("target_problems") or [] if p["target"] == spec]
    why = problems[0] if problems and not records else \
        (unjudged_reasons.most_common(1)[0][0] if unjudged_reasons else "")
    kernels = _kernels(run, spec)
    return SideState(loads=loads, load_cause="" if loads else _short_cause(cause), cases=len(records),
                     judged=sum(r["verdict"] in JUDGED for r in records), unjudged_cause=_short_cause(why),
                     kernels=provider(kernels))


def _where(detail: str) -> str:
    found = re.search(r"fails at (?:transformer_engine/pytorch/)?(\S+:\d+)", detail)
    return found.group(1) if found else ""


def patch_states(assessed: dict[str, list[dict[str, Any]]], base: str, head: str) -> list[PatchState]:
    """One state per (patch, regression it fixes): its text at base and at head, and the fix at head."""
    at_base = {a["patch"]: a for a in assessed.get(base, [])}
    found = []
    for a in assessed.get(head, []):
        b = at_base.get(a["patch"], a)
        for rid in a["fixes"]:
            found.append(PatchState(a["patch"], rid, PATCH_STATE.get(b["text"], table.STALE),
                                    PATCH_STATE.get(a["text"], table.STALE), a["fix"] in (FIX_UPSTREAM, FIX_FORK),
                                    _where(a.get("text_detail") or "")))
    return found


def _pairs(run: dict[str, Any], base: str, head: str) -> list[tuple[str, str]]:
    """(base side, head side) pairs: base with head, and each patched head with its base twin, else base."""
    specs = reports.target_specs(run)
    pairs = [(base, head)]
    for spec in specs:
        if spec.startswith(f"{head}+"):
            twin = base + spec[len(head):]
            pairs.append((twin if twin in specs else base, spec))
    return pairs


def _key(record: dict[str, Any], with_message: bool = False) -> str:
    """A failure's signature with its verdict; a harness error's is its cause (it has no TE frame).
    `with_message`: the message's start too (a fork's kernel module says there which kernel failed)."""
    if record["verdict"] == "harness_error":
        return f"harness_error: {_short_cause(record.get('note') or record.get('verdict_reason') or '')[:100]}"
    message = " ".join(((record.get("error") or {}).get("message") or "").split())[:120]
    return f"{record['verdict']}: {diff.signature(record)}" + (f": {message}" if with_message and message else "")


def _raised_in(record: dict[str, Any], module_file: str) -> bool:
    """Whether the failure's innermost TE frame lies in the fork's kernel module (or its package)."""
    where = ((record.get("error") or {}).get("location") or "").rpartition(":")[0]
    if not module_file or not where:
        return False
    package = module_file.rpartition("/")[0]
    own_package = package not in ("transformer_engine", "transformer_engine/pytorch")  # not TE's own folders
    return where == module_file or (own_package and where.startswith(package + "/"))


def _short_module(module_file: str) -> str:
    """A fork's kernel module as its folder inside the package ("plugin/core/"), as the first line names it."""
    return module_file.removeprefix("transformer_engine/").rpartition("/")[0] + "/" if "/" in module_file else module_file


def classify(run: dict[str, Any], base: str,
             head: str) -> tuple[list[dict[str, Any]], list[list[str]], frozenset[tuple[str, str]]]:
    """The failure signatures grouped by how the sync changed them, with examples, and the (target,
    case) pairs the review counts as failing: new and changed failures at head not raised in a
    fork's kernel module; and those (target, case) raised in a fork's kernel module. A head failure
    whose case did not run at base is standing when base fails with the same signature elsewhere
    (the same bug reaching a pipeline new to head)."""
    by_target: dict[str, dict[str, dict[str, Any]]] = {}
    for record in run["results"]:
        by_target.setdefault(record["target"], {})[record["case_id"]] = record
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    failing: list[list[str]] = []
    kernels_own: set[tuple[str, str]] = set()
    for base_spec, head_spec in _pairs(run, base, head):
        before, after = by_target.get(base_spec, {}), by_target.get(head_spec, {})
        base_failures = {_key(r) for r in before.values() if r["verdict"] in BAD}
        module = {s: provider_file(_kernels(run, s)) for s in (base_spec, head_spec)}
        for case_id, record in after.items():
            twin = before.get(case_id)
            if record["verdict"] == "not_judged" and twin is not None and diff.ran(twin):
                # lost coverage that also needs a person (an op of ours under a name we do not know)
                change, key, where = table.STOPPED, f"{twin['verdict']} → not_judged", ""
                failing.append([head_spec, case_id])
            elif record["verdict"] in BAD:
                key = _key(record)
                if twin is not None and twin["verdict"] in BAD and _key(twin) == key:
                    change = table.STANDING
                elif twin is None or not diff.ran(twin):
                    change = table.STANDING if key in base_failures else table.NEW
                else:
                    change = table.CHANGED if twin["verdict"] in BAD else table.NEW
                where = _short_module(module[head_spec]) if _raised_in(record, module[head_spec]) else ""
                if where:
                    kernels_own.add((head_spec, case_id))
                    key = _key(record, with_message=True)
                elif change in (table.NEW, table.CHANGED):
                    failing.append([head_spec, case_id])
            elif twin is not None and diff.ran(twin) and not diff.ran(record):
                change, key, where = table.STOPPED, f"{twin['verdict']} → not run", ""
            elif twin is not None and twin["verdict"] in BAD and diff.ran(record):
                change, key = table.FIXED_BY_SYNC, _key(twin)
                where = _short_module(module[base_spec]) if _raised_in(twin, module[base_spec]) else ""
                if where:
                    kernels_own.add((base_spec, case_id))
            else:
                continue
            groups.setdefault((change, record["regression"], key, where), []).append(case_id)
    ordered = sorted(groups.items(), key=lambda item: (table.CHANGES.index(item[0][0]), bool(item[0][3]),
                                                       -len(item[1])))
    found = [{"change": change, "regression": rid, "signature": key, "provider": where, "count": len(ids),
              "examples": ids[:EXAMPLES]} for (change, rid, key, where), ids in ordered]
    return found, failing, frozenset(kernels_own)


def _other_reasons(run: dict[str, Any], names: dict[str, str], regressions: list[dict[str, Any]],
                   upstream_tests: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """Reasons for a look that no other rule covers, and warnings (what base and head share)."""
    reasons = [line for reg in regressions for line in reg["unmet"]]
    warnings: list[str] = []
    problems = {(names.get(p["target"], p["target"]), p["problem"].replace(p["target"], "the tree"))
                for p in run.get("target_problems") or []}
    for side, text in sorted(problems):
        at_base_too = side.startswith("head") and ("base" + side[4:], text) in problems
        (reasons if side.startswith("head") and not at_base_too else warnings).append(f"{side}: {text}")
    lost = {(names.get(spec, spec), rid): why for spec, rid, why in unjudged(run)}
    for (side, rid), why in lost.items():
        if side.startswith("head"):
            at_base = lost.get(("base" + side[4:], rid))
            (warnings if at_base else reasons).append(f"{rid} could not be judged on {side}: {why}"
                                                      + (" (nor at base)" if at_base else ""))
    not_judged = Counter(r.get("verdict_reason") or "" for r in run["results"]
                         if names.get(r["target"], "").startswith("head") and r["verdict"] == "not_judged")
    if not_judged:  # lost coverage we cannot accept: the tree holds an op we cannot name
        why, _ = not_judged.most_common(1)[0]
        reasons.append(f"{sum(not_judged.values())} not_judged at head: {why}")
    if upstream_tests is not None:
        upstream_reasons, upstream_warnings = upstream_diff.judged(upstream_tests["changes"])
        reasons += upstream_diff.unjudged(upstream_tests) + upstream_reasons
        warnings += upstream_warnings
    return [pr_paths(r) for r in reasons], [pr_paths(w) for w in warnings]


def _missing(run: dict[str, Any]) -> str:
    parts = [incomplete_reason(run) or ""]
    if rejected := run.get("rejected"):
        parts.append(f"{len(rejected)} records rejected (the first: {rejected[0]})")
    return pr_paths("; ".join(p for p in parts if p))


def review(run: dict[str, Any], base: str, head: str, assessed: dict[str, list[dict[str, Any]]],
           accept_lost_coverage: bool = False, upstream_tests: dict[str, Any] | None = None) -> dict[str, Any]:
    """The review as data (review.json); `assessed` holds each tree's patch assessments;
    `upstream_tests`, upstream's own fuser tests on both (upstream_diff.section), when run."""
    comparison = diff.compare(_only(run, base), _only(run, head), [(base, head)])
    by_id = {(r["target"], r["case_id"]): r for r in run["results"]}
    changes = [{**c.__dict__, "before_signature": diff.signature(by_id.get((base, c.case_id))),
                "after_signature": diff.signature(by_id.get((head, c.case_id)))} for c in comparison.changes]
    names = labels(run, base, head)
    patches = patch_states(assessed, base, head)
    groups, failing, kernels_own = classify(run, base, head)
    regressions = []
    for info in run["regressions"]:
        rid = info["id"]
        states = {side: target_state(run, spec, rid, kernels_own) for side, spec in (("base", base), ("head", head))}
        patched = {f"{spec}+{a['patch']}": target_state(run, f"{spec}+{a['patch']}", rid, kernels_own)
                   for spec in (base, head) for a in assessed.get(spec, [])
                   if rid in a["fixes"] and f"{spec}+{a['patch']}" in reports.target_specs(run)}
        regressions.append({"id": rid, "title": info.get("title", ""), "upstream": info.get("upstream", ""),
                            "first_fixed": info.get("first_fixed"), **states, "patched": patched,
                            "patches": {side: [a for a in assessed.get(spec, []) if rid in a["fixes"]]
                                        for side, spec in (("base", base), ("head", head))},
                            "unmet": unmet(run, rid)})
    reg_states = {r["id"]: RegressionState(r["id"], r["base"]["state"], r["head"]["state"], r["head"]["symptom"],
                                           r["head"]["affected"]) for r in regressions}
    for reg in regressions:
        reg["advice"] = [dict(zip(("action", "text"), table.patch_advice(p, reg_states[reg["id"]]), strict=True),
                              patch=p.patch) for p in patches if p.regression == reg["id"]]
    other, warnings = _other_reasons(run, names, regressions, upstream_tests)
    state = ReviewState(
        base=side_state(run, base), head=side_state(run, head), regressions=tuple(reg_states.values()),
        patches=tuple(patches), missing=_missing(run), other=tuple(other), accept_lost_coverage=accept_lost_coverage,
        signatures=tuple(SignatureGroup(g["change"], g["signature"], g["count"], g["regression"], g["provider"])
                         for g in groups))
    decided = table.decide(state)
    warnings += [f"{reg['id']}: head still has it, as base did: {reg['head']['said']}" for reg in regressions
                 if reg["head"]["state"] == table.REPRODUCES and reg["base"]["state"] == table.REPRODUCES]
    return {"schema": "repro.review/3", "base": base, "head": head, "labels": names, **decision_fields(decided),
            "warnings": warnings, "state": asdict(state), "regressions": regressions, "changes": changes,
            "groups": groups, "failing": failing, "table": regression_rows(regressions),
            "compared": comparison.compared, "kernels": {"base": _kernels(run, base), "head": _kernels(run, head)},
            "trees": {side: _tree(run, spec) for side, spec in (("base", base), ("head", head))},
            **({"upstream_tests": upstream_tests} if upstream_tests is not None else {})}


def decision_fields(decided: Decision) -> dict[str, Any]:
    """What every output reads of the decision (review.json's top level, and the run's `review`)."""
    return {"status": decided.status, "outcome": decided.word, "rule": decided.rule, "headline": decided.headline,
            "recommendation": decided.headline, "fail_reasons": list(decided.reasons), "standing": decided.standing,
            "exit_code": decided.exit_code}


def _tree(run: dict[str, Any], spec: str) -> dict[str, Any]:
    target = reports.target_info(run, spec)
    return {"spec": spec, "version": target.get("version", "?"), "fuser_sha": target.get("fuser_sha", "?"),
            "source": target.get("source", "?"), "provenance": reports.provenance_text(target) or "not a git tree",
            "state": (target.get("provenance") or {}).get("git_state", "")}


def state_cell(state: dict[str, Any]) -> str:
    if not state["cases"]:
        return "not run"
    if not state["affected"]:  # a matrix without predictions (generated) judges cases none of which is affected
        judged = state.get("judged", 0)
        return f"{state['role']}: {judged} judged, none affected" if judged else f"{state['role']}: none judged"
    if state["role"] in ("unpatched", "unknown"):
        text = f"{state['role']}: reproduces {state['reproduced']}/{state['affected']}"
    elif state["symptom"]:
        text = f"{state['role']}: bug back {state['symptom']}/{state['affected']}"
    else:
        text = f"{state['role']}: fixed {state['fixed']}/{state['affected']}"
    return text + (" ⚠" if state["bad"] else "")


def regression_rows(regressions: list[dict[str, Any]]) -> list[list[str]]:
    """One row per regression: id, base, head, the action for each patch at head (text, unescaped)."""
    rows = []
    for reg in regressions:
        actions = ", ".join(f"{a['patch']}: {a['action']}" for a in reg["advice"]) or "-"
        rows.append([reg["id"], state_cell(reg["base"]), state_cell(reg["head"]), actions])
    return rows


def verdict_of(found: dict[str, Any]) -> dict[str, Any]:
    """What the run's own reports carry of the review: its decision, reasons, table and the cases it counts failing."""
    keys = ("status", "outcome", "rule", "headline", "recommendation", "fail_reasons", "standing", "exit_code",
            "warnings", "labels", "table", "failing")
    return {key: found[key] for key in keys}
