"""The HTML report: one self-contained page (Jinja2, autoescape on), inline CSS and JS,
nothing fetched, so it works from file:// and as a CI artifact.

The status banner and the tables are rendered here; the case grid is built in the browser
from the run data, embedded once as JSON in a <script type="application/json"> block.
The data is packed to stay small (the issue22 run is tens of thousands of results): a
case is one integer for its axis values (mixed radix) and two integers per target (an
outcome/verdict code and an index into a pool of the rest: note, error, details, ...);
case ids are rebuilt from the axis values, as the matrix builds them.
A Content-Security-Policy allows only our own inline script and style (by hash): even a
markup bug could not run a script that came in with a message.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from repro import reports

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Worst first: the verdict a grid cell shows for a target when it holds several cases.
VERDICT_SEVERITY = ("harness_error", "regression", "unexpected_pass", "other_failure", "reproduced", "fixed",
                    "unaffected", "not_applicable", "skipped")
EXTRA_FIELDS = ("note", "error", "details", "known_deviations", "failed_checks", "side_effects", "verdict_reason",
                "expected", "predicted", "standalone")


def json_for_script(value: Any) -> str:
    """JSON that cannot end its <script> block or open a comment there: every <, > and &
    (which occur only inside JSON strings) becomes a \\u escape."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class _Pool:
    """Index of each distinct JSON value, so a value repeated over cases is stored once."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._index: dict[str, int] = {}

    def __call__(self, value: Any) -> int:
        key = json.dumps(value, sort_keys=True)
        if key not in self._index:
            self._index[key] = len(self.values)
            self.values.append(value)
        return self._index[key]


def _split_case_id(case_id: str, axes: list[str]) -> tuple[str, list[str]]:
    regression, sep, rest = case_id.partition(":")
    if not sep:
        regression, rest = "issue22", case_id
    values = rest.split("-")
    return regression, values if len(values) == len(axes) else [""] * len(axes)


def grid_data(run: dict[str, Any]) -> dict[str, Any]:
    """The packed data the page's script builds the grid from (see the module docstring)."""
    specs = reports.target_specs(run)
    axes = reports.axes_of(run)
    values = reports.present_values(run)
    regressions = reports.regression_ids(run)
    for missing in run.get("missing_results") or []:  # cases no target reported yet
        regression, found = _split_case_id(missing["case_id"], axes)
        if regression not in regressions:
            regressions.append(regression)
        for axis, value in zip(axes, found):
            if value not in values[axis]:
                values[axis].append(value)
    # A regression's own scenario lacks some axes: its cases take "" there.
    blanks = {a for a in axes for r in run["results"] if a not in r}
    dims = [regressions, *(values[a] + [""] * (a in blanks) for a in axes)]
    index = [{v: i for i, v in enumerate(d)} for d in dims]
    outcomes, verdicts = list(reports.OUTCOMES), list(VERDICT_SEVERITY)
    target_index = {spec: i for i, spec in enumerate(specs)}
    pool, ids = _Pool(), []
    cases: dict[str, list[int]] = {}

    def entry(case_id: str, coordinates: list[str]) -> list[int]:
        if case_id not in cases:
            code = 0
            for position, value in enumerate(coordinates):
                code = code * len(dims[position]) + index[position][value]
            cases[case_id] = [code] + [-1, -1] * len(specs)
            rebuilt = f"{coordinates[0]}:" + "-".join(coordinates[1:])
            if rebuilt != case_id and not (coordinates[0] == "issue22" and case_id == rebuilt.partition(":")[2]):
                ids.append([len(cases) - 1, case_id])  # an id the matrix did not build from its values
        return cases[case_id]

    for record in run["results"]:
        if record["outcome"] == "skipped":  # repro.run/1: an infeasible case, not drawn
            continue
        item = entry(record["case_id"], [reports.regression_of(record), *(record.get(a, "") for a in axes)])
        t = target_index[record["target"]]
        outcome = outcomes.index(record["outcome"]) if record["outcome"] in outcomes else len(outcomes) - 1
        verdict = verdicts.index(record["verdict"]) if record["verdict"] in verdicts else len(verdicts) - 1
        item[1 + 2 * t] = outcome * len(verdicts) + verdict
        item[2 + 2 * t] = pool({k: record[k] for k in EXTRA_FIELDS if record.get(k) not in (None, [], {}, "")})
    for missing in run.get("missing_results") or []:
        regression, found = _split_case_id(missing["case_id"], axes)
        entry(missing["case_id"], [regression, *found])
    return {"targets": specs, "roles": [reports.role_text(run, s) for s in specs], "axes": ["regression", *axes],
            "values": dims, "outcomes": outcomes, "verdicts": verdicts, "bad_verdicts": list(reports.BAD_VERDICTS),
            "pool": pool.values, "cases": [n for item in cases.values() for n in item], "ids": ids}


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _perf(perf: Any) -> dict[str, Any] | None:
    """Timing results (run["perf"]), shown as given."""
    if not perf:
        return None
    if isinstance(perf, dict) and perf.get("schema") == "repro.perf/1":
        from harness.bench.plot import perf_svg
        from repro.bench_commands import render_notes, render_table

        # As an <img> data URI: the page's CSP would block the SVG's own inline styles.
        svg = base64.b64encode(perf_svg(perf).encode()).decode()
        return {"rows": None, "text": render_table(perf) + "\n" + render_notes(perf),
                "svg": f"data:image/svg+xml;base64,{svg}"}
    if isinstance(perf, list) and all(isinstance(p, dict) for p in perf):
        keys = list(dict.fromkeys(k for p in perf for k in p))
        return {"rows": (keys, [[p.get(k, "") for k in keys] for p in perf])}
    return {"rows": None, "text": json.dumps(perf, indent=1, sort_keys=True)}


