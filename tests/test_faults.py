"""The runner survives faults: dead workers, hung cases, memory exhaustion, signals,
concurrent runs, corrupt JSONL. Faults come from tests/fault_plugin.py, loaded into the
target sessions with PYTEST_PLUGINS."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.runner.rundir import read_results
from tests.conftest import REPO
from tests.fault_plugin import ENV, PLUGIN

SELECTION = ["--matrix", "smoke", "--only", "pipeline=rmsnorm", "--targets", "te-2.20.2"]
CASE = "issue22:ops-rmsnorm-{}-trainable-none-single-dense-float32-cpu"


def _run(out: Path, faults: dict[str, str], *extra: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, ENV: json.dumps(faults), "PYTEST_PLUGINS": PLUGIN,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if cache:
        env["TE_REPRO_CACHE"] = str(cache)

    return subprocess.run([sys.executable, "-m", "repro", "run", *SELECTION, "--out", str(out), *extra],
                          capture_output=True, text=True, cwd=REPO, env=env, check=False)


def _results(out: Path) -> dict[str, dict]:
    return {r["case_id"]: r for r in json.loads((out / "run.json").read_text())["results"]}


def test_dead_workers_are_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    faults = {CASE.format("no_grad-leaf"): "segfault", CASE.format("enabled-leaf"): "exit"}
    result = _run(tmp_path, faults)
    results = _results(tmp_path)
    assert json.loads((tmp_path / "run.json").read_text())["complete"], result.stderr
    for case_id in faults:
        assert results[case_id]["outcome"] == "crash"
        assert results[case_id]["error"]["message"] == "worker died"
    assert results[CASE.format("no_grad-non_leaf")]["outcome"] == "pass"  # the rest still ran
    assert result.returncode == 1  # a crash on a fixed release is a regression


def test_hung_case_hits_the_timeout(tmp_path: Path) -> None:
    _run(tmp_path, {CASE.format("no_grad-leaf"): "hang"}, "--case-timeout", "5")
    record = _results(tmp_path)[CASE.format("no_grad-leaf")]
    assert record["outcome"] == "crash" and record["error"]["message"] == "per-case timeout"
    assert _results(tmp_path)[CASE.format("enabled-leaf")]["outcome"] == "pass"


def test_unbounded_allocation_is_recorded_as_over_the_bound(tmp_path: Path) -> None:
    """The harness bounds its workers itself (--max-rss): no limit from outside the run."""
    _run(tmp_path, {CASE.format("no_grad-leaf"): "allocate"}, "--max-rss", "2")
    record = _results(tmp_path)[CASE.format("no_grad-leaf")]
    assert record["outcome"] == "crash" and record["verdict"] != "pass"
    assert record["error"]["type"] == "MemoryBound"
    assert record["error"]["message"] == "over the memory bound: a worker may hold 2.0 GiB (--max-rss)"
    assert _results(tmp_path)[CASE.format("enabled-leaf")]["outcome"] == "pass"


def test_a_tensor_over_the_bound_is_recorded_as_over_the_bound(tmp_path: Path) -> None:
    """torch's allocator refuses past the bound with a RuntimeError of its own: the same record."""
    _run(tmp_path, {CASE.format("no_grad-leaf"): "allocate_tensor"}, "--max-rss", "2")
    record = _results(tmp_path)[CASE.format("no_grad-leaf")]
    assert record["error"]["type"] == "MemoryBound", record["error"]
    assert _results(tmp_path)[CASE.format("enabled-leaf")]["outcome"] == "pass"


def test_sigterm_keeps_partial_results(tmp_path: Path) -> None:
    env = {**os.environ, ENV: json.dumps({CASE.format("no_grad-non_leaf"): "hang"}), "PYTEST_PLUGINS": PLUGIN,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "repro", "run", *SELECTION, "--out", str(tmp_path)],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        records, _ = read_results(tmp_path / "results.jsonl")
        if len(records) >= 5:
            break
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "partial results kept" in stderr
    records, problems = read_results(tmp_path / "results.jsonl")
    assert len(records) >= 5 and not problems
    assert not (tmp_path / "run.json").exists()


