"""Run a case matrix over targets: one pytest session per target, its cases spread over
pytest-xdist workers, results streamed to results.jsonl, then gathered into run.json."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cases.case import Case
from cases.matrix import Selection, generate
from cases.regression import Regression
from harness import targets
from harness.errors import UsageError
from harness.model import BAD_VERDICTS, SCHEMA, Role, Run
from harness.runner import completeness, forkserver, lifetime, memory, observations, rundir, sandbox, scratch, seal
from harness.runner.headlines import headlines
from harness.runner.roles import role_of
from harness.runner.rundir import session_name
from harness.targets.refusal import REFUSE_ENV
from harness.torch_version import torch_version

CASE_TIMEOUT_S = 120
LOAD_TIMEOUT_S = 300  # importing torch and loading a target, per worker
CHUNK_MAX = 200  # cases per pytest item, at most
# Observations judged between two looks at the sessions, at most so many or for so long: a backlog (the
# judge importing torch while the first sessions run) is judged in steps, and a session whose last case
# has started is followed by the next at once. On a busy machine 200 observations took the judge 2 s.
JUDGE_BATCH = 200
JUDGE_SLICE_S = 0.25
LARGE_SESSION = 4000  # runnable cases per target above which one session gets every worker


def environment_info(prepared: list[targets.PreparedTarget], descriptions: dict[str, str],
                     roles: dict[str, dict[str, tuple[Role, str]]]) -> dict[str, Any]:
    return {
        "torch": torch_version(), "python": platform.python_version(), "platform": platform.platform(),
        "machine": platform.node(),
        # `repro run --refuse-device-calls`: TE's CUDA calls were refused during the cases, not answered
        **({"device_calls_refused": True} if os.environ.get(REFUSE_ENV) == "1" else {}),
        "targets": [{**asdict(p), "description": descriptions.get(p.spec, ""),
                     "roles": {rid: role.value for rid, (role, _) in roles[p.spec].items()},
                     "role_reasons": {rid: why for rid, (_, why) in roles[p.spec].items()}} for p in prepared],
    }


def regression_info(regression: Regression) -> dict[str, Any]:
    return {"id": regression.id, "title": regression.title, "upstream": regression.upstream,
            "affected": str(regression.affected),
            "first_affected": regression.first_affected, "first_fixed": regression.first_fixed,
            "patches": list(regression.patches), "axes": list(regression.axes), "scenario": regression.scenario.name}


BAD_VALUES = frozenset(v.value for v in BAD_VERDICTS)


class ProgressReader:
    """Counts records per target as they are appended (rundir.SealedReader: only the lines the
    run's own processes sealed, each read once); the run is assembled from what it read."""

    def __init__(self, path: Path, key: bytes) -> None:
        self.sealed = rundir.SealedReader(path, key)
        self.done: dict[str, int] = {}
        self.failing: dict[str, int] = {}
        self.verdicts: dict[str, dict[str, int]] = {}
        self.case_ids: dict[str, set[str]] = {}

    def poll(self, final: bool = False) -> None:
        for record in self.sealed.poll(final):
            spec, verdict = record["target"], str(record.get("verdict"))
            self.done[spec] = self.done.get(spec, 0) + 1
            self.case_ids.setdefault(spec, set()).add(record["case_id"])
            self.failing[spec] = self.failing.get(spec, 0) + (verdict in BAD_VALUES)
            counts = self.verdicts.setdefault(spec, {})
            counts[verdict] = counts.get(verdict, 0) + 1


def _read_description(out_dir: Path, target: targets.PreparedTarget) -> str:
    path = out_dir / "sessions" / f"{session_name(target.spec)}.description"
    return path.read_text() if path.is_file() else ""


def chunk_size(cases: int, workers: int) -> int:
    """Cases per pytest item: a few items per worker so the load evens out, at most
    CHUNK_MAX so a dead worker leaves few cases to its target's follow-up session."""
    return max(1, min(CHUNK_MAX, -(-cases // (4 * max(1, workers)))))


def _remote(tx: list[str]) -> bool:
    """Whether a worker does not share this file system as is: another host, or a local
    worker in another directory (`popen//chdir=DIR`), which xdist fills by rsync as well."""
    return any("popen" not in spec.split("//")[0] or "//chdir=" in spec for spec in tx)


def _start_session(prepared: targets.PreparedTarget, cases: list[Case], roles: dict[str, str], out_dir: Path,
                   jsonl: Path, workers: int, case_timeout: float, attempt: int = 0,
                   tx: list[str] | None = None, rsyncdirs: list[str] | None = None,
                   load_timeout: float = LOAD_TIMEOUT_S, max_rss: int = 0,
                   key: bytes | None = None, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """One pytest session for one target; its cases spread over `workers` xdist workers,
    or over the workers of the given xdist `--tx` specs. `attempt` counts the follow-up
    sessions of this target (its cases without a record after a worker died); they run
    one case per item, so that a target crashing on many cases needs one follow-up, where
    xdist gives each crash a fresh worker and moves on."""
    safe = session_name(prepared.spec)
    case_dir = out_dir / "sessions"
    case_dir.mkdir(exist_ok=True)
    case_file = case_dir / (f"{safe}.cases.json" if not attempt else f"{safe}.follow-up-{attempt}.cases.json")
    case_file.write_text(json.dumps({"target": prepared.spec, "cases": [c.as_dict() for c in cases]}))
    (case_dir / "pytest.ini").write_text("[pytest]\naddopts =\n")
    # no:warnings: torch.utils.checkpoint warns on every no-grad-input case; capturing
    # thousands of those costs time and tells the record nothing.
    # no:unraisableexception: at exit it runs gc.collect() five times over the controller's heap
    # (torch's included), 1 s a session, and a case's unraisable exceptions are not its record.
    # Plugin autoloading is off (env below): only the plugins named here load, whatever the host has installed.
    # Per-case timeouts are the plugin's own (an item holds many cases), so pytest-timeout is not loaded.
    n_workers = sum(int(s.split("*", 1)[0]) if "*" in s else 1 for s in tx) if tx else max(1, workers)
    # Under the reaper: what a case starts ends with the session (harness.runner.reaper).
    key_fd = seal.key_pipe(key) if key else -1  # the run's seal key, for the controller alone
    command = [sys.executable, "-m", "harness.runner.reaper", *(["--pass-fd", str(key_fd)] if key else []), "--",
               sys.executable, "-m", "pytest", "-c", str(case_dir / "pytest.ini"), "--rootdir", str(case_dir),
               "-p", "xdist.plugin", "-p", "harness.runner.plugin", "-p", "harness.runner.lifetime",
               "-p", "no:cacheprovider", "-p", "no:warnings", "-p", "no:unraisableexception", "-q", "--no-header", "-rN",
               f"--repro-case-timeout={case_timeout}", f"--repro-chunk={1 if attempt else chunk_size(len(cases), n_workers)}",
               f"--repro-target={prepared.to_json()}", f"--repro-jsonl={jsonl}",
               f"--repro-description={case_dir / f'{safe}.description'}", f"--repro-roles={json.dumps(roles)}",
               f"--repro-startup={case_dir / f'{safe}.startup.jsonl'}", f"--repro-load-timeout={load_timeout}",
               f"--repro-max-rss={max_rss}", f"--repro-seal-fd={key_fd}",
               f"--repro-inflight={case_dir / f'{safe}.inflight.jsonl'}",
               f"--repro-observations={observations_path(out_dir)}", str(case_file)]
    # Always through xdist, even with one worker: a case that kills its worker is then
    # recorded and the session goes on with a fresh worker.
    # A crash costs one worker, so a target that crashes on every case still gets a fresh
    # worker for each (xdist's default of 5 restarts left the rest of its cases unrun).
    command += [f"--max-worker-restart={len(cases) + 1}"]
    if tx:
        # A remote worker does not inherit this environment: it gets the variables that matter here.
        remote_env = "".join(f"//env:{name}=1" for name in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTHONDONTWRITEBYTECODE"))
        specs = [spec + remote_env if _remote([spec]) else spec for spec in tx]
        command += ["--dist", "load", *(f"--tx={spec}" for spec in specs)]
        if _remote(tx):
            # A worker on another host gets the session's case file and the harness by
            # xdist's rsync; its records come back over xdist's channel (see the plugin).
            repo = Path(__file__).resolve().parents[2]
            command += [f"--rsyncdir={d}" for d in (case_dir, repo / "harness", repo / "cases", *(rsyncdirs or []))]
    elif forkserver.ADDRESS_ENV in (extra_env or {}):  # each worker forked by the run's fork server
        client = f"{shlex.quote(sys.executable)} -S -m harness.runner.forkclient"
        command += ["--dist", "load", f"--tx={max(1, workers)}*popen//python={client}"]
    else:
        command += ["-n", str(max(1, workers))]
    return _spawn(command, case_dir / f"{safe}.log", key_fd, append=bool(attempt), extra_env=extra_env)


def _spawn(command: list[str], log: Path | int, key_fd: int, append: bool = False,
           extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child of the run: its own process group (stopped as a whole), killed by the kernel if we
    die, with the harness importable, `key_fd` (the run's seal key, or -1) inherited and `extra_env`
    (the run's scratch folder, harness.runner.scratch) set."""
    # The caller's PYTEST_ADDOPTS would change every session (-x, -p, --timeout...): the session's options are these.
    env = lifetime.session_env({**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
                                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]), **(extra_env or {})})
    with open(log, "a" if append else "w", closefd=not isinstance(log, int)) as output:
        # The pre-exec hook only calls prctl and getppid, safe between fork and exec.
        arm = functools.partial(lifetime.die_with_parent, os.getpid())
        try:
            return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=arm, pass_fds=(key_fd,) if key_fd >= 0 else ())  # noqa: PLW1509
        finally:
            if key_fd >= 0:
                os.close(key_fd)


@contextlib.contextmanager
def _fork_server(tx: list[str] | None) -> Iterator[tuple[dict[str, str], int]]:
    """The run's fork server (harness.runner.forkserver), stopped with its workers when the block
    ends: the environment that names it to the sessions' workers, and its output (a memfd).
    Workers on other hosts (`tx`) and systems without Linux's subreaper are started by xdist as
    before: an empty environment."""
    if tx or lifetime._PRCTL is None:
        yield {}, -1
        return
    address = f"te-fuser-repro-{os.getpid()}-{secrets.token_hex(8)}"
    # Held in memory: the run dir is not this run's to write until its targets are prepared.
    output = os.memfd_create("forkserver.log")
    try:
        server = _spawn([sys.executable, "-m", "harness.runner.forkserver", address], output, -1)
        try:
            yield {forkserver.ADDRESS_ENV: address}, output
        finally:
            _stop([server])
    finally:
        os.close(output)


def _keep_output(fd: int, path: Path) -> None:
    """What a process wrote to `fd` (a memfd), kept in `path` if it wrote anything."""
    if fd >= 0 and (size := os.lseek(fd, 0, os.SEEK_END)):
        path.write_bytes(os.pread(fd, size, 0))


def observations_path(out_dir: Path) -> Path:
    """Where every session's controller hands its workers' raw observations to the run's judge."""
    return out_dir / "sessions" / "observations.jsonl"


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


def _record_lost_in_flight(target: targets.PreparedTarget, cases: list[Case], roles: dict[str, str], jsonl: Path,
                           started: set[str], recorded: set[str], code: int, key: bytes | None = None) -> list[str]:
    """After a session ended: the cases its controller heard start (`started`, from its in-flight
    file) but never recorded (it died with them in flight) get a crash record each, never a silent
    re-run; returns a problem line per case, for the run. Only the session's own cases: the
    in-flight file is a file a target could write too."""
    from harness.model import Role
    from harness.runner.records import lost_case_record

    lost = [case for case in cases if case.case_id in started and case.case_id not in recorded]
    why = "the session's controller died"
    records = [lost_case_record(case.case_id, target.spec, Role(roles.get(case.regression, "unknown")), why,
                                f"the pytest session of {target.spec} exited with status {code} while this case ran")
               for case in lost]
    rundir.append_records(jsonl, records, key)
    return [f"{target.spec}: {why} (exit status {code}) with {case.case_id} in flight; recorded as a crash"
            for case in lost]


class StartedReader:
    """The cases each session's controller heard start (its `.inflight.jsonl`), read as appended."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.offsets: dict[str, int] = {}
        self.started: dict[str, set[str]] = {}

    def poll(self, spec: str) -> set[str]:
        path = self.out_dir / "sessions" / f"{session_name(spec)}.inflight.jsonl"
        started = self.started.setdefault(spec, set())
        if path.is_file():
            with open(path, "rb") as handle:
                handle.seek(self.offsets.get(spec, 0))
                chunk = handle.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[spec] = self.offsets.get(spec, 0) + len(complete)
            for line in complete.splitlines():
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    started.add(json.loads(line)["case_id"])
        return started


def _busy(running: dict[int, tuple[subprocess.Popen[bytes], tuple[Any, list[Case], Any, int]]],
          started: StartedReader) -> int:
    """The sessions that hold a slot: once a session's last case has started, the next session
    starts beside it, so that its start-up (seconds of imports) overlaps that case and the
    session's teardown instead of following them. Scheduling only: what a session records
    is still read from its records."""
    return sum(1 for _, (target, cases, _, _) in running.values()
               if not started.poll(target.spec).issuperset(c.case_id for c in cases))


def _run_sessions(plan: list[tuple[targets.PreparedTarget, list[Case], dict[str, str]]], out_dir: Path, jsonl: Path,
                  workers: int, progress: Callable[[str], None], case_timeout: float,
                  tx: list[str] | None = None, rsyncdirs: list[str] | None = None,
                  load_timeout: float = LOAD_TIMEOUT_S, problems: list[str] | None = None,
                  max_rss: int = 0, key: bytes | None = None, rejected: list[str] | None = None,
                  reader: ProgressReader | None = None,
                  fork_server: tuple[dict[str, str], int] = ({}, -1)) -> dict[str, int]:
    """Run the target sessions. Start-up (torch, megatron, the target) costs a worker
    seconds, so for ordinary selections the sessions run side by side, one worker each;
    a session too large for that gets all the workers, one session at a time. With xdist
    `--tx` specs, each session gets those workers, one session at a time.

    A worker that dies leaves the rest of its chunk of cases without records: when a
    session ends so, a follow-up session runs its target's unrecorded cases, as long as
    each session records at least one case. `reader`: the run's reader of the results file
    (given, the run is assembled from what it read)."""
    large = tx or any(len(cases) > LARGE_SESSION for _, cases, _ in plan)
    concurrent, per_session = (1, workers) if large else (max(1, workers), 1)
    started = StartedReader(out_dir)
    reader = reader or ProgressReader(jsonl, key or b"")
    pending, last = [(t, c, r, 0) for t, c, r in plan if c], ""
    running: dict[int, tuple[subprocess.Popen[bytes], tuple[targets.PreparedTarget, list[Case], dict[str, str], int]]]
    running = {}
    exits: dict[str, int] = {}
    reader.poll()
    baseline = dict(reader.done)
    totals = {t.spec: len(cases) for t, cases, _ in plan}
    (out_dir / "sessions").mkdir(exist_ok=True)
    with scratch.scratch(out_dir) as scratch_env:  # removed once the sessions have stopped
        env = {**scratch_env, **fork_server[0]}
        judge = observations.Judge(observations_path(out_dir), jsonl, key, {t.spec: r for t, _, r in plan},
                                   {t.spec: t.version or "" for t, _, _ in plan}, reader.sealed.written)
        try:
            while pending or running:
                while pending and (len(running) if large else _busy(running, started)) < concurrent:
                    job = pending.pop(0)
                    target, cases, roles, attempt = job
                    process = _start_session(target, cases, roles, out_dir, jsonl, per_session, case_timeout, attempt,
                                             tx, rsyncdirs, load_timeout, max_rss, key, env)
                    running[process.pid] = (process, job)
                if not judge.poll(limit=JUDGE_BATCH, seconds=JUDGE_SLICE_S):
                    time.sleep(0.2)
                ended = [pid for pid, (process, _) in running.items() if process.poll() is not None]
                if ended:  # its observations are all on disk: judged before its records are counted
                    judge.poll()
                reader.poll()
                for pid in ended:
                    process, (target, cases, roles, attempt) = running.pop(pid)
                    exits[target.spec] = process.returncode
                    if process.returncode not in (0, 1):  # 1: harness errors recorded; else the session itself failed
                        lines = _record_lost_in_flight(target, cases, roles, jsonl, started.poll(target.spec),
                                                       reader.case_ids.get(target.spec, set()), process.returncode,
                                                       key)
                        if problems is not None:
                            problems += lines
                        reader.poll()
                    recorded = reader.case_ids.get(target.spec, set())
                    missing = [c for c in cases if c.case_id not in recorded]
                    if missing and len(missing) < len(cases):  # progress made: the rest get a fresh session
                        pending.insert(0, (target, missing, roles, attempt + 1))
                if update := getattr(progress, "update", None):  # a live display (repro.progress.Progress)
                    for spec, total in totals.items():
                        update(spec, reader.done.get(spec, 0) - baseline.get(spec, 0), reader.verdicts.get(spec, {}), total)
                    continue
                line = "  " + "; ".join(f"{spec} {reader.done.get(spec, 0) - baseline.get(spec, 0)}/{total}"
                                        f" ({reader.failing.get(spec, 0)} bad verdicts)" for spec, total in totals.items())
                if line != last:  # report changes only: steady progress, not noise
                    progress(line)
                    last = line
        finally:
            # Interrupted (Ctrl-C, SIGTERM): stop the sessions; what they observed is judged, and stays in the JSONL.
            _stop([process for process, _ in running.values()])
            judge.poll()
            if problems is not None:
                problems += judge.problems()
            if rejected is not None:
                rejected += judge.rejected
            _keep_output(fork_server[1], out_dir / "sessions" / "forkserver.log")
    return exits


def target_problem(prepared: targets.PreparedTarget) -> str:
    """The one line a target that cannot run gets (its patch does not apply)."""
    return (f"{prepared.spec}: patch {prepared.patch} does not apply ({prepared.patch_text or 'conflict'}: "
            f"{prepared.patch_text_detail or prepared.patch_detail}); none of its cases ran")


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived; the partial results stay in the run dir."""


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def plan_targets(selections: list[Selection], specs: list[str] | None,
                 regressions_of: dict[str, set[str]] | None = None) -> dict[str, list[Selection]]:
    """Which regressions' cases each target runs: every selection on the given specs (only
    `regressions_of[spec]` where given), or each regression on its own default targets.
    Duplicate specs are refused."""
    if specs is not None and len(set(specs)) != len(specs):
        duplicated = sorted({s for s in specs if specs.count(s) > 1})
        raise UsageError(f"target {duplicated[0]} is given twice; name each target once")
    plan: dict[str, list[Selection]] = {}
    for selection in selections:
        for spec in specs if specs is not None else selection.regression.default_targets:
            if regressions_of is None or spec not in regressions_of or selection.regression.id in regressions_of[spec]:
                plan.setdefault(spec, []).append(selection)
    return plan


def catalogue_roles(prepared: targets.PreparedTarget, chosen: dict[str, tuple[Role, str]]) -> dict[str, str]:
    """The tree's role for every regression of the catalogue: the run's own as decided, the others
    from the tree, so the judge can name a failure that is another regression's symptom."""
    from cases.regressions import REGRESSIONS

    return {rid: (chosen[rid][0] if rid in chosen else role_of(regression, prepared)[0]).value
            for rid, regression in REGRESSIONS.items()}


def run_matrix(matrix: str, only: list[str] | None, specs: list[str] | None, out_dir: Path, workers: int, cache: Path,
               offline: bool = False, max_cases: int | None = None,
               progress: Callable[[str], None] = print, case_timeout: float = CASE_TIMEOUT_S,
               role_override: Role | None = None, preset: str = "default",
               fork_config: str | None = None, selections: list[Selection] | None = None,
               pairs: set[tuple[str | None, str]] | None = None, tx: list[str] | None = None,
               rsyncdirs: list[str] | None = None, load_timeout: float = LOAD_TIMEOUT_S,
               regressions_of: dict[str, set[str]] | None = None, max_rss: int | None = None) -> dict[str, Any]:
    """Run a matrix; `role_override` judges every target with one role (the sweep's unknown).
    A re-run passes its `selections` instead, and `pairs` (target or None for every target,
    case id) keeps only the results it asks for. `tx`: pytest-xdist `--tx` specs for every
    target session instead of `workers` local workers; `rsyncdirs`: more directories for
    xdist to copy to remote workers; `max_rss`: bytes of data each worker may hold (None: a
    share of the machine's memory)."""
    if selections is None:
        selections = generate(matrix, only, **({"max_cases": max_cases} if max_cases else {}), preset=preset)
    by_target = plan_targets(selections, specs, regressions_of)
    out_dir = Path(os.path.abspath(out_dir))  # handed to the sessions as arguments
    rundir.check_writable(out_dir)
    if not tx:  # each local worker runs in its own sandbox (harness.runner.sandbox); xdist starts the --tx ones
        sandbox.require()
    # Started first: it imports torch and the harness while the targets are prepared and the roles decided.
    with _fork_server(tx) as fork_server:
        prepared = {spec: targets.prepare(spec, cache, offline, fork_config) for spec in by_target}
        roles = {spec: {s.regression.id: (role_override, "given by the caller") if role_override
                        else role_of(s.regression, prepared[spec]) for s in chosen}
                 for spec, chosen in by_target.items()}
        devices = {c.get("device") or "cpu" for s in selections for c in s.cases}
        device_reasons: dict[str, str | None] = {"cpu": None}
        if devices - {"cpu"}:  # asking torch for devices imports it (seconds before the first session starts)
            from harness.targets.devices import unavailable_reasons

            device_reasons = unavailable_reasons()
        excluded = {s.regression.id: dict(s.excluded) for s in selections}
        runnable: dict[str, list[Case]] = {s.regression.id: [] for s in selections}
        for selection in selections:
            for case in selection.cases:
                device = case.get("device") or "cpu"
                reason = device_reasons.get(device)
                if reason:
                    key = f"device {device} unavailable: {reason}"
                    excluded[selection.regression.id][key] = excluded[selection.regression.id].get(key, 0) + 1
                else:
                    runnable[selection.regression.id].append(case)
        def wanted(spec: str, case: Case) -> bool:
            return pairs is None or (spec, case.case_id) in pairs or (None, case.case_id) in pairs

        # A patch that does not apply leaves its target unrunnable: one target-level line, no case run there.
        blocked = {spec: target_problem(p) for spec, p in prepared.items() if p.patch_status == "conflict"}
        plan = [(prepared[spec], [c for s in chosen for c in runnable[s.regression.id] if wanted(spec, c)]
                 if spec not in blocked else [], catalogue_roles(prepared[spec], roles[spec]))
                for spec, chosen in by_target.items()]
        rundir.remove_stale(out_dir)
        jsonl = out_dir / "results.jsonl"
        jsonl.touch()  # there from the start, even while the first case of every session is still running
        # Written first, so a run that dies can still say which results it is missing.
        expected_keys = [[target.spec, case.case_id] for target, cases, _ in plan for case in cases]
        rundir.write_atomic(out_dir / "run-meta.json", json.dumps({
            "matrix": matrix, "only": only or [], "targets": list(by_target), "expected_results": len(expected_keys),
            "expected_keys": expected_keys}))
        for target, cases, _ in plan:
            progress(f"{target.spec}: {len(cases)} cases to run "
                     f"({', '.join(f'{r} {v.value}' for r, (v, _) in roles[target.spec].items())})")
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
        session_problems: list[str] = []
        session_rejected: list[str] = []  # observations the run's judge refused (harness.runner.observations)
        seal_key = seal.new_key()  # this run's: only the lines its own processes seal count
        reader = ProgressReader(jsonl, seal_key)
        try:
            exits = _run_sessions(plan, out_dir, jsonl, workers, progress, case_timeout, tx, rsyncdirs, load_timeout,
                                  session_problems, memory.default_max_rss(workers) if max_rss is None else max_rss,
                                  seal_key, session_rejected, reader, fork_server)
        finally:
            signal.signal(signal.SIGTERM, previous)
        descriptions = {spec: _read_description(out_dir, target) for spec, target in prepared.items()}
        run = assemble(matrix, selections, plan, roles, excluded, descriptions, reader.sealed)
        run["target_problems"] = [{"target": spec, "problem": line} for spec, line in blocked.items()]
        run["problems"] = session_problems + run["problems"]
        run["rejected"] = session_rejected + run["rejected"]
        run["not_run"] = completeness.not_run(run, [(target, cases) for target, cases, _ in plan], exits,
                                              out_dir / "sessions")
        return run


def assemble(matrix: str, selections: list[Selection],
             plan: list[tuple[targets.PreparedTarget, list[Case], dict[str, str]]],
             roles: dict[str, dict[str, tuple[Role, str]]], excluded: dict[str, dict[str, int]],
             descriptions: dict[str, str], sealed: rundir.SealedReader) -> dict[str, Any]:
    """The run from the results file's records, as `sealed` has read them (the rest read now)."""
    sealed.poll(final=True)
    found, problems, rejected = sealed.records, sealed.problems, sealed.rejected
    by_key = {(r["target"], r["case_id"]): r for r in found}
    results = [by_key[(t.spec, c.case_id)] for t, cases, _ in plan for c in cases if (t.spec, c.case_id) in by_key]
    expected = sum(len(cases) for _, cases, _ in plan)
    environment = environment_info([t for t, _, _ in plan], descriptions, roles)
    run = {"schema": SCHEMA, "matrix": matrix, "environment": environment,
           "complete": len(results) == expected, "missing": expected - len(results), "problems": problems,
           "rejected": rejected,
           "regressions": [regression_info(s.regression) for s in selections], "excluded": excluded,
           "results": results}
    run["headlines"] = headlines(run)
    return Run.model_validate(run).model_dump(mode="json", by_alias=True)
