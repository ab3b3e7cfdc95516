"""pytest plugin: the cases of a case file run as a few large pytest items (chunks of
cases), so pytest-xdist spreads them over worker processes at a cost per chunk, not per
case. One pytest session runs one target.

In a worker, a chunk runs its cases one at a time. Before each case the worker tells the
controller which case starts; after it, it sends the case's record. Both travel as pytest
reports over xdist's own channel, so a worker on another host (`--tx ssh=...`) needs no
shared file system: the controller alone writes the run's JSONL.

When a worker dies, xdist calls `pytest_handlecrashitem` on the controller, which records
the crash against the case that worker had in flight. The rest of that chunk has no
records; the runner starts a follow-up session for them (harness.runner.sessions).

A case that overruns the per-case timeout is interrupted by SIGALRM and recorded as a
timeout, and the chunk goes on. A case stuck where the alarm cannot reach it (in C code
that never returns to the interpreter) is ended by a watchdog thread that kills the
worker; the controller then records the timeout against it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Imports of torch-heavy modules stay inside the functions: the xdist controller needs none.

NOTICE = "repro"  # the `when` of the reports that carry a case's start and its record
CHUNK_DEFAULT = 200
WATCHDOG_GRACE_S = 10.0  # after the per-case timeout, before the watchdog kills a stuck worker
_state: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("repro")
    group.addoption("--repro-target", help="PreparedTarget JSON")
    group.addoption("--repro-jsonl", help="where to append result records")
    group.addoption("--repro-description", help="where to write the loaded target's description")
    group.addoption("--repro-roles", default="{}", help="JSON {regression id: the target's role}")
    group.addoption("--repro-chunk", type=int, default=CHUNK_DEFAULT, help="cases per pytest item")
    group.addoption("--repro-case-timeout", type=float, default=0.0, help="seconds per case; 0: none")
    group.addoption("--repro-startup", help="where to append each worker's start-up times (JSON lines)")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from harness.runner import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Append whole lines under a lock (the sessions of a run share one JSONL). A flushed
    write survives the death of this process; an fsync per case (against a kernel crash)
    would cost more than the case."""
    text = "".join(json.dumps(record) + "\n" for record in records)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(text)
        handle.flush()
        fcntl.flock(handle, fcntl.LOCK_UN)


def append_record(path: Path, record: dict[str, Any]) -> None:
    append_records(path, [record])


class CaseTimeout(BaseException):
    """Raised by the per-case alarm. A BaseException, so that the engine's `except
    Exception` (which records a case's own failures) does not take it for one."""


