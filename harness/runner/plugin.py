"""pytest plugin: the cases of a case file run as a few large pytest items (chunks of
cases), so pytest-xdist spreads them over worker processes at a cost per chunk, not per
case. One pytest session runs one target.

In a worker, a chunk runs its cases one at a time. Before each case the worker tells the
controller which case starts; after it, it sends the case's record. Both travel as pytest
reports over xdist's own channel, so a worker on another host (`--tx ssh=...`) needs no
shared file system. The controller refuses a record for another target, for a case not in
flight on that worker, or a second one; it hands the others, raw, to the run's judge (the
runner, harness.runner.observations), and writes the records of the cases that ended without
one; each line sealed with the run's key (harness.runner.seal).

A worker runs its cases in a child it forks once the target is loaded (harness.runner.casechild):
a case that kills that child (a segfault, an exit, a signal) is recorded by the worker as a dead
worker's case, with the signal, and the next case runs in a new child forked from the worker's
loaded state: a crash costs a fork, and the chunk goes on. When the worker itself dies, xdist calls
`pytest_handlecrashitem` on the controller, which records the crash against the case that worker
had in flight. The rest of that chunk has no records; the runner starts a follow-up session for
them (harness.runner.sessions).

A case that overruns the per-case timeout is interrupted by SIGALRM and recorded as a
timeout, and the chunk goes on; one deaf to the alarm is ended by its worker, which kills its
child past the timeout and a grace. The bound itself is the controller's: a thread there ends
(SIGKILL) a local worker whose case is in flight past the timeout and a grace period, or
that is still loading the target past the load timeout, whatever the worker is doing (C
code holding the GIL, stopped by SIGSTOP, looping at import); the controller then records
the timeout against the case, or records every case of the session as a load failure of
the target and ends the session. A worker on another host is bounded by its own watchdog
thread (the controller cannot signal it).

A local worker is forked by the run's fork server (harness.runner.forkserver) rather than started
afresh, with torch and this plugin already imported; nothing here depends on which.

Every case the controller hears start is noted in the `--repro-inflight` file, so that
when the controller itself dies the runner can record a crash for the cases it had in
flight (harness.runner.sessions).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
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
from typing import Any, cast

import pytest

from harness.runner import liveness, memory, observations, rundir, sandbox, seal
from harness.runner.textsafe import safe_text

# Imports of torch-heavy modules stay inside the functions: the xdist controller needs none.

NOTICE = "repro"  # the `when` of the reports that carry a case's start and its record
CHUNK_DEFAULT = 200
CONTROLLER_GRACE_S = 5.0  # after the per-case timeout, before the controller ends the worker
# After the per-case timeout, before a worker ends its case child (harness.runner.casechild): within the
# controller's grace, so that a case deaf to the alarm costs a fork, not the worker.
CHILD_GRACE_S = 2.0
# The harness's modules a case child imports on its first case (harness.runner.records.observe).
CHILD_PRELOAD = ("harness.engine.execute", "harness.engine.trial", "harness.targets.cpu_backend.device",
                 "harness.engine.standalone")
WATCHDOG_GRACE_S = 10.0  # after the per-case timeout, before a worker's own watchdog ends it (remote workers)
LOAD_TIMEOUT_REASON = "load timeout"
_state: dict[str, Any] = {}
_lock = threading.Lock()  # the controller's in-flight table, shared with its watch thread


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("repro")
    group.addoption("--repro-target", help="PreparedTarget JSON")
    group.addoption("--repro-jsonl", help="where to append result records")
    group.addoption("--repro-description", help="where to write the loaded target's description")
    group.addoption("--repro-roles", default="{}", help="JSON {regression id: the target's role}")
    group.addoption("--repro-chunk", type=int, default=CHUNK_DEFAULT, help="cases per pytest item")
    group.addoption("--repro-case-timeout", type=float, default=0.0, help="seconds per case; 0: none")
    group.addoption("--repro-startup", help="where to append each worker's start-up times (JSON lines)")
    group.addoption("--repro-load-timeout", type=float, default=0.0,
                    help="seconds a worker may take to load the target; 0: none")
    group.addoption("--repro-seal-fd", type=int, default=-1, help="inherited pipe holding the run's seal key")
    group.addoption("--repro-max-rss", type=int, default=0, help="bytes of data a worker may hold; 0: no bound")
    group.addoption("--repro-inflight", help="where the controller notes each case as it starts (JSON lines)")
    group.addoption("--repro-observations", help="where to append the workers' raw observations, for the run's judge")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from harness.runner import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def _write_records(config: pytest.Config, records: list[dict[str, Any]]) -> None:
    """The controller's write of records: the only place a session adds to the run's JSONL."""
    rundir.append_records(Path(config.getoption("--repro-jsonl")), records, _state.get("seal_key"))


def _refusal(record: Any, spec: str, in_flight: str | None) -> str | None:
    """Why the controller refuses a record a worker sent, or None: a worker holds the target,
    so a record for another target, for a case not in flight on it, or a second one, is not its to send."""
    case_id = record.get("case_id") if isinstance(record, dict) else None
    if not isinstance(case_id, str):
        return "a worker sent a record without a case id: rejected"
    if record.get("target") != spec:
        return f"a worker sent a record for another target ({record.get('target')!r}, case {case_id}): rejected"
    if case_id not in _session_cases():
        return f"a worker sent a record for {case_id}, which is not a case of this session: rejected"
    if case_id in _state["recorded"]:
        return f"a worker sent a second record for {case_id}: rejected"
    if case_id != in_flight:
        return f"a worker sent a record for {case_id}, which was not in flight on it: rejected"
    return None


def _session_cases() -> set[str]:
    """The ids of the cases this session was given (its case files), read once."""
    if "session_cases" not in _state:
        from cases.case import id_of

        files = [Path(a) for a in _state["config"].args if a.endswith(".cases.json")]
        _state["session_cases"] = {id_of(fields) for f in files for fields in json.loads(f.read_text())["cases"]}
    return cast(set[str], _state["session_cases"])


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


def _torch_import_s() -> float:
    """How long importing torch took this process: timed where it first happens (the
    collection of the cases, whose modules import it), once."""
    if "torch_import_s" not in _state:
        _state["torch_preloaded"] = "torch" in sys.modules  # forked by the run's fork server (harness.runner.forkserver)
        started = time.perf_counter()
        import torch  # noqa: F401

        _state["torch_import_s"] = time.perf_counter() - started
    return float(_state["torch_import_s"])


def _worker_setup(config: pytest.Config) -> None:
    """Once per worker process, before its first case: torch on one thread (the cases are
    tiny and the parallelism is the workers'; under load, idle OpenMP threads spinning on
    shared cores cost several times the case), then the target."""
    sys.dont_write_bytecode = True  # a target may be a user's own tree; a remote worker lacks our environment
    memory.bound(config.getoption("--repro-max-rss"))  # before the target: its import is bounded too
    torch_s = _torch_import_s()
    import torch

    torch.set_num_threads(1)
    from harness.errors import TargetLoadError
    from harness.runner import state  # noqa: F401 — the judge's tools and modes, taken before any target
    from harness.targets import PreparedTarget
    from harness.targets.loader import load

    loading = time.perf_counter()
    try:
        _state["target"] = load(PreparedTarget.from_json(config.getoption("--repro-target")))
        description = _state["target"].description
    except TargetLoadError as exc:
        _state["target"], description = exc, f"load error: {exc}"
    _state["startup"] = {"torch_import_s": torch_s, "torch_preloaded": _state["torch_preloaded"],
                         "target_load_s": time.perf_counter() - loading,
                         "megatron_import_s": None, "pid": sandbox.outer_pid(), "host": socket.gethostname(), "cwd": os.getcwd()}
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


def _lost(why: str, text: str, error_type: str | None = None) -> dict[str, Any]:
    """A case that never made its own observation (harness.runner.records.lost_case_record)."""
    return {"lost": {"why": why, "text": text, "error_type": error_type}}


class CaseFile(pytest.File):
    def collect(self):  # type: ignore[no-untyped-def]
        _torch_import_s()  # before the cases' modules import it
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
        if "announced" not in _state:  # the controller ends this process by its pid when it overruns a bound
            _state["announced"] = True
            self._notify("worker", {"pid": sandbox.outer_pid(), "host": socket.gethostname()})
        cases = [Case(**fields) for fields in self.cases]
        for index, case in enumerate(cases):
            if not index:  # a later case's start goes with the record before it: one report a case
                self._notify("started", case.case_id)
            if "target" not in _state:  # after the first notice: a crash while loading is that case's
                self._notify("loading", case.case_id)
                _worker_setup(self.config)
                self._notify("description", safe_text(_state["description"]))
            ahead = (cases[index + 1], self.cases[index + 1]) if index + 1 < len(cases) else None
            raw_text, harness_error = self._run_one(case, self.cases[index], ahead)
            following = {"next": cases[index + 1].case_id} if index + 1 < len(cases) else {}
            self._notify("record", {"case_id": case.case_id, "target": _state["spec"],
                                    "raw_text": raw_text, **following})
            if harness_error is not None:
                errors.append(f"{case.case_id}: {harness_error}")
        if _state["startup"] != _state.get("startup_sent"):  # after the first chunk, and after Megatron's import
            _state["startup_sent"] = dict(_state["startup"])
            self._notify("startup", _state["startup_sent"])
        if errors:
            raise AssertionError(f"{len(errors)} harness errors, the first: {errors[0]}")

    def _run_one(self, case: Any, fields: dict[str, Any],
                 ahead: tuple[Any, dict[str, Any]] | None) -> tuple[str, str | None]:
        """The case's raw observation as JSON text, for the run's judge (harness.runner.observations),
        and the harness error it names. The case runs in the worker's case child (harness.runner.casechild):
        a case that ends that process is recorded as a dead worker's, with how it ended. `ahead`: the
        chunk's next case, started in the next child while a child that dies of a fatal signal is torn down."""
        from cases.clients import needs_megatron
        from harness.runner.casechild import Died

        importing = "megatron_error" not in _state and needs_megatron(case)
        if importing:  # Megatron's import is bounded as a load, not as the case; the child forked after it has it
            self._notify("loading", case.case_id)
        _megatron_error(case)
        if importing:
            self._notify("loaded", None)
        timeout = self.config.getoption("--repro-case-timeout")
        child = _case_child(self.config)
        if _state.pop("sent_ahead", None) != case.case_id:
            child.send(fields)
        _state.update(inflight=(case.case_id, time.monotonic()), receiving=child)
        try:
            answer = child.receive(timeout + CHILD_GRACE_S if timeout else None, lambda: _keep_spare(self.config),
                                   lambda: _send_ahead(self.config, ahead))
        finally:
            _state.update(inflight=None, receiving=None)
        if _state.get("case_child") is not child:  # the next case went ahead to another child
            child.close()
        if isinstance(answer, Died):
            _state["case_children_died"] = True
            return observations.raw_text(_lost(answer.why, answer.text)), None
        return answer.raw_text, answer.harness_error

    def reportinfo(self):  # type: ignore[no-untyped-def]
        return self.path, None, self.name


