"""Run a case matrix over targets: one pytest session per target, its cases spread over
pytest-xdist workers, results streamed to results.jsonl, then gathered into run.json."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cases.matrix import Case, generate, skip_reason
from harness import targets
from harness.errors import UsageError
from harness.runner import completeness, lifetime, records, rundir
from harness.runner.plugin import append_records

CASE_TIMEOUT_S = 120
LARGE_SESSION = 4000  # runnable cases per target above which one session gets every worker


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
        "targets": [{"spec": p.spec, "version": p.version, "fuser_sha": p.fuser_sha, "content_sha": p.content_sha,
                     "provenance": p.provenance, "fork_config": p.fork_config, "patch": p.patch,
                     "patch_status": p.patch_status, "patch_detail": p.patch_detail, "backend": p.backend,
                     "source": p.source, "description": descriptions.get(p.spec, "")} for p in prepared],
    }


class ProgressReader:
    """Counts records per target as they are appended, reading only the new bytes."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.done: dict[str, int] = {}
        self.failing: dict[str, int] = {}

    def poll(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            match = re.search(r'"target": "([^"]*)"', line)
            if match:
                spec = match.group(1)
                self.done[spec] = self.done.get(spec, 0) + 1
                bad = '"outcome": "pass"' not in line and '"outcome": "skipped"' not in line
                self.failing[spec] = self.failing.get(spec, 0) + bad


def session_name(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", spec)


def _read_description(out_dir: Path, target: targets.PreparedTarget) -> str:
    path = out_dir / "sessions" / f"{session_name(target.spec)}.description"
    return path.read_text() if path.is_file() else ""


def _start_session(prepared: targets.PreparedTarget, cases: list[Case], out_dir: Path, jsonl: Path,
                   workers: int, case_timeout: float) -> subprocess.Popen[bytes]:
    """One pytest session for one target; its cases spread over `workers` xdist workers."""
    safe = session_name(prepared.spec)
    case_dir = out_dir / "sessions"
    case_dir.mkdir(exist_ok=True)
    case_file = case_dir / f"{safe}.cases.json"
    case_file.write_text(json.dumps({"target": prepared.spec, "cases": [c.as_dict() for c in cases]}))
    (case_dir / "pytest.ini").write_text("[pytest]\naddopts =\n")
    # no:warnings: torch.utils.checkpoint warns on every no-grad-input case; capturing
    # thousands of those costs time and tells the record nothing.
    command = [sys.executable, "-m", "pytest", "-c", str(case_dir / "pytest.ini"), "--rootdir", str(case_dir),
               "-p", "harness.runner.plugin", "-p", "harness.runner.lifetime", "-p", "no:cacheprovider",
               "-p", "no:warnings", "-q", "--no-header", "-rN",
               f"--timeout={case_timeout}", f"--repro-target={prepared.to_json()}", f"--repro-jsonl={jsonl}",
               f"--repro-description={case_dir / f'{safe}.description'}", str(case_file)]
    # Always through xdist, even with one worker: a case that kills its worker is then
    # recorded and the session goes on with a fresh worker.
    # A crash costs one worker, so a target that crashes on every case still gets a fresh
    # worker for each (xdist's default of 5 restarts left the rest of its cases unrun).
    command += ["-n", str(max(1, workers)), f"--max-worker-restart={len(cases) + 1}"]
    env = lifetime.session_env({**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])})
    with open(case_dir / f"{safe}.log", "w") as log:
        # Own process group (stopped as a whole), and killed by the kernel if we die. The
        # pre-exec hook only calls prctl and getppid, safe between fork and exec.
        arm = functools.partial(lifetime.die_with_parent, os.getpid())
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=arm)  # noqa: PLW1509


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Stop each session's whole process group (controller and workers)."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _run_sessions(plan: list[tuple[targets.PreparedTarget, list[Case]]], out_dir: Path, jsonl: Path, workers: int,
                  progress: Callable[[str], None], case_timeout: float) -> dict[str, int]:
    """Run the target sessions. Start-up (torch, megatron, the target) costs a worker
    seconds, so for ordinary selections the sessions run side by side, one worker each;
    a session too large for that gets all the workers, one session at a time."""
    large = any(len(cases) > LARGE_SESSION for _, cases in plan)
    concurrent, per_session = (1, workers) if large else (max(1, workers), 1)
    reader, pending, last = ProgressReader(jsonl), list(plan), ""
    running: list[subprocess.Popen[bytes]] = []
    exits: dict[str, int] = {}
    started: dict[int, str] = {}
    reader.poll()
    baseline = dict(reader.done)
    totals = {t.spec: len(cases) for t, cases in plan}
    try:
        while pending or running:
            while pending and len(running) < concurrent:
                target, cases = pending.pop(0)
                running.append(_start_session(target, cases, out_dir, jsonl, per_session, case_timeout))
                started[running[-1].pid] = target.spec
            time.sleep(0.5)
            exits.update({started[p.pid]: p.returncode for p in running if p.poll() is not None})
            running = [p for p in running if p.poll() is None]
            reader.poll()
            line = "  " + "; ".join(f"{spec} {reader.done.get(spec, 0) - baseline.get(spec, 0)}/{total}"
                                    f" ({reader.failing.get(spec, 0)} not passing)" for spec, total in totals.items())
            if line != last:  # report changes only: steady progress, not noise
                progress(line)
                last = line
    finally:
        # Interrupted (Ctrl-C, SIGTERM): stop the sessions; what they wrote stays in the JSONL.
        _stop(running)
    return exits


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived; the partial results stay in the run dir."""


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def run_matrix(matrix: str, only: list[str] | None, specs: list[str], out_dir: Path, workers: int, cache: Path,
               offline: bool = False, max_cases: int | None = None,
               progress: Callable[[str], None] = print, case_timeout: float = CASE_TIMEOUT_S,
               fork_config: str | None = None) -> dict[str, Any]:
    cases = generate(matrix, only, **({"max_cases": max_cases} if max_cases else {}))
    prepared = [targets.prepare(spec, cache, offline, fork_config) for spec in specs]
    check_out_dir(out_dir)
    rundir.remove_stale(out_dir)
    jsonl = out_dir / "results.jsonl"
    # Written first, so a run that dies can still say how many results it is missing.
    rundir.write_atomic(out_dir / "run-meta.json", json.dumps({
        "matrix": matrix, "only": only or [], "targets": specs, "expected_results": len(cases) * len(prepared)}))
    from harness.targets.devices import unavailable_reasons

    device_reasons = unavailable_reasons() if any(c.device != "cpu" for c in cases) else {"cpu": None}
    plan = []
    for target in prepared:
        runnable, skipped = [], []
        for case in cases:
            reason = skip_reason(case) or (device_reasons.get(case.device) and
                                           f"device {case.device} unavailable: {device_reasons[case.device]}")
            if reason:
                skipped.append(records.skipped_record(case, target.spec, reason))
            else:
                runnable.append(case)
        append_records(jsonl, skipped)
        progress(f"{target.spec}: {len(runnable)} cases to run, {len(skipped)} skipped with a reason")
        plan.append((target, runnable))
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        exits = _run_sessions(plan, out_dir, jsonl, workers, progress, case_timeout)
    finally:
        signal.signal(signal.SIGTERM, previous)
    descriptions = {target.spec: _read_description(out_dir, target) for target in prepared}
    run = assemble(out_dir, matrix, cases, prepared, descriptions)
    run["not_run"] = completeness.not_run(run, cases, prepared, exits, out_dir / "sessions")
    return run


def assemble(out_dir: Path, matrix: str, cases: list[Case], prepared: list[targets.PreparedTarget],
             descriptions: dict[str, str]) -> dict[str, Any]:
    found, problems = records.read_jsonl(out_dir / "results.jsonl")
    by_key = {(r["target"], r["case_id"]): r for r in found}
    results = [by_key[(t.spec, c.case_id)] for t in prepared for c in cases if (t.spec, c.case_id) in by_key]
    expected = len(cases) * len(prepared)
    return {"schema": records.SCHEMA, "matrix": matrix, "environment": environment(prepared, descriptions),
            "complete": len(results) == expected, "missing": expected - len(results),
            "problems": problems, "results": results}
