"""Markdown (GitHub-flavoured) reports of a run, for a pull request or a CI summary.

`render_markdown` (report.md) puts the verdict first: PASS or FAIL, each regression's
headline, the verdicts per target, then only the grid rows that hold a failure or a
difference, and the error signatures. The environment and long messages sit in <details>.
`render_step_summary` is the shortest form, for $GITHUB_STEP_SUMMARY.
`render_verdict_markdown` is the reviewed one (reports/issue-22.md): no timing, machine,
platform or timestamp, so the same matrix gives the same bytes on every machine.

Tables are plain pipes without alignment padding: one wider cell changes one line of a diff,
not every row. Run strings (messages, notes) go into code spans with pipes escaped, so
neither a `|` nor HTML in an exception message can change the table or the page.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from repro import reports

MESSAGE_CHARS = 120
ATTENTION_GROUPS = 20  # groups of results that need a look, by signature; the rest are in report.html
EXAMPLES = 3  # example case ids per group
SIGNATURES_LISTED = 4  # the most frequent; more are in the <details> below the table
SIGNATURES_DETAILED = 40
PR_LIMIT = 60_000  # characters: a GitHub comment holds 65,536


def code(text: Any, in_table: bool = True) -> str:
    """An inline code span; in a table cell its pipes are escaped (GFM reads `\\|` there as `|`)."""
    text = " ".join(str(text).split())
    text = text.replace("|", "\\|") if in_table else text
    if not text:
        return ""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def plain(text: Any) -> str:
    """Run text as literal Markdown: no emphasis, links, HTML or table breaks."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", text)


def _clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """A GFM table without padding: each row's bytes depend only on its own cells."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def pr_paths(text: str) -> str:
    """Absolute paths cut to their part inside the TE tree (or their last name): no machine path in a report."""
    def cut(match: re.Match[str]) -> str:
        path = match.group(0)
        inside = path.find("/transformer_engine/")
        return path[inside + 1:] if inside >= 0 else "…/" + path.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"(?<![\w.:/-])/(?:[^\s/:;,()'\"`]+/)+[^\s/:;,()'\"`]*", cut, text)


def details(summary: str, body: list[str]) -> list[str]:
    return ["<details><summary>" + summary + "</summary>", "", *body, "", "</details>", ""]


def _elapsed(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return ""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def status_block(run: dict[str, Any], reviewed: bool = False) -> list[str]:
    """The verdict: PASS/FAIL, the counts that matter, each regression's headline."""
    summary = reports.summarize(run)
    mark = "✅" if summary["status"] == "PASS" else "❌"
    facts = [f"{summary['cases']} cases on {summary['targets']} targets", f"{summary['needs_attention']} need a look"]
    if summary["excluded"]:
        facts.append(f"{summary['excluded']} infeasible combinations not run")
    if not reviewed and (elapsed := _elapsed(summary.get("elapsed_s"))):
        facts.append(elapsed)
    lines = [f"**Review: {plain(summary['recommendation'])}**", ""] if summary.get("recommendation") else []
    lines += [f"**{mark} {summary['status']}**: " + ", ".join(facts)
             + (f". Failing because: {', '.join(summary['fail_reasons'])}." if summary["fail_reasons"] else "."), ""]
    for regression, said in reports.headlines(run).items():
        info = reports.regression_info(run, regression)
        about = [plain(info["title"])] if info.get("title") else []
        if info.get("upstream"):
            about.append(f"upstream {plain(info['upstream'])}")
        if "||" in (info.get("affected") or ""):  # a fix that came and went: one "fixed in" would mislead
            about.append(f"affected releases {code(info['affected'], False)}")
        elif info.get("first_fixed"):
            about.append(f"fixed in {plain(info['first_fixed'])}")
        lines.append(f"**{plain(regression)}**" + (f" ({'; '.join(about)})" if about else "") + ":")
        lines += [f"- {plain(line)}" for line in said] or ["- (no headline stored)"]
        if records := reports.unvouched(run, regression):
            lines.append(f"- {plain(reports.unvouched_text(records))}")
        lines.append("")
    return lines


def _verdicts(run: dict[str, Any], reviewed: bool) -> list[str]:
    headers, rows = reports.verdict_rows(run, with_time=not reviewed)
    return ["## Verdicts by target", *table(headers, [[code(r[0]), *map(str, r[1:])] for r in rows]), ""]


def _cell(by_target: dict[str, str], specs: list[str]) -> str:
    return "".join(reports.SYMBOLS.get(o.rstrip("!"), "?") + ("!" if o.endswith("!") else "")
                   if (o := by_target.get(s)) else " " for s in specs)