def _on_alarm(_signum: int, _frame: Any) -> None:
    raise CaseTimeout


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds` (0: never), in the main thread only (where Python delivers it)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _watchdog(timeout: float) -> None:
    """Kill this worker when one case has been in flight for longer than the timeout and
    the alarm could not end it; the controller records the timeout (see module doc)."""
    while True:
        time.sleep(1.0)
        inflight = _state.get("inflight")
        if inflight and time.monotonic() - inflight[1] > timeout + WATCHDOG_GRACE_S:
            os.write(2, f"repro: case {inflight[0]} ignored the per-case timeout; ending this worker\n".encode())
            os._exit(70)


def _worker_setup(config: pytest.Config) -> None:
    """Once per worker process, before its first case: torch on one thread (the cases are
    tiny and the parallelism is the workers'; under load, idle OpenMP threads spinning on
    shared cores cost several times the case), then the target."""
    sys.dont_write_bytecode = True  # a target may be a user's own tree; a remote worker lacks our environment
    started = time.perf_counter()
    import torch

    torch_s = time.perf_counter() - started
    torch.set_num_threads(1)
    from harness.errors import TargetLoadError
    from harness.targets import PreparedTarget
    from harness.targets.loader import load

    loading = time.perf_counter()
    try:
        _state["target"] = load(PreparedTarget.from_json(config.getoption("--repro-target")))
        description = _state["target"].description
    except TargetLoadError as exc:
        _state["target"], description = exc, f"load error: {exc}"
    _state["startup"] = {"torch_import_s": torch_s, "target_load_s": time.perf_counter() - loading,
                         "megatron_import_s": None, "pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd()}
    _state["description"] = description
    _state["spec"] = json.loads(config.getoption("--repro-target"))["spec"]
    _state["roles"] = json.loads(config.getoption("--repro-roles"))
    if timeout := config.getoption("--repro-case-timeout"):
        threading.Thread(target=_watchdog, args=(timeout,), daemon=True, name="repro-watchdog").start()


def _megatron_error(case: Any) -> str | None:
    """Import Megatron the first time a case needs it (never in a process that runs no
    Megatron case), after the target: Megatron probes TE at import."""
    from cases.clients import needs_megatron
    from harness.errors import TargetLoadError

    if not needs_megatron(case) or isinstance(_state["target"], TargetLoadError):
        return None
    if "megatron_error" not in _state:
        from harness.engine.execute import import_megatron

        started = time.perf_counter()
        try:
            import_megatron("cpu")
            _state["megatron_error"] = None
        except Exception as exc:  # noqa: BLE001 — recorded per case as a harness error with this reason
            _state["megatron_error"] = f"megatron-core CheckpointFunction unavailable: {exc}"
        _state["startup"]["megatron_import_s"] = time.perf_counter() - started
    return _state["megatron_error"]


def _role(roles: dict[str, str], regression: str) -> Any:
    from harness.model import Role

    return Role(roles.get(regression, "unknown"))


class CaseFile(pytest.File):
    def collect(self):  # type: ignore[no-untyped-def]
        from cases.case import Case
        from cases.clients import needs_megatron

        cases = json.loads(self.path.read_text())["cases"]
        size = max(1, self.config.getoption("--repro-chunk"))
        # Megatron's cases last, in chunks of their own: only the workers that run them import it.
        uses = [needs_megatron(Case(**c)) for c in cases]
        groups = {"cases": [c for c, m in zip(cases, uses) if not m],
                  "megatron-cases": [c for c, m in zip(cases, uses) if m]}
        for label, group in groups.items():
            for start in range(0, len(group), size):
                part = group[start:start + size]
                yield CaseChunk.from_parent(self, name=f"{label}-{start}-{start + len(part) - 1}", cases=part)


class CaseChunk(pytest.Item):
    """Consecutive cases of one case file, run one after another in one worker."""

    def __init__(self, *, cases: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cases = cases

    def _notify(self, kind: str, payload: Any) -> None:
        """A report only this plugin reads: on a worker xdist sends it to the controller;
        without xdist it reaches this process's own `pytest_runtest_logreport`."""
        report = pytest.TestReport(self.nodeid, self.location, {}, "passed", None, NOTICE,  # type: ignore[arg-type]
                                   user_properties=[(kind, payload)])
        self.ihook.pytest_runtest_logreport(report=report)

    def runtest(self) -> None:
        from cases.case import Case

        errors = []
        for fields in self.cases:
            case = Case(**fields)
            self._notify("started", case.case_id)
            if "target" not in _state:  # after the first notice: a crash while loading is that case's
                _worker_setup(self.config)
                self._notify("description", _state["description"])
            record = self._run_one(case)
            self._notify("record", record)
            if record["outcome"] == "harness_error":
                errors.append(f"{case.case_id}: {record['error']['message'] if record['error'] else record['note']}")
        if _state["startup"] != _state.get("startup_sent"):  # after the first chunk, and after Megatron's import
            _state["startup_sent"] = dict(_state["startup"])
            self._notify("startup", _state["startup_sent"])
        if errors:
            raise AssertionError(f"{len(errors)} harness errors, the first: {errors[0]}")

    def _run_one(self, case: Any) -> dict[str, Any]:
        from harness.runner.records import judge, lost_case_record

        spec, role = _state["spec"], _role(_state["roles"], case.regression)
        megatron_error = _megatron_error(case)
        _state["inflight"] = (case.case_id, time.monotonic())
        try:
            with _alarm(self.config.getoption("--repro-case-timeout")):
                self.config.hook.pytest_repro_case_started(case_id=case.case_id)
                return judge(case, spec, _state["target"], role, megatron_error)
        except CaseTimeout:
            return lost_case_record(case.case_id, spec, role, "per-case timeout", traceback.format_exc())
        except (MemoryError, SystemExit) as exc:  # the case ends here, as a crash; the chunk goes on
            why = "out of memory" if isinstance(exc, MemoryError) else f"the case raised SystemExit({exc.code!r})"
            record = lost_case_record(case.case_id, spec, role, why, traceback.format_exc())
            record["error"]["type"] = type(exc).__name__
            return record
        finally:
            _state["inflight"] = None

    def reportinfo(self):  # type: ignore[no-untyped-def]
        return self.path, None, self.name


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.name.endswith(".cases.json"):
        return CaseFile.from_parent(parent, path=file_path)
    return None


def pytest_configure(config: pytest.Config) -> None:
    _state["config"] = config
    _state["inflight_by_worker"] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """Notices are not test outcomes: nothing in the terminal, nothing in the counts."""
    return ("", "", "") if report.when == NOTICE else None


def _worker_key(report: Any) -> str:
    node = getattr(report, "node", None)  # set by xdist on the controller
    return node.gateway.id if node is not None else "main"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller (or a session without xdist): act on a worker's notices."""
    config = _state.get("config")
    if report.when != NOTICE or config is None or hasattr(config, "workerinput"):
        return
    (kind, payload), = report.user_properties
    inflight = _state["inflight_by_worker"]
    if kind == "started":
        inflight[_worker_key(report)] = (payload, time.monotonic())
    elif kind == "record":
        inflight.pop(_worker_key(report), None)
        append_record(Path(config.getoption("--repro-jsonl")), payload)
    elif kind == "description" and config.getoption("--repro-description"):
        # The runner reads which ops were TE's own and which the backend's from here.
        Path(config.getoption("--repro-description")).write_text(payload)
    elif kind == "startup" and config.getoption("--repro-startup"):
        with open(config.getoption("--repro-startup"), "a") as handle:
            handle.write(json.dumps(payload) + "\n")


def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """On the controller: a worker died. Record the crash against the case it had in
    flight; the chunk's later cases are left to the runner's follow-up session."""
    config = _state["config"]
    case_id, since = _state["inflight_by_worker"].pop(_worker_key(report), (None, 0.0))
    if case_id is None:  # between cases: nothing to attribute
        return
    from cases.case import Case
    from harness.runner.records import lost_case_record

    timeout = config.getoption("--repro-case-timeout")
    why = "per-case timeout" if timeout and time.monotonic() - since >= timeout else "worker died"
    spec = json.loads(config.getoption("--repro-target"))["spec"]
    role = _role(json.loads(config.getoption("--repro-roles")), Case.from_id(case_id).regression)
    append_record(Path(config.getoption("--repro-jsonl")),
                  lost_case_record(case_id, spec, role, why, str(report.longrepr)))
