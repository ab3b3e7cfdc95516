"""Run a case matrix over targets: one pytest session per target, its cases spread over
pytest-xdist workers, results streamed to results.jsonl, then gathered into run.json."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cases.matrix import Case, generate, skip_reason
from harness import records, targets
from harness.errors import UsageError
from harness.plugin import append_record

CASE_TIMEOUT_S = 120


def check_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise UsageError(f"output dir {out_dir} is not writable ({exc.strerror}); pass a writable --out") from None


def environment(prepared: list[targets.PreparedTarget], descriptions: dict[str, str]) -> dict[str, Any]:
    return {
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "machine": platform.node(),
        "targets": [{"spec": p.spec, "version": p.version, "fuser_sha": p.fuser_sha, "patch": p.patch,
                     "patch_status": p.patch_status, "patch_detail": p.patch_detail, "backend": p.backend,
                     "source": p.source, "description": descriptions.get(p.spec, "")} for p in prepared],
    }


def _count_lines(path: Path, spec: str) -> tuple[int, int]:
    done = failing = 0
    if path.is_file():
        needle = f'"target": "{spec}"'
        for line in path.read_text().splitlines():
            if needle in line:
                done += 1
                failing += '"outcome": "pass"' not in line and '"outcome": "skipped"' not in line
    return done, failing


def session_name(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", spec)


def _read_description(out_dir: Path, target: targets.PreparedTarget) -> str:
    path = out_dir / "sessions" / f"{session_name(target.spec)}.description"
    return path.read_text() if path.is_file() else ""


def _run_target_session(prepared: targets.PreparedTarget, cases: list[Case], out_dir: Path, jsonl: Path,
                        workers: int, progress: Callable[[str], None]) -> int:
    import json

    safe = session_name(prepared.spec)
    case_dir = out_dir / "sessions"
    case_dir.mkdir(exist_ok=True)
    case_file = case_dir / f"{safe}.cases.json"
    case_file.write_text(json.dumps({"target": prepared.spec, "cases": [c.as_dict() for c in cases]}))
    (case_dir / "pytest.ini").write_text("[pytest]\naddopts =\n")
    command = [sys.executable, "-m", "pytest", "-c", str(case_dir / "pytest.ini"), "--rootdir", str(case_dir),
               "-p", "harness.plugin", "-p", "no:cacheprovider", "-q", "--no-header", "-rN",
               f"--timeout={CASE_TIMEOUT_S}", f"--repro-target={prepared.to_json()}", f"--repro-jsonl={jsonl}",
               str(case_file)]
    if workers > 1:
        command += ["-n", str(workers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                         os.environ.get("PYTHONPATH", "")])}
    already, _ = _count_lines(jsonl, prepared.spec)
    last = ""
    with open(case_dir / f"{safe}.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        while process.poll() is None:
            time.sleep(1.0)
            done, failing = _count_lines(jsonl, prepared.spec)
            line = f"  {prepared.spec}: {done - already}/{len(cases)} run, {failing} not passing"
            if line != last:  # report changes only, so a long run shows steady progress, not noise
                progress(line)
                last = line
    return process.returncode


def run_matrix(matrix: str, only: list[str] | None, specs: list[str], out_dir: Path, workers: int, cache: Path,
               offline: bool = False, max_cases: int | None = None,
               progress: Callable[[str], None] = print) -> dict[str, Any]:
    cases = generate(matrix, only, **({"max_cases": max_cases} if max_cases else {}))
    check_out_dir(out_dir)
    prepared = [targets.prepare(spec, cache, offline) for spec in specs]
    jsonl = out_dir / "results.jsonl"
    jsonl.unlink(missing_ok=True)
    descriptions: dict[str, str] = {}
    from harness.devices import unavailable_reasons

    device_reasons = unavailable_reasons() if any(c.device != "cpu" for c in cases) else {"cpu": None}
    for target in prepared:
        runnable = []
        for case in cases:
            reason = skip_reason(case) or (device_reasons.get(case.device) and
                                           f"device {case.device} unavailable: {device_reasons[case.device]}")
            if reason:
                append_record(jsonl, records.skipped_record(case, target.spec, reason))
            else:
                runnable.append(case)
        progress(f"{target.spec}: {len(runnable)} cases to run, {len(cases) - len(runnable)} skipped")
        # Worker start-up (torch, the target) costs seconds: small sessions run in one process.
        session_workers = workers if len(runnable) >= 200 else 1
        _run_target_session(target, runnable, out_dir, jsonl, session_workers, progress)
        descriptions[target.spec] = _read_description(out_dir, target)
    return assemble(out_dir, matrix, cases, prepared, descriptions)


def assemble(out_dir: Path, matrix: str, cases: list[Case], prepared: list[targets.PreparedTarget],
             descriptions: dict[str, str]) -> dict[str, Any]:
    found, problems = records.read_jsonl(out_dir / "results.jsonl")
    by_key = {(r["target"], r["case_id"]): r for r in found}
    results = [by_key[(t.spec, c.case_id)] for t in prepared for c in cases if (t.spec, c.case_id) in by_key]
    expected = len(cases) * len(prepared)
    return {"schema": records.SCHEMA, "matrix": matrix, "environment": environment(prepared, descriptions),
            "complete": len(results) == expected, "missing": expected - len(results),
            "problems": problems, "results": results}