def _grid(run: dict[str, Any], regression: str, multiple: bool) -> list[str]:
    """Rows pipeline x input, columns grad_mode x recompute; only the rows (and columns) where
    some target fails or the targets disagree."""
    found = [r for r in run["results"] if reports.regression_of(r) == regression]
    rows, cols, cells = reports.pivot(run, found)
    specs = reports.target_specs(run)
    texts = {(r, c): _cell(cells[r, c], specs) for r in rows for c in cols if (r, c) in cells}

    def interesting(text: str) -> bool:
        return any(ch not in "✓ " for ch in text)

    kept_rows = [r for r in rows if any(interesting(texts.get((r, c), "")) for c in cols)]
    kept_cols = [c for c in cols if any(interesting(texts.get((r, c), "")) for r in kept_rows)]
    heading = f"## Cases that fail or differ: {regression}" if multiple else "## Cases that fail or differ"
    lines = [heading]
    if not kept_rows:
        return lines + [f"Every one of {len(found)} results passes on every target.", ""]
    legend = ", ".join(f"`{sym}` {name}" for name, sym in reports.SYMBOLS.items() if name != "skipped")
    lines += [(f"{len(kept_rows)} of {len(rows)} rows (pipeline × input) and {len(kept_cols)} of {len(cols)} columns"
               f" (grad_mode × recompute) hold a failure; the rest pass everywhere. One symbol per target"
               f" ({', '.join(code(s) for s in specs)}), the worst outcome in the cell: {legend};"
               " `!` a verdict that needs a look; blank: no such case. Pipelines with the same cells"
               " for an input share a row."), ""]
    # Pipelines whose cells are the same for one input share a row: the table stays short as
    # the pipeline catalogue grows, and a pipeline that behaves differently stands out.
    merged: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for pipeline, input_kind in kept_rows:
        cells_of_row = tuple(f"`{texts[(pipeline, input_kind), c]}`" if ((pipeline, input_kind), c) in texts else ""
                             for c in kept_cols)
        merged.setdefault((input_kind, cells_of_row), []).append(pipeline)
    headers = ["pipelines", "input", *(f"{g}<br>{r}" for g, r in kept_cols)]
    body = [[", ".join(code(p) for p in pipelines), code(input_kind), *cells_of_row]
            for (input_kind, cells_of_row), pipelines in merged.items()]
    return lines + [*table(headers, body), ""]


