"""The upstream-sync review of a stored run (base and head, each with the patches that
apply): per regression, the state at base and at head, each patch's status at both, whether
the backport can be dropped, the cases whose result changed from base to head, and both
trees' provenance. A pure function of the stored run and the patch assessments."""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.runner.completeness import incomplete_reason
from harness.runner.expectations import unmet
from repro import diff, reports
from repro.render_md import code, details, fit, plain, table

NOT_RUN = ("not_applicable", "harness_error")
CHANGES_LISTED = 50  # in the table; up to CHANGES_DETAILED more in <details>, all in review.json
CHANGES_DETAILED = 400


def _only(run: dict[str, Any], spec: str) -> dict[str, Any]:
    """The run seen as holding one target's results (for pairing base with head)."""
    targets = [t for t in run["environment"]["targets"] if t["spec"] == spec]
    return {**run, "environment": {**run["environment"], "targets": targets},
            "results": [r for r in run["results"] if r["target"] == spec]}


def target_state(run: dict[str, Any], spec: str, regression: str) -> dict[str, Any]:
    """A target's role (and why) for a regression, and what its affected cases did."""
    target = reports.target_info(run, spec)
    ran = [r for r in run["results"] if r["target"] == spec and r["regression"] == regression
           and r["outcome"] not in NOT_RUN]
    affected = [r for r in ran if r["expected"] == "affected"]
    failing = sum(r["outcome"] != "pass" for r in affected)
    bad = Counter(r["verdict"] for r in ran if r["verdict"] in reports.BAD_VERDICTS)
    role = (target.get("roles") or {}).get(regression, "?")
    if not affected:
        said = f"no affected case ran ({len(ran)} cases)"
    elif failing:
        said = f"reproduces on {failing} of {len(affected)} affected cases"
    else:
        said = f"passes every one of {len(affected)} affected cases"
    if bad:
        said += "; needs a look: " + ", ".join(f"{n} {v}" for v, n in sorted(bad.items()))
    return {"spec": spec, "role": role, "why": (target.get("role_reasons") or {}).get(regression, ""),
            "affected": len(affected), "failing": failing, "bad": dict(bad), "said": said}


def observed_advice(assessment: dict[str, Any], head: dict[str, Any]) -> str:
    """The patch's advice, with what the head did: a patch that conflicts where no marker finds
    the fix, on a head that passes every affected case, may meet a fix in a form we do not know."""
    if assessment["text"] == "conflict" and head["affected"] and not head["failing"]:
        return (f"{assessment['advice']}; yet the head passes every one of its {head['affected']} affected cases:"
                " the fix may be there in a form no marker knows; look, then add a marker to"
                f" patches/{assessment['patch']}.toml or drop the backport")
    return assessment["advice"]


