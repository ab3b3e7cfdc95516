"""The upstream-sync review of a stored run (base and head, each with the patches that
apply): one verdict and one recommendation, per regression the state at base and at head and
what to do with each patch, the cases whose result changed grouped by signature, and both
trees' provenance. A pure function of the stored run and the patch assessments.

The verdict is the review's, and the run's own reports carry it (`run["review"]`): FAIL when
the head does something base did not (a new or changed failure, lost coverage, a bug back, a
bad verdict, a target problem, a regression it could not judge), when a declared expectation
is not met, or when results are missing. What base and head share equally is a warning.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from harness.runner import upstream_diff
from harness.runner.completeness import incomplete_reason
from harness.runner.expectations import unmet
from harness.runner.status import BAD, JUDGED, known_bug_counts, unjudged
from repro import diff, reports

EXAMPLES = 2  # example case ids per group of changes
GROUPS_LISTED = 12  # groups of changes in review.md's table; all are in review.json
DROP = "drop the backport"


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


def target_state(run: dict[str, Any], spec: str, regression: str) -> dict[str, Any]:
    """A target's role (and why) for a regression, and what its cases did, counted by verdict:
    "reproduces" counts only the predicted symptom."""
    target = reports.target_info(run, spec)
    records = [r for r in run["results"] if r["target"] == spec and r["regression"] == regression]
    judged = [r for r in records if r["verdict"] in JUDGED]
    affected = [r for r in judged if r["expected"] == "affected"]
    verdicts = Counter(r["verdict"] for r in affected)
    symptom = sum(bool(r.get("symptom")) or r["verdict"] == "reproduced" for r in affected)
    bad = Counter(r["verdict"] for r in records if r["verdict"] in BAD)
    role = (target.get("roles") or {}).get(regression, "?")
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
    return {"spec": spec, "role": role, "why": (target.get("role_reasons") or {}).get(regression, ""),
            "cases": len(records), "affected": len(affected), "reproduced": verdicts["reproduced"],
            "fixed": verdicts["fixed"], "symptom": symptom, "bad": dict(bad), "known_bugs": dict(known), "said": said}


def patch_advice(assessment: dict[str, Any], head: dict[str, Any], patched: dict[str, Any] | None) -> str:
    """What to do with one patch at head, from its two parts, the head's role and what the head
    and the head with the patch applied did."""
    name = assessment["patch"]
    if head["role"] == "predates":
        return f"no backport needed: the head predates the regression ({head['why']})"
    if assessment["text"] == "applies" and head["symptom"]:
        fixed = f" (with it: {patched['said']})" if patched else ""
        return f"re-apply patches/{name}.patch: it applies{fixed}"
    if assessment["text"] == "conflict" and head["affected"] and not head["symptom"] and not head["bad"]:
        return (f"{assessment['advice']}; yet the head passes every one of its {head['affected']} affected cases:"
                " the fix may be there in a form no marker knows; look, then add a marker to"
                f" patches/{name}.toml or drop the backport")
    return str(assessment["advice"])


def _kernels(run: dict[str, Any], spec: str) -> str:
    """Who computed a target's kernels, from its stored description ("...; kernels: WHO (...); ...")."""
    found = re.search(r"kernels: (.*?)(?:; TE's own|$)", reports.target_info(run, spec).get("description") or "")
    return found.group(1) if found else "?"


def _provider(kernels: str) -> str:
    """The kernel provider without its counts: base and head of one provider read the same."""
    return re.sub(r" \(.*", "", kernels)


def _twin_states(run: dict[str, Any], spec: str, twin: str | None) -> tuple[Counter[str], Counter[str]]:
    """Bad verdicts at `spec` (by verdict and signature), and those its twin at base shares case for case."""
    theirs = {r["case_id"]: r for r in run["results"] if r["target"] == twin}
    ours: Counter[str] = Counter()
    shared: Counter[str] = Counter()
    for record in run["results"]:
        if record["target"] != spec or record["verdict"] not in BAD:
            continue
        key = f"{record['verdict']}: {diff.signature(record)}"
        ours[key] += 1
        other = theirs.get(record["case_id"])
        if other and other["verdict"] == record["verdict"] and diff.signature(other) == diff.signature(record):
            shared[key] += 1
    return ours, shared


def _bad_lines(who: str, found: Counter[str]) -> list[str]:
    """One line per verdict: how many results, in how many signatures."""
    results: Counter[str] = Counter()
    signatures: Counter[str] = Counter()
    for key, n in found.items():
        verdict = key.partition(":")[0]
        results[verdict] += n
        signatures[verdict] += 1
    return [f"{who}: {n} {v} ({signatures[v]} signature{'s' * (signatures[v] > 1)})" for v, n in results.items()]