def attention_groups(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The results that need a look, grouped by verdict and signature (error type, location,
    message or failed checks), most frequent first."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for record in reports.needs_attention(run):
        groups.setdefault((record["verdict"], *reports.signature(record)), []).append(record)
    found = [{"verdict": key[0], "signature": key[1:], "records": records} for key, records in groups.items()]
    return sorted(found, key=lambda g: -len(g["records"]))


def _attention(run: dict[str, Any]) -> list[str]:
    found = reports.needs_attention(run)
    if not found:
        return []
    groups = attention_groups(run)

    def item(group: dict[str, Any]) -> str:
        records, (kind, location, message) = group["records"], group["signature"]
        if len(records) == 1:
            r = records[0]
            return (f"- {code(r['target'], False)} {code(r['case_id'], False)}: **{r['verdict']}** ({r['outcome']})"
                    + (f": {plain(_clip(r.get('verdict_reason') or ''))}" if r.get("verdict_reason") else ""))
        by_target = ", ".join(f"{code(t, False)} {n}" for t, n in
                              Counter(r["target"] for r in records).most_common())
        examples = ", ".join(code(r["case_id"], False) for r in records[:EXAMPLES])
        what = code(_clip(f"{kind}: {message}" if message else kind), False)
        return (f"- {len(records)} **{group['verdict']}** {what}" + (f" at {code(location, False)}" if location else "")
                + f" ({by_target}); e.g. {examples}")
    lines = [f"## Needs a look ({len(found)})" + (f", {len(groups)} signatures" if len(groups) > 1 else ""),
             *(item(g) for g in groups[:ATTENTION_GROUPS])]
    if len(groups) > ATTENTION_GROUPS:
        rest = sum(len(g["records"]) for g in groups[ATTENTION_GROUPS:])
        lines.append(f"- and {len(groups) - ATTENTION_GROUPS} more signatures ({rest} results): see report.html")
    return lines + [""]


def _warnings(run: dict[str, Any]) -> list[str]:
    """A dirty tree, a patch that does not apply: one line each, under the verdict."""
    lines = [f"> **{plain(w)}**" for w in reports.run_warnings(run, with_references=False)]  # said per regression
    return lines + [""] if lines else []


DEVICE_CALLS_LISTED = 12  # per target in report.md; every case's are in run.json


def _targets(run: dict[str, Any], reviewed: bool = False) -> list[str]:
    """Each target's provenance, patch and role with the reason for it, and (a machine detail, not
    in the verdict report) the CUDA calls the CPU backend answered for its files, folded."""
    body = []
    answered = {} if reviewed else reports.device_calls(run)
    for target in run["environment"]["targets"]:
        facts = [f"version {code(target['version'], False)}"]
        if provenance := reports.provenance_text(target):
            facts.append(plain(provenance))
        if target.get("patch"):
            facts.append("patch " + plain(reports.patch_text(target)))
        body.append(f"- {code(target['spec'], False)} ({'; '.join(facts)})")
        body += [f"  - {plain(reg)}: **{plain(role)}** — {plain(why or 'no reason stored')}"
                 for spec, reg, role, why in reports.role_reasons(run) if spec == target["spec"]]
        if calls := answered.get(target["spec"]):
            listed = ", ".join(f"{code(call, False)} ({n})" for call, n in calls[:DEVICE_CALLS_LISTED])
            more = f", and {len(calls) - DEVICE_CALLS_LISTED} more in run.json" if len(calls) > DEVICE_CALLS_LISTED else ""
            body.append(f"  - device calls the CPU backend answered for its files, each to replace in a port to "
                        f"another device (cases): {listed}{more}")
    title = "Targets: provenance, patch and why each has its role" + ("" if reviewed else ", device calls answered")
    return details(title, body)


def _frame_tables(run: dict[str, Any]) -> list[str]:
    """The bug report's traceback frame by frame against a reproduced megatron_block case's."""
    tables = reports.frame_tables(run)
    if not tables:
        return []
    lines = ["## The bug report's frames in Megatron's traceback",
             ("Each frame of the report's traceback (file and function, in its order) and where the observed"
              " traceback of a reproduced `megatron_block` case under full recompute (the report's setting) has"
              " it: `MISSING` when absent, `NO` when it comes out of the report's order. The report's TE lines are"
              " the NPU fork's."), ""]
    for found in tables:
        lines += [(f"{code(found['target'], False)}, case {code(found['case_id'], False)}"
                   f" ({found['all_frames_in_order']} of {found['cases']} reproduced megatron_block cases under full"
                   " recompute with the report's error have every frame in order):"), ""]
        rows = [[code(r["expected_file"]), code(r["expected_function"]), str(r["report_line"] or "-"),
                 code(r["observed"]) if r["observed"] else "**MISSING**", "yes" if r["in_order"] else "**NO**"]
                for r in found["rows"]]
        lines += [*table(["report frame", "function", "report line", "observed", "in order"], rows), ""]
    return lines


def _failures(run: dict[str, Any]) -> list[str]:
    groups = reports.failure_groups(run)
    if not groups:
        return ["## Error signatures", "No result failed.", ""]
    headers = ["results", "error", "verdicts", "by target", "reproduce"]
    rows = [[str(g["count"]), code(f"{g['type']}: {_clip(g['message'], 60)}"),
             ", ".join(f"{v} {n}" for v, n in g["verdicts"]),
             ", ".join(f"{code(t)} {n}" for t, n in g["targets"]),
             code(_example_command(g))] for g in groups]
    full = [f"- {g['count']} {code(g['type'], False)} at {code(g['location'] or '(no TE frame)', False)}:"
            f" {code(_clip(g['message'], 400), False)}; e.g. {code(_example_command(g), False)};"
            f" shrink it: {code(reports.shrink_command(g['example']['case_id'], g['example']['target']), False)}"
            for g in groups[:SIGNATURES_DETAILED]]
    if len(groups) > SIGNATURES_DETAILED:
        full.append(f"- and {len(groups) - SIGNATURES_DETAILED} more signatures: see report.html")
    more = f", {len(groups) - SIGNATURES_LISTED} more below" if len(groups) > SIGNATURES_LISTED else ""
    return [f"## Error signatures ({len(groups)}{more})", *table(headers, rows[:SIGNATURES_LISTED]), "",
            *details("signatures with their message and TE location", full)]


def _example_command(group: dict[str, Any]) -> str:
    example = group["example"]
    return reports.show_command(example["case_id"], example["target"], example.get("standalone"))


def _environment(run: dict[str, Any], reviewed: bool) -> list[str]:
    env = run["environment"]
    body = [] if reviewed else [(f"torch {code(env.get('torch'))}, Python {code(env.get('python'))}, platform"
                                 f" {code(env.get('platform'))}, machine {code(env.get('machine'))}"), ""]
    if env.get("device_calls_refused"):
        body += [("TE's CUDA calls were refused during the cases (`--refuse-device-calls`), as on a host without"
                  " CUDA; each shows as a crash `DeviceCallRefused` naming its TE file and line."), ""]
    headers = ["target", "role", "version", "fuser.py", "patch", "backend", "source", "ops"]
    rows = [[code(t["spec"]), plain(reports.role_text(run, t["spec"])), code(t["version"]), code(t["fuser_sha"]),
             plain(reports.patch_text(t)), plain(t["backend"]),
             plain(t["source"] + (f" ({p})" if (p := reports.provenance_text(t)) else "")),
             plain(t.get("description", ""))] for t in env["targets"]]
    body += table(headers, rows)
    excluded = run.get("excluded") or {}
    if any(excluded.values()):
        body += ["", "Infeasible combinations, not run:", "",
                 *(f"- {plain(reg)}: {n} — {plain(reason)}" for reg, by in excluded.items() for reason, n in by.items())]
    return details("Environment, targets and excluded combinations", body)


def render_perf(perf: Any) -> list[str]:
    """Timing results (run["perf"]), shown as given."""
    if isinstance(perf, dict) and perf.get("schema") == "repro.perf/1":
        from repro.bench_commands import render_notes, render_table

        return details("Performance", ["```", render_table(perf), render_notes(perf), "```"])
    if isinstance(perf, list) and perf and all(isinstance(p, dict) for p in perf):
        keys = list(dict.fromkeys(k for p in perf for k in p))
        return details("Performance", table(keys, [[plain(p.get(k, "")) for k in keys] for p in perf]))
    return details("Performance", ["```json", json.dumps(perf, indent=1, sort_keys=True), "```"])


def _render(run: dict[str, Any], reviewed: bool) -> str:
    title = f"# Regression run: `{run.get('matrix', '?')}`" + (" (verdict report)" if reviewed else "")
    lines = [title, ""]
    if reviewed:
        lines += [("Generated by `repro report RUN_DIR --format verdict-md`; no timings or machine details, so it"
                   " is the same on every machine. CI regenerates it and compares."), ""]
    if note := reports.incomplete_note(run):
        lines += [f"> **{note}**", ""]
    lines += status_block(run, reviewed) + _warnings(run) + _attention(run) + _verdicts(run, reviewed)
    regressions = reports.regression_ids(run)
    for regression in regressions:
        lines += _grid(run, regression, len(regressions) > 1)
    lines += _targets(run, reviewed)
    lines += _frame_tables(run) + _failures(run) + _environment(run, reviewed)
    if run.get("perf") and not reviewed:
        lines += render_perf(run["perf"])
    if run.get("problems"):
        shown = [f"- {plain(_clip(p, 300))}" for p in run["problems"][:20]]
        lines += details(f"Problems reading the results ({len(run['problems'])})", shown)
    return fit("\n".join(lines).rstrip("\n") + "\n")


def fit(text: str, limit: int = PR_LIMIT) -> str:
    """Keep a report within a pull-request comment: each section is bounded already; should a
    run still outgrow the limit (say, dozens of targets), cut at a line and point to the HTML."""
    if len(text) <= limit:
        return text
    note = "\n\n> **Cut here to fit a pull-request comment; the whole run is in report.html.**\n"
    cut = text.rfind("\n", 0, limit - len(note))
    body = text[:cut]
    if body.count("<details>") > body.count("</details>"):
        body += "\n\n</details>"
    return body + note


def render_markdown(run: dict[str, Any]) -> str:
    return _render(run, reviewed=False)


def render_verdict_markdown(run: dict[str, Any]) -> str:
    return _render(run, reviewed=True)


def render_step_summary(run: dict[str, Any], paths: dict[str, str] | None = None) -> str:
    """For $GITHUB_STEP_SUMMARY: the status, the headlines, verdicts per target, what needs a look."""
    lines = [f"### repro run `{run.get('matrix', '?')}`", ""]
    if note := reports.incomplete_note(run):
        lines += [f"> **{note}**", ""]
    lines += status_block(run) + _warnings(run) + _verdicts(run, reviewed=True)[1:] + _attention(run)
    if paths:
        lines += ["Reports: " + ", ".join(code(p, False) for p in paths.values()), ""]
    return fit("\n".join(lines).rstrip("\n") + "\n") + "\n"
