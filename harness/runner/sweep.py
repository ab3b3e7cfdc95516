"""Release sweep: run a matrix over every transformer-engine release in a range, unpatched,
and find the first release from which every affected case passes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.errors import UsageError
from harness.runner.sessions import run_matrix
from harness.targets import sources


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
    load_errors = [r for r in mine if r["outcome"] == "harness_error" and "load" in r["failed_checks"]]
    affected = [r for r in mine if r["expected"] == "affected" and r["outcome"] != "skipped"]
    failing = [r for r in affected if r["outcome"] != "pass"]
    others = [r for r in mine if r["expected"] == "unaffected" and r["outcome"] not in ("pass", "skipped")]
    if load_errors:
        verdict = "not loadable"
    elif failing:
        verdict = "affected"
    elif others:
        verdict = "other failures"
    else:
        verdict = "fixed"
    return {"release": version, "affected_failing": len(failing), "affected": len(affected),
            "other_failures": len(others), "verdict": verdict,
            "reason": load_errors[0]["note"] if load_errors else ""}


def first_fixed(rows: list[dict[str, Any]]) -> str | None:
    """The earliest release after the last affected one, from which every loadable release is fixed."""
    last_affected = max((i for i, r in enumerate(rows) if r["verdict"] == "affected"), default=None)
    if last_affected is None:
        return None
    later = [r for r in rows[last_affected + 1:] if r["verdict"] != "not loadable"]
    if later and all(r["verdict"] == "fixed" for r in later):
        return later[0]["release"]
    return None


def sweep(matrix: str, only: list[str] | None, start: str | None, end: str | None, out_dir: Path, workers: int,
          cache: Path, offline: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    available = sources.index_versions() if not offline else [
        p.name.split("-")[1] for p in (cache / "wheels").glob("transformer_engine-*.whl")]
    versions = releases_in_range(available, start, end)
    progress(f"sweeping {len(versions)} releases: {', '.join(versions)}")
    specs = [f"te-{v}" for v in versions]
    run = run_matrix(matrix, only, specs, out_dir, workers, cache, offline, progress=progress)
    rows = [release_row(v, run["results"]) for v in versions]
    return {"rows": rows, "first_fixed": first_fixed(rows), "run": run}