def _regressions(run: dict[str, Any]) -> list[dict[str, Any]]:
    said = reports.headlines(run)
    blank = {"title": "", "upstream": "", "first_affected": "", "first_fixed": "", "patches": []}
    return [{**blank, **reports.regression_info(run, reg), "headline": said.get(reg, [])}
            for reg in reports.regression_ids(run)]


def render_html(run: dict[str, Any]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    css, js = (TEMPLATES / "report.css").read_text(), (TEMPLATES / "report.js").read_text()
    csp = (f"default-src 'none'; script-src {_csp_hash(js)}; style-src {_csp_hash(css)}; img-src data:;"
           " base-uri 'none'; form-action 'none'")
    groups = [{**g, "command": reports.show_command(g["example"]["case_id"], g["example"]["target"],
                                                    g["example"].get("standalone")),
               "shrink": reports.shrink_command(g["example"]["case_id"], g["example"]["target"])}
              for g in reports.failure_groups(run)]
    environment = {"torch": "?", "python": "?", "platform": "?", "machine": "?", **run["environment"]}
    summary = reports.summarize(run)
    return env.get_template("report.html.j2").render(
        title=f"Regression run: {run.get('matrix', '?')}", incomplete=reports.incomplete_note(run),
        summary=summary, review=run.get("review"), regressions=_regressions(run), bad_verdicts=reports.BAD_VERDICTS,
        env=environment, roles={s: reports.role_text(run, s) for s in reports.target_specs(run)},
        excluded=run.get("excluded") or {}, verdicts=reports.verdict_rows(run, with_time=True),
        totals=reports.totals_rows(run, with_time=False), groups=groups,
        attention=reports.needs_attention(run), frame_tables=reports.frame_tables(run), perf=_perf(run.get("perf")),
        problems=run.get("problems") or [],
        warnings=reports.run_warnings(run),
        patches={t["spec"]: reports.patch_text(t) for t in environment["targets"]},
        provenance={t["spec"]: reports.provenance_text(t) for t in environment["targets"]},
        role_reasons=reports.role_reasons(run), device_calls=reports.device_calls(run),
        csp=csp,
        # Our own files, and JSON escaped by json_for_script: the only unescaped inserts.
        css=Markup(css), js=Markup(js), data_json=Markup(json_for_script(grid_data(run))))