def review(run: dict[str, Any], base: str, head: str, assessed: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The review as data (review.json); `assessed` holds each tree's patch assessments."""
    comparison = diff.compare(_only(run, base), _only(run, head), [(base, head)])
    changes = [c.__dict__ for c in comparison.changes]
    head_specs = [t["spec"] for t in run["environment"]["targets"] if t["spec"] == head or
                  t["spec"].startswith(f"{head}+")]
    regressions = []
    for info in run["regressions"]:
        rid = info["id"]
        patches = {side: [a for a in assessed[spec] if rid in a["fixes"]] for side, spec in (("base", base),
                                                                                              ("head", head))}
        patched = {f"{spec}+{a['patch']}": target_state(run, f"{spec}+{a['patch']}", rid)
                   for spec, side in ((base, "base"), (head, "head")) for a in patches[side]
                   if f"{spec}+{a['patch']}" in reports.target_specs(run)}
        regressions.append({
            "id": rid, "title": info.get("title", ""), "upstream": info.get("upstream", ""),
            "first_fixed": info.get("first_fixed"), "base": target_state(run, base, rid),
            "head": target_state(run, head, rid), "patches": patches, "patched": patched,
            "advice": [observed_advice(a, target_state(run, head, rid)) for a in patches["head"]],
            "drop_backport": [a["patch"] for a in patches["head"] if "drop the backport" in a["advice"]],
            "unmet": unmet(run, rid)})
    head_bad = Counter(r["verdict"] for r in run["results"] if r["target"] in head_specs
                       and r["verdict"] in reports.BAD_VERDICTS)
    reasons = [f"head: {n} {v}" for v, n in sorted(head_bad.items())]
    reasons += [line for reg in regressions for line in reg["unmet"]]
    new_regressions = sum(c["kind"] == "new regression" for c in changes)
    if new_regressions:
        reasons.append(f"{new_regressions} cases pass at base and fail at head")
    reasons += [p["problem"] for p in run.get("target_problems") or []]
    if missing := incomplete_reason(run):
        reasons.append(missing)
    return {"schema": "repro.review/1", "base": base, "head": head, "status": "FAIL" if reasons else "PASS",
            "fail_reasons": reasons, "regressions": regressions, "changes": changes,
            "compared": comparison.compared, "trees": {side: _tree(run, spec) for side, spec in (("base", base),
                                                                                                  ("head", head))}}


def _tree(run: dict[str, Any], spec: str) -> dict[str, Any]:
    target = reports.target_info(run, spec)
    return {"spec": spec, "version": target.get("version", "?"), "fuser_sha": target.get("fuser_sha", "?"),
            "source": target.get("source", "?"), "provenance": reports.provenance_text(target) or "not a git tree",
            "state": (target.get("provenance") or {}).get("git_state", "")}


def _patch_cell(assessment: dict[str, Any] | None) -> str:
    if assessment is None:
        return "-"
    text = plain(assessment["text"])
    if assessment["text"] in ("stale", "conflict"):
        text += f" ({plain(assessment['text_detail'])})"
    fix = plain(assessment["fix"]) + (f" ({plain(assessment['fix_detail'])})" if assessment["fix_detail"] else "")
    return f"{text}; fix: {fix}"


def _applied_cell(reg: dict[str, Any], spec: str, assessment: dict[str, Any] | None) -> str:
    if spec in reg["patched"]:
        return plain(reg["patched"][spec]["said"])
    return f"not run (the patch text: {plain(assessment['text'])})" if assessment else "-"


def render_review(found: dict[str, Any], paths: dict[str, str] | None = None) -> str:
    """PR-ready Markdown: the answer first, then each regression, the changed cases, the trees."""
    mark = "✅" if found["status"] == "PASS" else "❌"
    base, head = found["base"], found["head"]
    lines = [f"# Upstream-sync review: {mark} {found['status']}", "",
             f"base {code(base, False)} → head {code(head, False)}; {found['compared']} case results compared.", ""]
    if found["fail_reasons"]:
        lines += ["**Failing because:**", *(f"- {plain(r)}" for r in found["fail_reasons"]), ""]
    trees = found["trees"]
    lines += table(["", "base", "head"], [
        ["tree", code(trees["base"]["spec"]), code(trees["head"]["spec"])],
        ["commit", plain(trees["base"]["provenance"]), plain(trees["head"]["provenance"])],
        ["version", code(trees["base"]["version"]), code(trees["head"]["version"])],
        ["fuser.py", code(trees["base"]["fuser_sha"]), code(trees["head"]["fuser_sha"])]]) + [""]
    for side in ("base", "head"):
        if trees[side]["state"] == "dirty":
            lines += [(f"> **WARNING: the {side} tree is dirty (uncommitted changes): its results belong to no"
                       " commit.**"), ""]
    for reg in found["regressions"]:
        about = "; ".join(x for x in (plain(reg["title"]), f"upstream {plain(reg['upstream'])}" if reg["upstream"]
                                      else "", f"fixed in {plain(reg['first_fixed'])}" if reg["first_fixed"] else "")
                          if x)
        lines += [f"## {plain(reg['id'])}" + (f" ({about})" if about else ""), ""]
        rows = [["role", *(f"**{plain(reg[s]['role'])}** — {plain(reg[s]['why'])}" for s in ("base", "head"))],
                ["the tree as it is", plain(reg["base"]["said"]), plain(reg["head"]["said"])]]
        names = list(dict.fromkeys(a["patch"] for side in ("base", "head") for a in reg["patches"][side]))
        for name in names:
            by_side = {s: next((a for a in reg["patches"][s] if a["patch"] == name), None) for s in ("base", "head")}
            rows.append([f"{plain(name)}: patch text; fix", _patch_cell(by_side["base"]), _patch_cell(by_side["head"])])
            rows.append([f"with {plain(name)} applied",
                         *(_applied_cell(reg, f"{spec}+{name}", by_side[side])
                           for spec, side in ((base, "base"), (head, "head")))])
        lines += table(["", "base", "head"], rows) + [""]
        lines += [f"- **{plain(advice)}**" for advice in reg["advice"]]
        lines += [f"- **{plain(line)}**" for line in reg["unmet"]]
        if head_bad := reg["head"]["bad"]:
            lines.append("- **head needs a look: " + ", ".join(f"{n} {v}" for v, n in sorted(head_bad.items())) + "**")
        elif not reg["unmet"]:
            lines.append("- no regression at head")
        lines.append("")
    lines += _changes(found["changes"])
    if paths:
        lines += ["Reports: " + ", ".join(code(p, False) for p in paths.values()), ""]
    return fit("\n".join(lines).rstrip("\n") + "\n")


def _changes(changes: list[dict[str, Any]]) -> list[str]:
    if not changes:
        return ["## Cases whose result changed, base → head", "",
                "None: every case has the same outcome, verdict, error and failed checks at base and head.", ""]
    counts = Counter(c["kind"] for c in changes)
    rows = [[plain(c["kind"]), code(c["case_id"]), code(c["before"]), code(c["after"])] for c in changes]
    lines = [f"## Cases whose result changed, base → head ({len(changes)})", "",
             ", ".join(f"{counts[k]} {k}" for k in diff.KINDS if counts[k]) + " (pass → fail is a new regression).",
             "", *table(["change", "case", "base", "head"], rows[:CHANGES_LISTED]), ""]
    if len(rows) > CHANGES_LISTED:
        rest = rows[CHANGES_LISTED:CHANGES_LISTED + CHANGES_DETAILED]
        more = len(rows) - CHANGES_LISTED - len(rest)
        lines += details(f"{len(rows) - CHANGES_LISTED} more", table(["change", "case", "base", "head"], rest)
                         + (["", f"and {more} more in review.json"] if more else []))
    return lines