def _case_child(config: pytest.Config) -> Any:
    """The worker's case child (harness.runner.casechild): the spare, or one forked now, when there is
    none yet or the last one died; both forked again when the worker has imported Megatron since."""
    generation = "megatron_error" in _state
    if _state.get("case_child_generation") != generation:  # the children lack what the worker imported since
        for name in ("case_child", "spare_child"):
            if (old := _state.pop(name, None)) is not None:
                old.close()
        _state["case_child_generation"] = generation
    child = _state.get("case_child")
    if child is None or not child.alive:
        child = _state["case_child"] = _spare_or_new(config)
    return child


def _spare_or_new(config: pytest.Config) -> Any:
    """The spare case child when one is alive (it takes the spare's place), else one forked now."""
    spare = _state.pop("spare_child", None)
    return spare if spare is not None and spare.alive else _fork_case_child(config)


def _keep_spare(config: pytest.Config) -> None:
    """Once a case child has died (a target that crashed may crash again), a spare waits, forked while a
    case runs: the next death costs no wait for a fork."""
    if _state.get("case_children_died") and "spare_child" not in _state:
        _state["spare_child"] = _fork_case_child(config)


def _send_ahead(config: pytest.Config, ahead: tuple[Any, dict[str, Any]] | None) -> None:
    """The case child is dying of a fatal signal: the next case starts in the spare now, while the
    kernel tears the dying one down (a process of the worker's size takes a while). Not a case that
    needs Megatron before the worker has imported it: the child would lack it."""
    from cases.clients import needs_megatron

    if ahead is None or (needs_megatron(ahead[0]) and "megatron_error" not in _state):
        return
    child = _state["case_child"] = _spare_or_new(config)
    child.send(ahead[1])
    _state.update(sent_ahead=ahead[0].case_id, case_children_died=True)
    _keep_spare(config)