def test_concurrent_runs_share_a_cold_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "TE_REPRO_CACHE": str(cache)}
    runs = [subprocess.Popen([sys.executable, "-m", "repro", "run", *SELECTION, "--out", str(tmp_path / f"run{i}")],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]
    for process in runs:
        process.communicate(timeout=300)
        assert process.returncode == 0
    for i in range(2):
        assert json.loads((tmp_path / f"run{i}" / "run.json").read_text())["complete"]
    assert len(list((cache / "wheels").glob("*.whl"))) == 1
    assert not [p for p in (cache / "src").iterdir() if p.name.startswith(".")]  # no half-unpacked trees


def test_corrupt_jsonl_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    def line(case_id: str) -> str:
        return json.dumps({"case_id": case_id, "target": "t", "outcome": "pass", "verdict": "fixed", "expected": "fixed"})

    path.write_bytes(f'{line("a")}\n{{"case_id": "b", "trunc\nnot json at all\n[1, 2]\n{{"case_id": "d"}}\n'
                     f'\xff\xfe\n{line("c")}\n'.encode("latin-1"))
    records, problems = read_results(path)
    assert [r["case_id"] for r in records] == ["a", "c"]
    assert [p.split(":")[0] for p in problems] == [f"results.jsonl line {n}" for n in (2, 3, 4, 5, 6)]


def test_unloadable_target_is_recorded_not_lost(tmp_path: Path, cache: Path) -> None:
    from harness import targets

    tree = tmp_path / "broken"
    shutil.copytree(Path(targets.prepare("te-2.13.0", cache).root) / "transformer_engine", tree / "transformer_engine")
    fuser = tree / "transformer_engine/pytorch/ops/fuser.py"
    fuser.write_text(fuser.read_text() + "\nfrom ..quantization import NoSuchSymbolForTest\n")
    spec = f"path:{tree}"
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "repro", "run", "--matrix", "smoke", "--only", "pipeline=rmsnorm",
                             "--targets", spec, "--out", str(out)], capture_output=True, text=True, cwd=REPO, check=False)
    assert result.returncode == 1
    run = json.loads((out / "run.json").read_text())
    assert run["complete"]
    ran = run["results"]
    assert ran and all(r["target"] == spec and r["verdict"] == "harness_error" for r in ran)
    assert "NoSuchSymbolForTest" in ran[0]["note"]


def test_the_results_read_as_they_grow_are_the_results_read_at_the_end(tmp_path: Path) -> None:
    """The runner reads results.jsonl while its sessions write it and assembles the run from what it
    read: the same records, problems and rejected lines, with the same line numbers, as reading the
    whole file once; a last line without its newline is read only at the end, as a corrupt record."""
    from harness.runner import rundir, seal

    key = b"k" * 32
    path = tmp_path / "results.jsonl"

    def record(case: str) -> str:
        return json.dumps(seal.sealed({"case_id": case, "target": "t", "outcome": "pass", "verdict": "unaffected",
                                       "expected": "pass"}, key)) + "\n"

    pieces = [record("a"), "not json\n", record("b")[:20], record("b")[20:],
              json.dumps({"case_id": "c", "target": "t", "outcome": "pass", "verdict": "unaffected",
                          "expected": "pass", "seal": "0" * 64}) + "\n",  # a forged line
              json.dumps(seal.rejection("t", "refused", key)) + "\n", record("d"), '{"case_id": "e"']
    reader = rundir.SealedReader(path, key)
    seen = []
    for piece in pieces:
        with open(path, "a") as out:
            out.write(piece)
        seen += [r["case_id"] for r in reader.poll()]
    assert seen == ["a", "b", "d"]
    reader.poll(final=True)
    assert (reader.records, reader.problems, reader.rejected) == rundir.read_sealed(path, key)
    assert reader.problems == ["results.jsonl line 2: corrupt record skipped (Expecting value)",
                               "results.jsonl line 7: corrupt record skipped (Expecting ',' delimiter)"]
    assert len(reader.rejected) == 2 and "line 4:" in reader.rejected[0]


def test_the_judges_records_keep_their_place_among_other_writers_lines(tmp_path: Path) -> None:
    """Records the judge hands over are taken in the file's order, between the lines other writers
    (a controller's crash record) appended: the run's records are in the order read_sealed gives."""
    from harness.runner import rundir

    key = b"k" * 32
    path = tmp_path / "results.jsonl"

    def record(case: str) -> dict:
        return {"case_id": case, "target": "t", "outcome": "pass", "verdict": "unaffected", "expected": "pass"}

    reader = rundir.SealedReader(path, key)
    for case, by_the_judge in (("a", True), ("b", False), ("c", True)):
        line, = rundir.append_records(path, [record(case)], key)
        if by_the_judge:
            reader.written[line.encode()] = record(case)
    reader.poll(final=True)
    assert [r["case_id"] for r in reader.records] == ["a", "b", "c"]
    assert reader.records == rundir.read_sealed(path, key)[0]
