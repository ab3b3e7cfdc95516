"""Cases run in chunks (many cases per pytest item): a fault in one case is recorded
against exactly that case, and every other case of the chunk still runs. Faults come
from tests/fault_plugin.py; here every case of the selection is in one chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cases.case import Case
from cases.matrix import generate
from harness.runner import rundir, sessions
from tests.fault_plugin import ENV, PLUGIN

MATRIX, ONLY, TARGET = "smoke", ["pipeline=rmsnorm"], "te-2.20.2"


@pytest.fixture
def one_chunk(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The selection's case ids, in the order its single chunk runs them."""
    monkeypatch.setattr(sessions, "chunk_size", lambda cases, workers: 10_000)
    monkeypatch.setenv("PYTEST_PLUGINS", PLUGIN)
    ids = [c.case_id for s in generate(MATRIX, ONLY) for c in s.cases]
    assert len(ids) >= 4
    return ids


def _run(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, faults: dict[str, str],
         case_timeout: float = 120) -> dict[str, dict]:
    monkeypatch.setenv(ENV, json.dumps(faults))
    run = sessions.run_matrix(MATRIX, ONLY, [TARGET], tmp_path, 1, cache, progress=lambda _: None,
                              case_timeout=case_timeout)
    assert run["complete"] and not run["not_run"]
    return {r["case_id"]: r for r in run["results"]}


def test_a_dead_worker_is_attributed_to_its_case_and_the_chunk_goes_on(tmp_path: Path, cache: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          one_chunk: list[str]) -> None:
    dead = one_chunk[1]
    results = _run(tmp_path, cache, monkeypatch, {dead: "segfault"})
    assert results[dead]["outcome"] == "crash" and results[dead]["error"]["message"] == "worker died"
    assert "killed by signal 11 (SIGSEGV)" in results[dead]["error"]["traceback"]
    assert all(results[c]["outcome"] != "crash" for c in one_chunk if c != dead)
    # The crash cost its case child, not the worker: the cases after it ran in the same session.
    assert not list((tmp_path / "sessions").glob("*follow-up*"))


def test_a_worker_that_dies_is_replaced_and_its_chunk_goes_on_in_a_follow_up(tmp_path: Path, cache: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            one_chunk: list[str]) -> None:
    """Where the worker itself dies (its case killed it), the case in flight is its crash and the
    cases after it run in a follow-up session, and only they."""
    dead = one_chunk[1]
    results = _run(tmp_path, cache, monkeypatch, {dead: "kill_worker"})
    assert results[dead]["outcome"] == "crash" and results[dead]["error"]["message"] == "worker died"
    assert all(results[c]["outcome"] != "crash" for c in one_chunk if c != dead)
    follow_up = json.loads((tmp_path / "sessions" / f"{rundir.session_name(TARGET)}.follow-up-1.cases.json").read_text())
    assert [Case(**c).case_id for c in follow_up["cases"]] == one_chunk[2:]


def test_a_hung_case_times_out_alone(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch,
                                     one_chunk: list[str]) -> None:
    hung = one_chunk[1]
    results = _run(tmp_path, cache, monkeypatch, {hung: "hang"}, case_timeout=5)
    assert results[hung]["outcome"] == "crash" and results[hung]["error"]["message"] == "per-case timeout"
    assert "fault_plugin.py" in results[hung]["error"]["traceback"]  # where it hung
    assert all(results[c]["outcome"] != "crash" for c in one_chunk if c != hung)
    assert not list((tmp_path / "sessions").glob("*follow-up*"))  # the alarm ended it; the worker lived on


def test_a_case_deaf_to_the_alarm_is_ended_by_the_watchdog(tmp_path: Path, cache: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           one_chunk: list[str]) -> None:
    stuck = one_chunk[2]
    results = _run(tmp_path, cache, monkeypatch, {stuck: "stuck"}, case_timeout=3)
    assert results[stuck]["outcome"] == "crash" and results[stuck]["error"]["message"] == "per-case timeout"
    assert all(results[c]["outcome"] != "crash" for c in one_chunk if c != stuck)


def test_a_session_whose_last_case_has_started_frees_its_slot(tmp_path: Path) -> None:
    """The next target's session starts once the running one has begun its last case: its start-up
    overlaps that case and the teardown. A session with a case not yet started still holds its slot."""
    from types import SimpleNamespace

    cases = [c for s in generate(MATRIX, ONLY) for c in s.cases][:3]
    target = SimpleNamespace(spec=TARGET)
    (tmp_path / "sessions").mkdir()
    inflight = tmp_path / "sessions" / f"{rundir.session_name(target.spec)}.inflight.jsonl"
    running = {1: (None, (target, cases, {}, 0))}
    started = sessions.StartedReader(tmp_path)
    assert sessions._busy(running, started) == 1  # type: ignore[arg-type]
    inflight.write_text("".join(json.dumps({"case_id": c.case_id, "worker": "gw0"}) + "\n" for c in cases[:2]))
    assert sessions._busy(running, started) == 1  # type: ignore[arg-type]
    with open(inflight, "a") as out:
        out.write(json.dumps({"case_id": cases[2].case_id, "worker": "gw0"}) + "\n")
    assert sessions._busy(running, started) == 0  # type: ignore[arg-type]
