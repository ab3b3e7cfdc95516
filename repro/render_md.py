"""Markdown (GitHub-flavoured) reports of a run.

`render_markdown` is the full report of one run. `render_verdict_markdown` is the
reviewed one (reports/issue-22.md): only what the verdicts depend on, with no timing,
machine, platform or timestamp, so the same matrix gives the same bytes on every machine
and CI can regenerate and compare it.

Run strings (messages, notes) go into code spans with pipes escaped, so neither a `|`
nor HTML in an exception message can change the table or the page.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tabulate import tabulate

from repro import reports
from repro.summary import headline

MESSAGE_CHARS = 200
DISAGREEMENTS_LISTED = 50


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


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _environment(run: dict[str, Any], reviewed: bool) -> list[str]:
    env = run["environment"]
    lines = ["## Environment", ""]
    if not reviewed:
        lines += [(f"torch {code(env.get('torch'))}, Python {code(env.get('python'))}, "
                   f"platform {code(env.get('platform'))}, machine {code(env.get('machine'))}"), ""]
    headers = ["target", "version", "fuser.py", "patch", "backend", "source", "ops"]
    rows = [[code(t["spec"]), code(t["version"]), code(t["fuser_sha"]),
             plain(f"{t['patch']}: {t['patch_status']}" if t.get("patch") else t.get("patch_status", "none")),
             plain(t["backend"]), plain(t["source"]), plain(t.get("description", ""))]
            for t in env["targets"]]
    return lines + [_table(headers, rows), ""]


def _grid(run: dict[str, Any]) -> list[str]:
    rows, cols, cells = reports.pivot(run)
    specs = reports.target_specs(run)

    def text(row: tuple[str, str], col: tuple[str, str]) -> str:
        by_target = cells.get((row, col), {})
        if all(by_target.get(s, "skipped") == "skipped" for s in specs):
            return "·"
        return "".join(reports.SYMBOLS[o.rstrip("!")] + ("!" if o.endswith("!") else "")
                       if (o := by_target.get(s)) else reports.SYMBOLS["missing"] for s in specs)

    grid = {(r, c): text(r, c) for r in rows for c in cols}
    # Combinations skipped on every target in a whole row or column carry no information.
    kept_rows = [r for r in rows if any(grid[r, c] != "·" for c in cols)]
    kept_cols = [c for c in cols if any(grid[r, c] != "·" for r in rows)]
    legend = ", ".join(f"`{sym}` {name}" for name, sym in reports.SYMBOLS.items())
    lines = ["## Outcome grid", "",
             (f"Rows pipeline × input, columns grad_mode × recompute. Each cell has one symbol per target, in the"
              f" order {', '.join(code(s) for s in specs)}: the worst outcome among the cases in that cell (params,"
              f" sequence, dtype, device). Legend: {legend}; `!` after a symbol: a regression, harness error or"
              " unexpected pass there; a lone `·`: every case there is skipped."), ""]
    dropped_r, dropped_c = len(rows) - len(kept_rows), len(cols) - len(kept_cols)
    if dropped_r or dropped_c:
        lines += [(f"Left out as skipped throughout: {dropped_r} of {len(rows)} rows, {dropped_c} of {len(cols)}"
                   " columns."), ""]
    if not kept_rows or not kept_cols:
        return lines + ["(no case ran)", ""]
    headers = ["pipeline", "input", *(f"{g}<br>{r}" for g, r in kept_cols)]
    body = [[code(r[0]), code(r[1]), *(f"`{grid[r, c]}`" for c in kept_cols)] for r in kept_rows]
    return lines + [_table(headers, body), ""]


def _failures(run: dict[str, Any]) -> list[str]:
    groups = reports.failure_groups(run)
    lines = ["## Failures by error signature", ""]
    if not groups:
        return lines + ["No result failed.", ""]
    headers = ["results", "error", "TE location", "message", "by target", "verdicts", "reproduce (one example)"]
    rows = [[str(g["count"]), code(g["type"]), code(g["location"]), code(_clip(g["message"])),
             "<br>".join(f"{code(t)} {n}" for t, n in g["targets"]),
             "<br>".join(f"{v} {n}" for v, n in g["verdicts"]),
             code(reports.show_command(g["example"]["case_id"], g["example"]["target"]))] for g in groups]
    return lines + [_table(headers, rows), ""]


def _oracle(run: dict[str, Any]) -> list[str]:
    headers, rows, disagreements = reports.oracle_rows(run)
    lines = ["## Oracle agreement", "",
             ("Each regression's rules (`cases/regressions/`) predict from the bug analysis which cases are affected. On a target"
              " without the fix every affected case should fail and nothing else; on a target with it nothing"
              " should fail. Skipped and harness errors are left out."), "",
             _table(headers, [[code(r[0]), *map(str, r[1:])] for r in rows]), ""]
    e_headers, e_rows = reports.effect_rows(run)
    if e_rows:
        lines += ["Predicted effect against observed outcome (affected cases that failed):", "",
                  _table(e_headers, [[code(t), code(e), code(o), str(n)] for t, e, o, n in e_rows]), ""]
    if not disagreements:
        return lines + ["No disagreement: every observation is what the oracle predicts for its target.", ""]
    lines += [f"Disagreements ({len(disagreements)}):", ""]
    for r in disagreements[:DISAGREEMENTS_LISTED]:
        lines.append(f"- {code(r['target'], False)} {code(r['case_id'], False)}: predicted {r['expected']}, observed"
                     f" {r['outcome']} ({r['verdict']})")
    if len(disagreements) > DISAGREEMENTS_LISTED:
        lines.append(f"- … and {len(disagreements) - DISAGREEMENTS_LISTED} more (see run.json)")
    return lines + [""]


def render_perf(perf: Any) -> list[str]:
    """Hook for timing results, once runs carry them (run["perf"]); shown as given."""
    lines = ["## Performance", ""]
    if isinstance(perf, dict) and perf.get("schema") == "repro.perf/1":
        from repro.bench_commands import render_notes, render_table

        return lines + ["```", render_table(perf), render_notes(perf), "```", ""]
    if isinstance(perf, list) and perf and all(isinstance(p, dict) for p in perf):
        keys = list(dict.fromkeys(k for p in perf for k in p))
        return lines + [_table(keys, [[plain(p.get(k, "")) for k in keys] for p in perf]), ""]
    return lines + ["```json", json.dumps(perf, indent=1, sort_keys=True), "```", ""]


def _render(run: dict[str, Any], reviewed: bool) -> str:
    title = f"# te-fuser-repro: `{run.get('matrix', '?')}` matrix" + (" (verdict report)" if reviewed else "")
    lines = [title, ""]
    if reviewed:
        lines += [("Generated by `repro report RUN_DIR --format verdict-md`; no timings or machine details, so it"
                   " is the same on every machine. CI regenerates it and compares."), ""]
    if note := reports.incomplete_note(run):
        lines += [f"> **{note}**", ""]
    lines += ["## Verdict", "", *(f"- {plain(line)}" for line in headline(run)), ""]
    lines += _environment(run, reviewed)
    headers, rows = reports.totals_rows(run, with_time=not reviewed)
    lines += ["## Per-target totals", "", _table(headers, [[code(r[0]), *map(str, r[1:])] for r in rows]), ""]
    lines += _grid(run) + _failures(run) + _oracle(run)
    if run.get("perf") and not reviewed:
        lines += render_perf(run["perf"])
    if run.get("problems"):
        lines += ["## Problems reading the results", "", *(f"- {plain(p)}" for p in run["problems"]), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_markdown(run: dict[str, Any]) -> str:
    return _render(run, reviewed=False)


def render_verdict_markdown(run: dict[str, Any]) -> str:
    return _render(run, reviewed=True)
