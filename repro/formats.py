"""Writing a run's reports: each format's renderer by name, the files beside run.json, and the
GitHub step summary. The renderers read the views of `repro.reports`; nothing there imports them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.runner import rundir
from harness.runner.textsafe import printable
from repro.render_html import render_html
from repro.render_junit import render_junit
from repro.render_md import render_markdown, render_step_summary, render_verdict_markdown

FORMATS = ("md", "verdict-md", "summary", "html", "junit", "json")


def render(run: dict[str, Any], fmt: str, paths: dict[str, str] | None = None) -> str:
    # JSON escapes control characters itself; every other format shows the run's text printable.
    return _render_shown(run if fmt == "json" else printable(run), fmt, paths)


def _render_shown(run: dict[str, Any], fmt: str, paths: dict[str, str] | None = None) -> str:
    if fmt == "md":
        return render_markdown(run)
    if fmt == "verdict-md":
        return render_verdict_markdown(run)
    if fmt == "summary":
        return render_step_summary(run, paths)
    if fmt == "html":
        return render_html(run)
    if fmt == "junit":
        return render_junit(run)
    if fmt == "json":
        return rundir.run_text(run) + "\n"
    raise UsageError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")


REPORT_FILES = {"report.md": "md", "report.html": "html", "junit.xml": "junit"}


def write_all_formats(run: dict[str, Any], out_dir: Path, shown: dict[str, Any] | None = None) -> dict[str, str]:
    """report.md, report.html and junit.xml beside the run's run.json; returns {name: path}.
    `shown`: `printable(run)`, where the caller has made it (a pass over a large run takes a
    second; one serves every format). Appends the summary to $GITHUB_STEP_SUMMARY when that
    is set (GitHub Actions)."""
    out_dir = Path(out_dir)
    paths = {}
    shown = printable(run) if shown is None else shown
    for name, fmt in REPORT_FILES.items():
        rundir.write_atomic(out_dir / name, _render_shown(shown, fmt))
        paths[name] = str(out_dir / name)
    append_step_summary(run, paths)
    return paths


def check_step_summary(run_dir: Path, output: Path | None = None) -> None:
    """Before a run: a $GITHUB_STEP_SUMMARY that is set must be a file this process can append
    to (GitHub creates it), outside the run dir (appending to run.json or a report would damage
    it) and not the `output` this command writes (`repro report -o`); a bad one is found now,
    not after the whole run."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    path = Path(target)
    if (hit := rundir.run_file_at(path, run_dir)) is not None:
        raise UsageError(f"$GITHUB_STEP_SUMMARY {target} is the run dir's own {hit}; "
                         "point it at a file outside the run dir (GitHub gives one) or unset it")
    if output is not None and (path.expanduser().resolve() == output.expanduser().resolve()
                               or (path.exists() and output.exists() and path.samefile(output))):
        raise UsageError(f"$GITHUB_STEP_SUMMARY {target} is the report's own -o {output}; the summary would be "
                         "appended to the report: point one of them elsewhere")
    if path.exists():
        problem = None if path.is_file() and os.access(path, os.W_OK) else (
            "not a regular file" if not path.is_file() else "not writable")
    else:
        problem = None if path.parent.is_dir() and os.access(path.parent, os.W_OK) else "in no writable directory"
    if problem:
        raise UsageError(f"$GITHUB_STEP_SUMMARY {target} is {problem}; unset it or point it at a file to append to")


def append_step_summary(run: dict[str, Any], paths: dict[str, str] | None = None) -> str | None:
    """The `summary` format appended to $GITHUB_STEP_SUMMARY; returns its path, None when unset."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(render(run, "summary", paths))
    except OSError as exc:
        raise UsageError(f"cannot append to $GITHUB_STEP_SUMMARY {target} ({exc.strerror})") from None
    return target