def group_changes(changes: list[dict[str, Any]], regression_of: dict[str, str]) -> list[dict[str, Any]]:
    """Changes grouped by kind, regression and the two signatures, most first, with examples."""
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for change in changes:
        key = (change["kind"], regression_of.get(change["case_id"], change["case_id"].partition(":")[0]),
               change["before_signature"], change["after_signature"])
        groups.setdefault(key, []).append(change["case_id"])
    out: list[dict[str, Any]] = [{"kind": k[0], "regression": k[1], "base": k[2], "head": k[3], "count": len(ids),
                                  "examples": ids[:EXAMPLES]} for k, ids in groups.items()]
    out.sort(key=lambda g: (diff.KINDS.index(g["kind"]), -g["count"]))
    return out


def review(run: dict[str, Any], base: str, head: str, assessed: dict[str, list[dict[str, Any]]],
           accept_lost_coverage: bool = False, upstream_tests: dict[str, Any] | None = None) -> dict[str, Any]:
    """The review as data (review.json); `assessed` holds each tree's patch assessments;
    `upstream_tests`, upstream's own fuser tests on both (upstream_diff.section), when run."""
    comparison = diff.compare(_only(run, base), _only(run, head), [(base, head)])
    by_id = {(r["target"], r["case_id"]): r for r in run["results"]}
    changes = [{**c.__dict__, "before_signature": diff.signature(by_id.get((base, c.case_id))),
                "after_signature": diff.signature(by_id.get((head, c.case_id)))} for c in comparison.changes]
    names = labels(run, base, head)
    kernels = {side: _kernels(run, spec) for side, spec in (("base", base), ("head", head))}
    same_kernels = _provider(kernels["base"]) == _provider(kernels["head"])
    regressions = []
    for info in run["regressions"]:
        rid = info["id"]
        patches = {side: [a for a in assessed[spec] if rid in a["fixes"]] for side, spec in (("base", base),
                                                                                              ("head", head))}
        patched = {f"{spec}+{a['patch']}": target_state(run, f"{spec}+{a['patch']}", rid)
                   for spec, side in ((base, "base"), (head, "head")) for a in patches[side]
                   if f"{spec}+{a['patch']}" in reports.target_specs(run)}
        states = {side: target_state(run, spec, rid) for side, spec in (("base", base), ("head", head))}
        advice = [patch_advice(a, states["head"], patched.get(f"{head}+{a['patch']}")) for a in patches["head"]]
        regressions.append({
            "id": rid, "title": info.get("title", ""), "upstream": info.get("upstream", ""),
            "first_fixed": info.get("first_fixed"), **states, "patches": patches, "patched": patched,
            "advice": advice, "drop_backport": [a["patch"] for a, said in zip(patches["head"], advice, strict=True)
                                                if DROP in said],
            "back": bool(states["head"]["symptom"]) and not states["base"]["symptom"],
            "unmet": unmet(run, rid)})
    reasons: list[str] = []
    warnings: list[str] = []
    for spec in [s for s in reports.target_specs(run) if names.get(s, "").startswith("head")]:
        twin = base + spec[len(head):]
        ours, shared = _twin_states(run, spec, twin)
        reasons += _bad_lines(names[spec], ours - shared)
        warnings += _bad_lines(f"{names[spec]} and {names.get(twin, twin)} both", shared)
    reasons += [line for reg in regressions for line in reg["unmet"]]
    reasons += [f"{reg['id']} is back at head: {reg['head']['said']}" for reg in regressions if reg["back"]]
    kinds = Counter(c["kind"] for c in changes)
    failing = [k for k in diff.FAILING_KINDS if kinds[k] and not (k == "stopped running" and accept_lost_coverage)]
    if failing and not same_kernels:
        warnings.append(f"base and head computed kernels with different code (base: {kernels['base']}; head:"
                        f" {kernels['head']}): {sum(kinds[k] for k in failing)} changes may be the kernels', not"
                        " the sync's")
    elif failing:
        reasons += [f"{kinds[k]} cases {k_text}" for k, k_text in (
            ("new failure", "pass at base and fail at head"), ("changed failure", "fail differently at head"),
            ("stopped running", "ran at base and not at head (lost coverage; --accept-lost-coverage to accept)"))
            if k in failing]
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
    for reg in regressions:
        if reg["head"]["symptom"] and not reg["back"]:
            warnings.append(f"{reg['id']}: head still has it, as base did: {reg['head']['said']}")
    if missing := incomplete_reason(run):
        reasons.append(missing)
    if upstream_tests is not None:
        upstream_reasons, upstream_warnings = upstream_diff.judged(upstream_tests["changes"])
        reasons += upstream_diff.unjudged(upstream_tests) + upstream_reasons
        warnings += upstream_warnings
    status = "FAIL" if reasons else "PASS"
    return {"schema": "repro.review/2", "base": base, "head": head, "labels": names, "status": status,
            "recommendation": recommendation(status, reasons, regressions, changes, same_kernels),
            "fail_reasons": reasons, "warnings": warnings, "regressions": regressions, "changes": changes,
            "groups": group_changes(changes, {}), "table": regression_rows(regressions), "compared": comparison.compared, "kernels": kernels,
            "trees": {side: _tree(run, spec) for side, spec in (("base", base), ("head", head))},
            **({"upstream_tests": upstream_tests} if upstream_tests is not None else {})}


