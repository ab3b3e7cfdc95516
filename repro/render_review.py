"""review.md: the upstream-sync review for a pull request. It opens with the decision's first line
(harness/runner/decision.py), the standing failures, then one row per regression (base, head,
what to do with the patch), every matching reason and the warnings, one advice per patch, the
kernels when a side's are not the harness's, the failure signatures by change, and the details
folded. No machine path or 40-hex id reaches it (`pr_text`).

Every table's cells are short (the specs sit in a legend, case ids in lists below the tables),
so no table is wider than a pull-request comment. `review_block` is the head of report.html too.
"""

from __future__ import annotations

import re
from typing import Any

from repro.render_md import code, details, fit, plain, pr_paths, table

UPSTREAM_PR = re.compile(r"([\w.-]+/[\w.-]+) PR #(\d+)")
GROUPS_LISTED = 12


def linked(text: str) -> str:
    """Plain Markdown with "OWNER/REPO PR #N" as a link to the pull request."""
    out, last = [], 0
    for match in UPSTREAM_PR.finditer(text):
        out.append(plain(text[last:match.start()]) + " " * text[last:match.start()].endswith(" "))
        out.append(f"[{plain(match.group(0))}](https://github.com/{match.group(1)}/pull/{match.group(2)})")
        last = match.end()
    rest = text[last:]
    return "".join(out) + " " * (bool(out) and rest.startswith(" ")) + plain(rest)  # plain() trims the space


def short_signature(text: str) -> str:
    return text.replace("transformer_engine/pytorch/", "")


def review_block(found: dict[str, Any]) -> list[str]:
    """The decision's first line, the standing failures, and the per-regression table: the head of
    review.md and of report.html."""
    lines = [f"# {plain(found['headline'])}", ""]
    lines += [f"_{plain(found['standing'])}._", ""] if found.get("standing") else []
    rows = [[plain(cell) for cell in row] for row in found["table"]]
    lines += table(["regression", "base", "head", "patch at head"], rows) + [""]
    return lines


def pr_spec(spec: str) -> str:
    """A target spec as a pull request shows it: a tree's folder name, not its machine path; a short commit."""
    if spec.startswith("path:"):
        path, at, rev = spec[len("path:"):].partition("@")
        name = path.rstrip("/").rsplit("/", 1)[-1] or path
        patch = ""
        if not at and "+" in name:
            name, _, patch = name.partition("+")
        elif at and "+" in rev:
            rev, _, patch = rev.partition("+")
        return f"path:{name}" + (f"@{short_ids(rev)}" if at else "") + (f"+{patch}" if patch else "")
    return spec


def short_ids(text: str) -> str:
    """40-hex commit ids cut to 12 characters."""
    return re.sub(r"\b([0-9a-f]{12})[0-9a-f]{28}\b", r"\1", text)


def pr_text(text: str, specs: list[str]) -> str:
    """Machine paths and 40-hex ids out of a PR text: every spec as `pr_spec` writes it, and any other
    absolute path cut to its part inside the TE tree."""
    for spec in sorted(specs, key=len, reverse=True):
        text = text.replace(spec, pr_spec(spec)).replace(plain(spec), plain(pr_spec(spec)))
    return short_ids(pr_paths(text))