def _fork_case_child(config: pytest.Config) -> Any:
    from harness.runner.casechild import CaseChild

    for name in CHILD_PRELOAD:  # imported once here, not again by each child after a crash
        importlib.import_module(name)
    gc.freeze()  # the worker's objects stay out of the child's collections: their pages stay shared
    others = [fd for name in ("case_child", "spare_child", "receiving") if (c := _state.get(name)) is not None
              for fd in c.descriptors()]  # another child's pipes: it must see them close when the worker closes them
    return CaseChild(lambda fields: _answer(_observe(config, fields)), [*_channel_fds(config), *others])


def _channel_fds(config: pytest.Config) -> list[int]:
    """The xdist channel's descriptors in a worker (execnet's pipes to the controller): never the case
    child's, so that the controller sees the worker die when it dies, and only the worker speaks on it."""
    fds = []
    for plugin in config.pluginmanager.get_plugins():
        pipes = getattr(getattr(getattr(plugin, "channel", None), "gateway", None), "_io", None)
        for name in ("infile", "outfile"):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                fds.append(getattr(pipes, name).fileno())
    return fds


def _observe(config: pytest.Config, fields: dict[str, Any]) -> dict[str, Any]:
    """In the case child: the case's raw observation; a case that ended it (a timeout, a BaseException,
    an allocation over the bound) is `lost`."""
    from cases.case import Case
    from harness.runner.records import observe
    from harness.runner.state import guarded

    case = Case(**fields)
    limit = config.getoption("--repro-max-rss")
    try:
        with _alarm(config.getoption("--repro-case-timeout")), guarded() as changed:
            config.hook.pytest_repro_case_started(case_id=case.case_id)
            raw = observe(case, _state["spec"], _state["target"], _state.get("megatron_error"))
        error = raw.get("error") or (raw.get("observed") or {}).get("error")
        if limit and error and memory.refused_allocation(error):
            return _lost(memory.over_bound_note(limit), str(error.get("traceback") or error.get("message")),
                         memory.ERROR_TYPE)
        return {**raw, "state_changes": changed} if changed else raw
    except CaseTimeout:
        return _lost("per-case timeout", traceback.format_exc())
    except BaseException as exc:  # noqa: BLE001 — SystemExit, KeyboardInterrupt, a target's own
        # BaseException subclass: the case ends here, as a crash with the exception's type; the chunk goes on.
        if limit and memory.refused_allocation({"type": type(exc).__name__, "message": str(exc)}):
            return _lost(memory.over_bound_note(limit), traceback.format_exc(), memory.ERROR_TYPE)
        if isinstance(exc, MemoryError):
            why = "out of memory"
        elif isinstance(exc, SystemExit):
            why = f"the case raised SystemExit({exc.code!r})"
        else:
            why = f"the case raised {type(exc).__name__}: {exc}"
        return _lost(why, traceback.format_exc(), type(exc).__name__)


