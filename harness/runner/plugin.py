"""pytest plugin: each case of a case file becomes a pytest item, so pytest-xdist spreads
them over worker processes. One pytest session runs one target.

Workers load the target once, on their first case, and append one JSON line per case
to the run's JSONL as soon as it finishes. The controller records cases whose worker
died or that hit the per-case timeout, which never reach a worker's own record.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

import pytest

# Imports of torch-heavy modules stay inside the hooks: the xdist controller needs none.

_state: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("repro")
    group.addoption("--repro-target", help="PreparedTarget JSON")
    group.addoption("--repro-jsonl", help="where to append result records")
    group.addoption("--repro-description", help="where to write the loaded target's description")
    group.addoption("--repro-roles", default="{}", help="JSON {regression id: the target's role}")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from harness.runner import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Append whole lines under a lock. A flushed write survives the death of this
    process; an fsync per case (against a kernel crash) would cost more than the case."""
    text = "".join(json.dumps(record) + "\n" for record in records)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(text)
        handle.flush()
        fcntl.flock(handle, fcntl.LOCK_UN)


def append_record(path: Path, record: dict[str, Any]) -> None:
    append_records(path, [record])


def _target(config: pytest.Config, needs_megatron: bool) -> Any:
    from harness.errors import TargetLoadError
    from harness.targets import PreparedTarget

    if "target" not in _state:
        prepared = PreparedTarget.from_json(config.getoption("--repro-target"))
        from harness.targets.loader import load

        try:
            _state["target"] = load(prepared)
            description = _state["target"].description
        except TargetLoadError as exc:
            _state["target"], description = exc, f"load error: {exc}"
        if needs_megatron and not isinstance(_state["target"], TargetLoadError):
            from harness.engine.execute import import_megatron

            try:  # after the target: Megatron probes TE at import
                import_megatron("cpu")
            except Exception as exc:  # noqa: BLE001 — recorded per case as a skip with this reason
                _state["megatron_error"] = f"megatron-core CheckpointFunction unavailable: {exc}"
        # The runner reads which ops were TE's own and which the backend's from here.
        if config.getoption("--repro-description"):
            Path(config.getoption("--repro-description")).write_text(description)
    return _state["target"]


class CaseFile(pytest.File):
    def collect(self):  # type: ignore[no-untyped-def]
        from cases.case import Case
        from cases.clients import needs_megatron as case_needs_megatron

        payload = json.loads(self.path.read_text())
        needs_megatron = any(case_needs_megatron(Case(**c)) for c in payload["cases"])
        for fields in payload["cases"]:
            case = Case(**fields)
            yield CaseItem.from_parent(self, name=case.case_id, case=case, needs_megatron=needs_megatron)


def _role(config: pytest.Config, regression: str) -> Any:
    from harness.model import Role

    return Role(json.loads(config.getoption("--repro-roles")).get(regression, "unknown"))


class CaseItem(pytest.Item):
    def __init__(self, *, case: Any, needs_megatron: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case, self.needs_megatron = case, needs_megatron

    def runtest(self) -> None:
        from harness.runner.records import judge

        target = _target(self.config, self.needs_megatron)
        spec = json.loads(self.config.getoption("--repro-target"))["spec"]
        self.config.hook.pytest_repro_case_started(case_id=self.case.case_id)
        record = judge(self.case, spec, target, _role(self.config, self.case.regression), _state.get("megatron_error"))
        append_record(Path(self.config.getoption("--repro-jsonl")), record)
        if record["outcome"] == "harness_error":
            raise AssertionError(record["error"]["message"] if record["error"] else record["note"])

    def reportinfo(self):  # type: ignore[no-untyped-def]
        return self.path, None, self.name


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.name.endswith(".cases.json"):
        return CaseFile.from_parent(parent, path=file_path)
    return None


def pytest_configure(config: pytest.Config) -> None:
    _state["config"] = config


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the controller: a case that killed its worker or timed out leaves no record of
    its own, so write one here."""
    config = _state.get("config")
    if report.passed or config is None or hasattr(config, "workerinput") or "::" not in report.nodeid:
        return
    text = str(report.longrepr)
    if "crashed while running" in text:
        why = "worker died"
    elif "Timeout" in text:
        why = "per-case timeout"
    else:
        return
    from cases.case import Case
    from harness.runner.records import lost_case_record

    case_id = report.nodeid.rsplit("::", 1)[1]
    spec = json.loads(config.getoption("--repro-target"))["spec"]
    role = _role(config, Case.from_id(case_id).regression)
    append_record(Path(config.getoption("--repro-jsonl")), lost_case_record(case_id, spec, role, why, text))
