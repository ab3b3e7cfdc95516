"""Release sweep: one regression's matrix over every transformer-engine release in a range,
unpatched and judged with the role `unknown`, so each release is described by what was
observed: affected cases that showed the predicted symptom, failed otherwise, or passed.

From the rows: the affected releases observed, as ranges, against the regression's declared
specifier sets (where they disagree, release by release); releases where its cases are not
applicable (the API does not exist yet) are told apart from affected ones. Also the first affected release (the first that reproduces; "before FIRST"
when the oldest swept release already does) and the first fixed release (the first
release after the last affected one, when every loadable release from there passes).
A release that reproduces after one that passed is named, not averaged away.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from cases.regression import Regression
from cases.releases import ranges_of
from harness.errors import UsageError
from harness.model import Outcome, Role, Verdict
from harness.runner.sessions import run_matrix
from harness.targets import sources

DEFAULT_FROM = "2.1.0"
UNJUDGED = ("not loadable", "nothing ran", "not applicable")


def releases_in_range(available: list[str], start: str | None, end: str | None) -> list[str]:
    """Releases between start and end (inclusive; end 'latest' or None = no bound), oldest first."""
    try:
        low = Version(start) if start else None
        high = Version(end) if end and end != "latest" else None
    except InvalidVersion as exc:
        raise UsageError(f"bad version in --from/--to: {exc}; use a release such as 2.8.0, or latest") from None
    chosen = [v for v in available if Version(v) > Version("0.0.0")
              and (low is None or Version(v) >= low) and (high is None or Version(v) <= high)]
    if not chosen:
        raise UsageError(f"no transformer-engine release between {start or 'the first'} and {end or 'latest'}; "
                         f"available: {', '.join(sorted(available, key=Version))}")
    return sorted(chosen, key=Version)


def release_row(version: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    mine = [r for r in results if r["target"] == f"te-{version}"]
    load_errors = [r for r in mine if r["outcome"] == Outcome.HARNESS_ERROR and "load" in r["failed_checks"]]
    ran = [r for r in mine if r["outcome"] not in (Outcome.NOT_APPLICABLE, Outcome.HARNESS_ERROR)]
    affected = [r for r in ran if r["expected"] == "affected"]
    reproduced = sum(r["verdict"] == Verdict.REPRODUCED for r in affected)
    # Passed: behaves as the reference, or as the regression declares a fixed release may (a refusal).
    passed = sum(r["verdict"] == Verdict.FIXED for r in affected)
    not_applicable = [r for r in mine if r["outcome"] == Outcome.NOT_APPLICABLE]
    others = sum(r["expected"] != "affected" and r["outcome"] != Outcome.PASS for r in ran)
    if load_errors:
        state = "not loadable"
    elif reproduced:
        state = "affected"
    elif not ran and not_applicable:
        state = "not applicable"  # e.g. the API the regression needs does not exist yet
    elif not affected:
        state = "nothing ran"
    elif passed == len(affected):
        state = "fixed"
    else:
        state = "other failures"
    return {"release": version, "affected": len(affected), "reproduced": reproduced,
            "failed_otherwise": len(affected) - reproduced - passed, "passed": passed,
            "unaffected_failing": others, "not_applicable": len(not_applicable), "state": state,
            "reason": (load_errors[0]["note"] if load_errors
                       else not_applicable[0]["note"] if state == "not applicable" else "")}


def first_affected(rows: list[dict[str, Any]]) -> str | None:
    """The first release that reproduces; 'before X' when the oldest swept release X does."""
    judged = [r for r in rows if r["state"] not in UNJUDGED]
    for index, row in enumerate(judged):
        if row["state"] == "affected":
            return f"before {row['release']}" if index == 0 else row["release"]
    return None


def first_fixed(rows: list[dict[str, Any]]) -> str | None:
    """The earliest release after the last affected one, from which every judged release is fixed."""
    last = max((i for i, r in enumerate(rows) if r["state"] == "affected"), default=None)
    if last is None:
        return None
    later = [r for r in rows[last + 1:] if r["state"] not in UNJUDGED]
    if later and all(r["state"] == "fixed" for r in later):
        return later[0]["release"]
    return None


def not_monotonic(rows: list[dict[str, Any]]) -> list[str]:
    """Releases that reproduce after a release that passed, itself after one that reproduced:
    a fix that came and went (releases passing before the bug came in do not count)."""
    seen_affected, seen_fixed, found = False, False, []
    for row in rows:
        if row["state"] == "fixed" and seen_affected:
            seen_fixed = True
        elif row["state"] == "affected":
            if seen_fixed:
                found.append(row["release"])
            seen_affected = True
    return found


def compare_ranges(regression: Regression, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The affected releases observed, as ranges of the swept releases, beside the declared
    specifier sets over the same releases, and each judged release where they disagree."""
    releases = [r["release"] for r in rows]
    declared = regression.affected
    disagree = [f"{r['release']} ({'observed affected, declared not' if r['state'] == 'affected' else 'declared affected, observed ' + r['state']})"
                for r in rows if r["state"] not in UNJUDGED
                and (r["state"] == "affected") != declared.contains(Version(r["release"]))]
    disagree += [f"{r['release']} (declared affected, {r['state']}: {r['reason']})" for r in rows
                 if r["state"] == "not applicable" and declared.contains(Version(r["release"]))]
    return {"declared": str(declared), "declared_over_swept": declared.observed_ranges(releases),
            "observed": ranges_of([r["release"] for r in rows if r["state"] == "affected"], releases),
            "not_applicable": ranges_of([r["release"] for r in rows if r["state"] == "not applicable"], releases),
            "disagree": disagree}


def sweep(matrix: str, only: list[str] | None, start: str | None, end: str | None, out_dir: Path, workers: int,
          cache: Path, offline: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    available = sources.index_versions() if not offline else [
        p.name.split("-")[1] for p in (cache / "wheels").glob("transformer_engine-*.whl")]
    versions = releases_in_range(available, start or DEFAULT_FROM, end)
    progress(f"sweeping {len(versions)} releases: {', '.join(versions)}")
    run = run_matrix(matrix, only, [f"te-{v}" for v in versions], out_dir, workers, cache, offline,
                     progress=progress, role_override=Role.UNKNOWN, preset="sweep")
    rows = [release_row(v, run["results"]) for v in versions]
    from cases.regressions import REGRESSIONS

    return {"rows": rows, "first_affected": first_affected(rows), "first_fixed": first_fixed(rows),
            "not_monotonic": not_monotonic(rows), "ranges": compare_ranges(REGRESSIONS[matrix], rows), "run": run}