def _answer(raw: dict[str, Any]) -> tuple[str, str | None]:
    """What the case child hands back: the raw observation's text, and the harness error it names."""
    observed = raw.get("observed")
    harness_error = None
    if observed and observed["outcome"] == "harness_error":
        harness_error = str(observed["error"]["message"] if observed["error"] else observed["note"])
    return observations.raw_text(raw), harness_error


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.name.endswith(".cases.json"):
        return CaseFile.from_parent(parent, path=file_path)
    return None


def pytest_configure(config: pytest.Config) -> None:
    _state["config"] = config
    _state.update(inflight_by_worker={}, workers={}, ending={}, recorded=set())
    if not hasattr(config, "workerinput"):
        _session_cases()  # read before any worker starts (a worker could rewrite the files)
    if not hasattr(config, "workerinput") and (fd := config.getoption("--repro-seal-fd")) >= 0:
        _state["seal_key"] = seal.read_key(fd)  # read and closed before xdist starts a worker
    if not hasattr(config, "workerinput") and (config.getoption("--repro-case-timeout")
                                               or config.getoption("--repro-load-timeout")):
        threading.Thread(target=_watch, args=(config,), daemon=True, name="repro-controller-watch").start()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """On a worker, the last thing it does: xdist has sent its last event (`workerfinished`,
    at session finish, with every record before it), so the process ends here, without
    Python's teardown. Tearing down an interpreter that holds torch, the whole TE package and
    Megatron takes 1.5-2.5 s, and the controller waits for it, once per target session."""
    if hasattr(config, "workerinput") and "target" in _state:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _watch(config: pytest.Config) -> None:
    """On the controller: end a local worker whose case, or whose load of the target, overran
    its bound; `pytest_handlecrashitem` then records why (module doc)."""
    case_timeout = config.getoption("--repro-case-timeout")
    load_timeout = config.getoption("--repro-load-timeout")
    here = socket.gethostname()
    loads_seen: dict[tuple[int, float], tuple[float, float, float]] = {}
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        with _lock:
            flights = list(_state["inflight_by_worker"].items())
        for key, (_case_id, since, loading) in flights:
            worker = _state["workers"].get(key)
            if (key in _state["ending"] or not worker or worker["host"] != here
                    or worker["pid"] == os.getpid()):  # another host's, or this process itself (no xdist)
                continue
            if loading:  # a busy machine makes a load slow: the bound is the worker's CPU, or its silence
                if not load_timeout or not liveness.overran(worker["pid"], since, now, load_timeout, loads_seen):
                    continue
            elif not case_timeout or now - since <= case_timeout + CONTROLLER_GRACE_S:
                continue
            _state["ending"][key] = LOAD_TIMEOUT_REASON if loading else "per-case timeout"
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker["pid"], signal.SIGKILL)


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """Notices are not test outcomes: nothing in the terminal, nothing in the counts."""
    return ("", "", "") if report.when == NOTICE else None


