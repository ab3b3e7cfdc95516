"""The HTML report: one self-contained page (Jinja2, autoescape on), inline CSS and JS,
nothing fetched, so it works from file:// and as a CI artifact.

The tables are rendered here; the case grid is built in the browser from the run data,
embedded once as JSON in a <script type="application/json"> block. Repeated values
(notes, errors, tracebacks) are pooled, so a 30,000-result run stays a few megabytes.
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

from cases.axes import AXES
from harness.engine import script
from repro import reports
from repro.summary import BAD_VERDICTS, VERDICTS, headline

TEMPLATES = Path(__file__).resolve().parent / "templates"


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
        if value is None or value == [] or value == {}:
            return -1
        key = json.dumps(value, sort_keys=True)
        if key not in self._index:
            self._index[key] = len(self.values)
            self.values.append(value)
        return self._index[key]


def grid_data(run: dict[str, Any]) -> dict[str, Any]:
    """The data the page's script builds the case grid from: per case its axis values
    (as indices), the oracle's prediction and one compact record per target."""
    specs = reports.target_specs(run)
    values = reports.present_values(run)
    for missing in run.get("missing_results") or []:  # cases no target reported yet
        for axis, value in zip(AXES, missing["case_id"].split(":", 1)[-1].split("-")):
            if value not in values[axis]:
                values[axis].append(value)
    value_index = {axis: {v: i for i, v in enumerate(vals)} for axis, vals in values.items()}
    target_index = {spec: i for i, spec in enumerate(specs)}
    pool = _Pool()
    cases: dict[str, list[Any]] = {}

    def entry(case_id: str, first: dict[str, Any] | None) -> list[Any]:
        if case_id not in cases:
            parts = case_id.split(":", 1)[-1].split("-")
            axes = [value_index[a][first[a] if first else parts[n]] for n, a in enumerate(AXES)]
            expected, effect = (first["expected"], first.get("predicted")) if first else ("?", None)
            reason = (first.get("rule") or "") if first else ""
            cases[case_id] = [case_id, axes, expected, effect, reason, [None] * len(specs)]
        return cases[case_id]

    for record in run["results"]:
        error = record.get("error")
        entry(record["case_id"], record)[5][target_index[record["target"]]] = [
            record["outcome"], record["verdict"], pool(record.get("note")), pool(error),
            pool(record.get("details")), pool(record.get("known_deviations")), pool(record.get("failed_checks")),
            record.get("duration_s") or 0]
    for missing in run.get("missing_results") or []:
        entry(missing["case_id"], None)
    return {"targets": specs, "axes": list(AXES), "values": values, "outcomes": list(reports.SEVERITY[::-1]),
            "verdicts": list(VERDICTS), "bad_verdicts": list(BAD_VERDICTS), "pool": pool.values,
            "cases": list(cases.values()),
            "script": {"template": script.TEMPLATE, "case_token": script.CASE_TOKEN,
                       "target_token": script.TARGET_TOKEN}}


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _perf(perf: Any) -> dict[str, Any] | None:
    """Hook for timing results once runs carry them (run["perf"]); shown as given."""
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


def render_html(run: dict[str, Any]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    css, js = (TEMPLATES / "report.css").read_text(), (TEMPLATES / "report.js").read_text()
    csp = (f"default-src 'none'; script-src {_csp_hash(js)}; style-src {_csp_hash(css)}; img-src data:;"
           " base-uri 'none'; form-action 'none'")
    groups = [{**g, "command": reports.show_command(g["example"]["case_id"], g["example"]["target"])}
              for g in reports.failure_groups(run)]
    o_headers, o_rows, disagreements = reports.oracle_rows(run)
    environment = {"torch": "?", "python": "?", "platform": "?", "machine": "?", **run["environment"]}
    return env.get_template("report.html.j2").render(
        title=f"te-fuser-repro: {run.get('matrix', '?')} matrix", incomplete=reports.incomplete_note(run),
        headline=headline(run), env=environment, targets=reports.target_specs(run),
        totals=reports.totals_rows(run, with_time=True), legend=[*reports.SEVERITY, "missing"], groups=groups,
        oracle=(o_headers, o_rows), effects=reports.effect_rows(run), disagreements=disagreements,
        perf=_perf(run.get("perf")), problems=run.get("problems") or [], csp=csp,
        # Our own files, and JSON escaped by json_for_script: the only unescaped inserts.
        css=Markup(css), js=Markup(js), data_json=Markup(json_for_script(grid_data(run))))