def render_review(found: dict[str, Any], paths: dict[str, str] | None = None,
                  ops: dict[str, Any] | None = None, bisects: str = "") -> str:
    """PR-ready Markdown; `paths`: the run's reports, relative to the run dir; `ops`: what the
    sync changed in transformer_engine/pytorch/ops/ (harness/targets/history.py), when known;
    `bisects`: the `repro bisect` offered per changed signature (repro/review_bisect.py)."""
    lines = review_block(found)
    legend = "; ".join(f"**{plain(label)}** = {code(spec, False)}" for spec, label in found["labels"].items())
    lines += [f"{found['compared']} case results compared. {legend}.", ""]
    if found["fail_reasons"]:
        lines += ["**Failing because** (first the deciding reason):", *(f"- {plain(r)}" for r in found["fail_reasons"]),
                  ""]
    if found["warnings"]:
        lines += ["**Warnings** (not failing the review):", *(f"- {plain(w)}" for w in found["warnings"]), ""]
    advice = [f"- **{plain(reg['id'])}**: {plain(a['text'])}" for reg in found["regressions"] for a in reg["advice"]]
    lines += (["**What to do with each patch:**", *advice, ""] if advice else [])
    lines += _providers(found)
    lines += _groups(found["groups"], len(found["changes"]))
    lines += bisects.strip("\n").splitlines() + [""] if bisects else []
    lines += _upstream_tests(found.get("upstream_tests"))
    lines += _regression_details(found)
    lines += _trees(found)
    if ops:
        body = ["```", *ops["stat"], "```", "", *(f"- {code(c, False)}" for c in ops["commits"])]
        body += [f"- and {ops['more']} more"] if ops.get("more") else []
        lines += details(f"What the sync changed in transformer_engine/pytorch/ops/ ({len(ops['commits'])}"
                         f"{'+' if ops.get('more') else ''} commits)", body)
    if paths:
        lines += ["Reports: " + ", ".join(f"[{plain(name)}]({path})" for name, path in paths.items()), ""]
    return fit(pr_text("\n".join(lines).rstrip("\n") + "\n", list(found["labels"])))


CHANGE_WORDS = {"new": "new failure", "changed": "changed failure", "standing": "standing",
                "fixed": "newly fixed", "stopped running": "stopped running", "started running": "started running"}


def _groups(groups: list[dict[str, Any]], total: int) -> list[str]:
    """The sync's own failure signatures by change (a kernel provider's are listed apart)."""
    groups = [g for g in groups if not g["provider"]]
    if not groups:
        return ["## Failure signatures, base → head", "", "None: no case fails at base or at head.", ""]
    cases = sum(g["count"] for g in groups)
    # the regression under the change, in one cell: a column of its own made the table wider than a PR comment
    rows = [[str(n), f"{plain(CHANGE_WORDS[g['change']])}<br>{plain(g['regression'])}",
             code(short_signature(g["signature"])), str(g["count"])] for n, g in enumerate(groups[:GROUPS_LISTED], 1)]
    lines = [f"## Failure signatures, base → head: {cases} cases in {len(groups)} groups ({total} cases changed)",
             "", *table(["#", "change", "signature", "cases"], rows), "",
             *(f"{n}. e.g. " + ", ".join(code(i, False) for i in g["examples"]) for n, g in
               enumerate(groups[:GROUPS_LISTED], 1)), ""]
    if len(groups) > GROUPS_LISTED:
        lines += [f"and {len(groups) - GROUPS_LISTED} more groups in review.json.", ""]
    return lines


def _providers(found: dict[str, Any]) -> list[str]:
    """Who computed the kernels, when a side's were not the harness's, and the failures raised there:
    the fork's own kernels, never counted as the sync's or the backport's."""
    own = [(side, found["kernels"][side]) for side in ("base", "head")
           if not found["kernels"][side].startswith(("the harness's", "the native", "?"))]
    if not own:
        return []
    lines = ["## Kernels not the harness's", "",
             *(f"- **{side}**: {plain(kernels)}" for side, kernels in own)]
    mine = [g for g in found["groups"] if g["provider"]]
    if mine:
        count = sum(g["count"] for g in mine)
        lines += ["", f"{count} failures were raised in that code, not counted as the sync's or the backport's:", ""]
        lines += [f"- {g['count']} {plain(CHANGE_WORDS[g['change']])} ({plain(g['regression'])}):"
                  f" {code(short_signature(g['signature']))}" for g in mine[:GROUPS_LISTED]]
    return [*lines, ""]