def _worker_key(report: Any) -> str:
    node = getattr(report, "node", None)  # set by xdist on the controller
    return node.gateway.id if node is not None else "main"


def _note_inflight(config: pytest.Config, case_id: str, key: str) -> None:
    if path := config.getoption("--repro-inflight"):
        if "inflight_file" not in _state:  # this controller's alone; a line a case, each written out whole
            _state["inflight_file"] = open(path, "a", buffering=1)  # noqa: SIM115 — kept for the session
        _state["inflight_file"].write(json.dumps({"case_id": case_id, "worker": key}) + "\n")


def _start_refusal(case_id: Any, key: str) -> str | None:
    """Why the controller refuses a worker's notice that a case starts (or loads), or None: the worker
    holds the target, so a case that is not one of this session's, was recorded already or is in flight
    on another worker is never put in flight on it (its crash would be attributed to that case)."""
    if not isinstance(case_id, str) or case_id not in _session_cases():
        what = "not a case of this session"
    elif case_id in _state["recorded"]:
        what = "recorded already"
    elif any(flight[0] == case_id for other, flight in _state["inflight_by_worker"].items() if other != key):
        what = "in flight on another worker"
    else:
        return None
    return f"a worker announced the start of {safe_text(str(case_id))[:200]!r}, {what}: rejected"


def _start_refused(config: pytest.Config, case_id: Any, key: str) -> bool:
    """Whether the notice is refused; a refusal is a rejected record, which fails the run."""
    if (problem := _start_refusal(case_id, key)) is None:
        return False
    _write_records(config, [{seal.REJECTED: problem, "target": _session_spec(config)}])
    return True


def _started(config: pytest.Config, case_id: Any, key: str) -> None:
    """A worker's case starts: noted on disk (for a controller that dies) and in flight on it."""
    if _start_refused(config, case_id, key):
        return
    _note_inflight(config, case_id, key)
    with _lock:
        _state["inflight_by_worker"][key] = (case_id, time.monotonic(), False)