def recommendation(status: str, reasons: list[str], regressions: list[dict[str, Any]],
                   changes: list[dict[str, Any]], same_kernels: bool = True) -> str:
    """One line: merge, do not merge, or needs a look; the reason and the next step."""
    if status == "PASS":
        drops = [f"patches/{p}.patch" for reg in regressions for p in reg["drop_backport"]]
        still = [f"{reg['id']} is still there, as at base" + (f": {reg['advice'][0]}" if reg["advice"] else "")
                 for reg in regressions if reg["head"]["symptom"]]
        return "; ".join(["Merge: no regression at head", *still]
                         + ([f"drop {', '.join(drops)}: upstream's fix is present"] if drops else []))
    for reg in regressions:
        if reg["back"]:
            step = next((a for a in reg["advice"] if a.startswith("re-apply")), None) or \
                (reg["advice"][0] if reg["advice"] else "no patch of ours fixes it: fix it before merging")
            return (f"Do not merge: {reg['id']} is back at head (its symptom on {reg['head']['symptom']} of"
                    f" {reg['head']['affected']} affected cases); {step.split(' (with it')[0]}")
    new = sum(c["kind"] == "new failure" for c in changes)
    if new and not same_kernels:
        return (f"Needs a look: base and head ran different kernel code, so the {len(changes)} changed cases may be"
                " the kernels', not the sync's; review both on one kernel provider")
    if new:
        return (f"Do not merge: {new} cases pass at base and fail at head; see the changes below"
                " (repro bisect names the commit)")
    return f"Needs a look: {reasons[0]}"


def _tree(run: dict[str, Any], spec: str) -> dict[str, Any]:
    target = reports.target_info(run, spec)
    return {"spec": spec, "version": target.get("version", "?"), "fuser_sha": target.get("fuser_sha", "?"),
            "source": target.get("source", "?"), "provenance": reports.provenance_text(target) or "not a git tree",
            "state": (target.get("provenance") or {}).get("git_state", "")}


def state_cell(state: dict[str, Any]) -> str:
    if not state["cases"]:
        return "not run"
    if not state["affected"]:
        return f"{state['role']}: none judged"
    if state["role"] in ("unpatched", "unknown"):
        text = f"{state['role']}: reproduces {state['reproduced']}/{state['affected']}"
    elif state["symptom"]:
        text = f"{state['role']}: bug back {state['symptom']}/{state['affected']}"
    else:
        text = f"{state['role']}: fixed {state['fixed']}/{state['affected']}"
    return text + (" ⚠" if state["bad"] else "")


def patch_action(advice: str) -> str:
    """The patch action in a few words, for the table (the whole advice is listed below it)."""
    for words, short in (("drop the backport", "drop"), ("re-apply", "re-apply"), ("conflicts", "conflicts"),
                         ("no backport needed", "not needed"), ("keep the backport", "keep"),
                         ("still needed and applies", "apply"), ("check by hand", "check by hand")):
        if words in advice:
            return short
    return "see below"


def regression_rows(regressions: list[dict[str, Any]]) -> list[list[str]]:
    """One row per regression: id, base, head, the action for each patch at head (text, unescaped)."""
    rows = []
    for reg in regressions:
        patches = [a["patch"] for a in reg["patches"]["head"]]
        actions = ", ".join(f"{p}: {patch_action(a)}" for p, a in zip(patches, reg["advice"], strict=True)) or "-"
        rows.append([reg["id"], state_cell(reg["base"]), state_cell(reg["head"]), actions])
    return rows


def verdict_of(found: dict[str, Any]) -> dict[str, Any]:
    """What the run's own reports carry of the review: its status, reasons, recommendation and table."""
    return {key: found[key] for key in ("status", "recommendation", "fail_reasons", "warnings", "labels", "table")}