def _regression_details(found: dict[str, Any]) -> list[str]:
    lines = []
    for reg in found["regressions"]:
        about = "; ".join(x for x in (plain(reg["title"]), linked(reg["upstream"]) if reg["upstream"] else "",
                                      f"fixed in {plain(reg['first_fixed'])}" if reg["first_fixed"] else "") if x)
        body = [f"- **{side}** ({plain(reg[side]['role'])}): {plain(reg[side]['said'])}. Why this role:"
                f" {plain(reg[side]['why'])}" for side in ("base", "head")]
        for side in ("base", "head"):
            for a in reg["patches"][side]:
                fix = plain(a["fix"]) + (f" ({plain(a['fix_detail'])})" if a["fix_detail"] else "")
                text = plain(a["text"]) + (f" ({plain(a['text_detail'])})" if a["text"] in ("stale", "conflict")
                                           else "")
                body.append(f"- {plain(a['patch'])} at {side}: the patch text {text}; the fix {fix}")
        for spec, state in reg["patched"].items():
            body.append(f"- with {plain(found['labels'].get(spec, spec))}: {plain(state['said'])}")
        body += [f"- {plain(line)}" for line in reg["unmet"]]
        lines += details(f"{plain(reg['id'])}: {about}" if about else plain(reg["id"]), body)
    return lines


UPSTREAM_TESTS_LISTED = 15  # changed upstream tests in review.md; all are in review.json


def _upstream_tests(found: dict[str, Any] | None) -> list[str]:
    """Upstream's own fuser tests, base's on base and head's on head: counts, and the tests whose result changed."""
    if found is None:
        return []
    counts = [[side, *(found[side].get(k, "-") for k in ("passed", "failed", "skipped"))] for side in ("base", "head")]
    lines = ["## Upstream's fuser tests (tests/pytorch/test_fusible_ops.py), base → head", "",
             *table(["tree", "passed", "failed", "skipped"], counts), ""]
    changed = found["changes"]
    if not changed:
        return [*lines, "No test changed result.", ""]
    rows = [[code(c["test"]), c["base"], c["head"], plain(c["why"])] for c in changed[:UPSTREAM_TESTS_LISTED]]
    lines += [f"{len(changed)} tests changed result:", "", *table(["test", "base", "head", "why (head)"], rows), ""]
    if len(changed) > UPSTREAM_TESTS_LISTED:
        lines += [f"and {len(changed) - UPSTREAM_TESTS_LISTED} more in review.json.", ""]
    return lines


def _trees(found: dict[str, Any]) -> list[str]:
    trees = found["trees"]
    body = [f"- **{side}**: {plain(trees[side]['provenance'])}; version {code(trees[side]['version'], False)};"
            f" fuser.py {code(trees[side]['fuser_sha'], False)}; kernels: {plain(found['kernels'][side])}"
            for side in ("base", "head")]
    body += [f"- **WARNING: the {side} tree is dirty (uncommitted changes): its results belong to no commit.**"
             for side in ("base", "head") if trees[side]["state"] == "dirty"]
    return details("The trees", body)


def terminal_line(found: dict[str, Any], review_path: str, limit: int = 200) -> str:
    """The review's last terminal line: its status and the decision's first line, at most `limit` characters."""
    text = f"review {found['status']}: {found['headline']}"
    tail = f" | {review_path}"
    if len(text) + len(tail) > limit:
        text = text[: max(0, limit - len(tail) - 1)] + "…"
    return (text + tail)[:limit]


def github_annotations(found: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """GitHub Actions workflow commands: one `::error` per signature the review counts failing, at its TE file and line."""
    counted = {tuple(pair) for pair in found["failing"]}
    seen: dict[tuple[str, str], int] = {}
    for record in run["results"]:
        error = record.get("error") or {}
        if (record["target"], record["case_id"]) in counted and error:
            key = (error.get("location") or "", f"{error.get('type')}: {(error.get('message') or '').splitlines()[0]}"
                   if error.get("message") else str(error.get("type")))
            seen[key] = seen.get(key, 0) + 1
    out = []
    for (location, message), n in seen.items():
        file, _, line = location.rpartition(":")
        where = f" file={file},line={line}" if file and line.isdigit() else ""
        text = re.sub(r"[\r\n%]", " ", f"{n} cases at head: {message}")[:300]
        out.append(f"::error{where}::{text}")
    return out