def _session_spec(config: pytest.Config) -> str:
    if "session_spec" not in _state:  # read once: the target's JSON is parsed for nothing else here
        _state["session_spec"] = json.loads(config.getoption("--repro-target"))["spec"]
    return cast(str, _state["session_spec"])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller (or a session without xdist): act on a worker's notices."""
    config = _state.get("config")
    if report.when != NOTICE or config is None or hasattr(config, "workerinput"):
        return
    (kind, payload), = report.user_properties
    payload = cast(Any, payload)
    inflight, key = _state["inflight_by_worker"], _worker_key(report)
    if kind == "worker":
        _state["workers"][key] = payload
    elif kind == "started":
        _started(config, payload, key)
    elif kind == "loading" and not _start_refused(config, payload, key):
        with _lock:
            inflight[key] = (payload, time.monotonic(), True)
    elif kind == "record":
        with _lock:
            flight = inflight.pop(key, None)
        spec = _session_spec(config)
        if problem := _refusal(payload, spec, flight[0] if flight else None):
            _write_records(config, [{seal.REJECTED: problem, "target": spec}])
        else:
            _state["recorded"].add(payload["case_id"])
            _forward(config, spec, payload["case_id"], payload.get("raw_text"))
        if isinstance(payload, dict) and isinstance(payload.get("next"), str):  # the worker's next case starts
            _started(config, payload["next"], key)
    elif kind in ("description", "loaded"):
        with _lock:  # loaded: the case's own time starts now
            if key in inflight:
                inflight[key] = (inflight[key][0], time.monotonic(), False)
        if kind == "description" and config.getoption("--repro-description"):
            # The runner reads which ops were TE's own and which the backend's from here.
            Path(config.getoption("--repro-description")).write_text(payload)
    elif kind == "startup" and config.getoption("--repro-startup"):
        with open(config.getoption("--repro-startup"), "a") as handle:
            handle.write(json.dumps(payload) + "\n")


def _forward(config: pytest.Config, spec: str, case_id: str, raw_text: Any) -> None:
    """Hand a raw observation, as the worker's JSON text, to the run's judge, the runner
    (harness.runner.observations): this process never imports torch, and neither judges nor
    computes a reference."""
    if "observations" not in _state:
        _state["observations"] = rundir.LockedAppender(Path(config.getoption("--repro-observations")))
    _state["observations"].append(observations.line_of_text(case_id, spec, raw_text, _state.get("seal_key")))


def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """On the controller: a worker died. Record the crash against the case it had in
    flight; the chunk's later cases are left to the runner's follow-up session. A worker
    ended for overrunning the load timeout ends the session: every case of it is recorded
    as a load failure of the target (each worker would hang the same way)."""
    config = _state["config"]
    key = _worker_key(report)
    with _lock:
        case_id, since, _loading = _state["inflight_by_worker"].pop(key, (None, 0.0, False))
    ended_for = _state["ending"].pop(key, None)
    if case_id is None:  # between cases: nothing to attribute
        return
    from cases.case import Case
    from harness.runner.records import lost_case_record

    spec = json.loads(config.getoption("--repro-target"))["spec"]
    roles = json.loads(config.getoption("--repro-roles"))
    if ended_for == LOAD_TIMEOUT_REASON:
        _record_load_timeout(config, spec, roles)
    timeout = config.getoption("--repro-case-timeout")
    why = ended_for or ("per-case timeout" if timeout and time.monotonic() - since >= timeout else "worker died")
    role = _role(roles, Case.from_id(case_id).regression)
    _state["recorded"].add(case_id)
    _write_records(config, [lost_case_record(case_id, spec, role, why, str(report.longrepr))])


def _record_load_timeout(config: pytest.Config, spec: str, roles: dict[str, str]) -> None:
    """Every case of the session without a record: a load failure of the target. Then the
    other local workers and this controller end (the runner sees every case recorded)."""
    from cases.case import Case
    from harness.errors import TargetLoadError
    from harness.runner.records import judge

    seconds = config.getoption("--repro-load-timeout")
    error = TargetLoadError(f"{spec} did not load within {seconds:g} s (--load-timeout): its worker was ended "
                            "while importing torch, the target or Megatron (a loop or a hang at import)")
    records = []
    for case_file in (Path(a) for a in config.args if a.endswith(".cases.json")):
        for fields in json.loads(case_file.read_text())["cases"]:
            case = Case(**fields)
            if case.case_id not in _state["recorded"]:
                records.append(judge(case, spec, error, _role(roles, case.regression)))
    _write_records(config, records)
    os.write(2, f"repro: {error}\n".encode())
    here = socket.gethostname()
    for worker in _state["workers"].values():
        if worker["host"] == here:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker["pid"], signal.SIGKILL)
    os._exit(3)
