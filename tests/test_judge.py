"""The judge outside the target's process: what a worker sends is plain data, read back strictly,
compared with a reference computed without any target, and only then judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cases.case import Case
from harness.engine import reference, wire
from harness.model import Role
from harness.runner import observations, seal
from harness.runner.records import judged
from harness.runner.textsafe import safe_value

CASE = Case("issue22", client="ops", pipeline="fused_residual_rmsnorm", grad_mode="enabled", input="non_leaf",
            params="trainable", recompute="none", sequence="single", grad_form="dense", dtype="bfloat16",
            device="cpu")
OTHER = Case("issue22", client="ops", pipeline="fused_residual_rmsnorm", grad_mode="enabled", input="non_leaf",
             params="trainable", recompute="none", sequence="single", grad_form="dense", dtype="float32",
             device="cpu")


def _judged(raw: dict, ref: dict | None = None) -> dict:
    return judged(CASE, "te-2.13.0", Role.UNPATCHED, raw, ref, "2.13.0")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.int64])
def test_tensors_cross_as_plain_data_and_come_back_equal(dtype: torch.dtype) -> None:
    value = (torch.randn(3, 5) * 4).to(dtype)
    packed = wire.pack({"a": [value, (value[:0], None)], "b": "text"})
    back = wire.unpack(packed)
    torch.testing.assert_close(back["a"][0], value, rtol=0, atol=0)
    assert back["a"][1][0].shape == (0, 5) and back["a"][1][1] is None and back["b"] == "text"


@pytest.mark.parametrize("field, why", [
    (["float32", [2, 2], b"\0" * 15], "with 15 bytes, not 16"),
    (["object", [1], b"\0"], "unknown dtype"),
    (["float32", [-1], b""], "not a list of sizes"),
    ("float32", "not [dtype, shape, bytes]"),
])
def test_a_tensor_that_is_not_one_is_refused(field: object, why: str) -> None:
    with pytest.raises(wire.WireError, match=why.replace("[", r"\[")):
        wire.unpack({wire.TENSOR: field})


def test_nesting_is_bounded() -> None:
    deep: object = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.WireError, match="nested too deep"):
        wire.unpack(deep)


def test_a_worker_that_sends_the_references_values_passes_and_one_that_is_off_fails() -> None:
    side = reference.reference_side(CASE)  # a worker whose target computes exactly the reference
    raw = {"test": side, "error": None, "fields": {"fused_ops": []}, "duration_s": 0.01}
    assert _judged(raw)["outcome"] == "pass"
    off = wire.unpack(side)
    off["outputs"] = [tuple(o * 1.5 for o in call) for call in off["outputs"]]
    record = _judged({**raw, "test": wire.pack(off)})
    assert record["outcome"] == "wrong_output" and "outputs" in record["failed_checks"], record["details"]
    flags = wire.unpack(side)
    flags["requires_grad"] = [[not f for f in call] for call in flags["requires_grad"]]
    assert "output_requires_grad" in _judged({**raw, "test": wire.pack(flags)})["failed_checks"]


def test_a_worker_cannot_bring_its_own_reference_for_a_pipeline() -> None:
    """A te.ops pipeline's reference needs no target: one sent beside the target's side, made to
    match wrong values, is not used."""
    off = wire.unpack(reference.reference_side(CASE))
    off["outputs"] = [tuple(o * 1.5 for o in call) for call in off["outputs"]]
    record = _judged({"test": wire.pack(off), "reference": wire.pack(off), "error": None})
    assert record["outcome"] == "wrong_output", record["details"]


@pytest.mark.parametrize("what", ["no calls", "no flags", "fewer flags", "no caller tensors", "no gradients"])
def test_an_observation_with_parts_left_out_fails(what: str) -> None:
    """A worker that leaves out what it observed gets no pass for it: each part the reference has
    must be there to compare."""
    side = wire.unpack(reference.reference_side(CASE))
    if what == "no calls":
        side["outputs"], side["requires_grad"] = [], []
    elif what == "no flags":
        side["requires_grad"] = []
    elif what == "fewer flags":
        side["requires_grad"] = [call[:1] for call in side["requires_grad"]]
    elif what == "no caller tensors":
        side["before"], side["after"] = {}, {}
    else:
        side["grads"] = {}
    record = _judged({"test": wire.pack(side), "error": None})
    assert record["outcome"] != "pass" and record["verdict"] not in ("fixed", "unaffected"), record["details"]


@pytest.mark.parametrize("raw, note", [
    ({"observed": {"outcome": "pass", "failed_checks": [], "details": {}, "error": None}},
     "claims outcome 'pass' without the sides"),
    ({"test": {wire.TENSOR: ["float32", [1], b""]}, "error": None}, "the worker's observation could not be judged"),
    ({"test": {"outputs": []}, "error": None}, "the worker's observation could not be judged"),
    (["not", "a", "mapping"], "could not be judged: it is not a mapping"),
])
def test_a_raw_observation_that_is_not_one_is_a_harness_error(raw: dict, note: str) -> None:
    record = _judged(raw)
    assert record["outcome"] == "harness_error" and record["verdict"] == "harness_error"
    assert note in record["note"], record["note"]


def test_a_reference_that_failed_is_a_harness_error_never_a_pass() -> None:
    side = reference.reference_side(CASE)
    record = _judged({"test": side, "error": None}, {"error": {"type": "RuntimeError", "message": "x",
                                                                "location": None}})
    assert record["outcome"] == "harness_error" and "unfused reference itself failed" in record["note"]


def _judge(tmp_path: Path, key: bytes | None) -> observations.Judge:
    return observations.Judge(tmp_path / "observations.jsonl", tmp_path / "results.jsonl", key,
                              {"te-2.13.0": {"issue22": Role.UNPATCHED.value}}, {"te-2.13.0": "2.13.0"})


def _raw(scale: float, case: Case = CASE) -> dict:
    """A worker's raw observation of a case as it crosses xdist's channel: made safe, bytes kept."""
    side = wire.unpack(reference.reference_side(case))
    side["outputs"] = [tuple(o * scale for o in call) for call in side["outputs"]]
    return safe_value({"test": wire.pack(side), "error": None}, keep_bytes=True)


def test_the_run_judges_each_sealed_observation_once_and_no_other(tmp_path: Path) -> None:
    key = b"k" * 32
    judge = _judge(tmp_path, key)
    with open(judge.path, "w") as out:
        out.write(observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), key))
        out.write(observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), b"x" * 32))  # another key: a forgery
        out.write(observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), None))  # unsealed
        out.write(observations.line(CASE.case_id, "te-2.20.2", _raw(1.0), key)[:-40] + "\n")  # cut short
        out.write(observations.line(OTHER.case_id, "te-2.13.0", _raw(1.5, OTHER), key)[:30])  # not yet a whole line
    assert judge.poll() == 1 and judge.poll() == 0
    records = [json.loads(line) for line in judge.results.read_text().splitlines()]
    assert [r["outcome"] for r in records] == ["pass"] and seal.holds(records[0], key)
    assert "3 lines no session of this run wrote" in judge.problems()[0]
    with open(judge.path, "a") as out:  # the rest of the last line arrives: judged, and wrong
        out.write(observations.line(OTHER.case_id, "te-2.13.0", _raw(1.5, OTHER), key)[30:])
    assert judge.poll() == 1
    last = json.loads(judge.results.read_text().splitlines()[-1])
    assert last["outcome"] == "wrong_output" and "outputs" in last["failed_checks"]
    assert len(judge.rejected) == 3 and "line 2:" in judge.rejected[0]


def test_a_copied_observation_is_not_judged_twice(tmp_path: Path) -> None:
    key = b"k" * 32
    judge = _judge(tmp_path, key)
    genuine = observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), key)
    judge.path.write_text(genuine + genuine)  # a target that can read the file can copy a sealed line
    assert judge.poll() == 1 and len(judge.results.read_text().splitlines()) == 1
    assert judge.rejected == [(f"observations.jsonl line 2: a second observation of {CASE.case_id} on te-2.13.0 "
                              "(a copied line): not judged")]


def test_the_runs_judge_never_imports_a_target(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    (tmp_path / "observations.jsonl").write_text(observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), None))
    probe = ("import sys, pathlib; from tests.test_judge import _judge; judge = _judge(pathlib.Path(sys.argv[1]), None)"
             "\nprint(judge.poll(), sorted(m for m in sys.modules if m.startswith('transformer_engine')))")
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                            check=True)
    assert result.stdout.strip() == "1 []", result.stdout + result.stderr


@pytest.mark.parametrize("text", [
    '{"test":1},"case_id":"issue22:other"',  # a second value that would add a field to the controller's line
    '{"test":\n1}',  # a line break: the line would split in two
    '{"test": "\u00e9"}',  # not ASCII, as the worker's encoder never writes
    '{"test":',  # cut short
])
def test_a_workers_text_that_is_not_one_observation_is_a_harness_error_of_its_own_case(tmp_path: Path,
                                                                                      text: str) -> None:
    """The worker sends its observation as JSON text, written into the controller's line as it came: a
    text that is not exactly one JSON value on one line is sent on as a string, and the judge records a
    harness error for the case the controller had in flight, never another case and never a pass."""
    key = b"k" * 32
    judge = _judge(tmp_path, key)
    judge.path.write_text(observations.line_of_text(CASE.case_id, "te-2.13.0", text, key))
    assert judge.poll() == 1 and not judge.rejected
    record, = (json.loads(line) for line in judge.results.read_text().splitlines())
    assert (record["case_id"], record["outcome"]) == (CASE.case_id, "harness_error")
    assert "not a mapping" in record["note"]


def test_the_workers_text_is_the_observation_the_judge_reads(tmp_path: Path) -> None:
    key = b"k" * 32
    judge = _judge(tmp_path, key)
    text = observations.raw_text(_raw(1.5))
    assert "\n" not in text and text.isascii()
    judge.path.write_text(observations.line_of_text(CASE.case_id, "te-2.13.0", text, key))
    assert judge.poll() == 1
    assert json.loads(judge.results.read_text())["outcome"] == "wrong_output"


def test_the_judge_imports_torch_only_when_there_is_something_to_judge(tmp_path: Path) -> None:
    """The runner creates its judge before the sessions start; torch's import (seconds) then waits for
    the first observation instead of delaying every session's start."""
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = ("import sys, pathlib; from harness.runner import observations\n"
             "judge = observations.Judge(pathlib.Path(sys.argv[1]) / 'obs.jsonl', pathlib.Path(sys.argv[1]) / 'r.jsonl',"
             " None, {}, {}); judge.poll(); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                            check=True)
    assert result.stdout.strip() == "False", result.stdout + result.stderr


def test_the_records_the_judge_hands_over_are_those_read_back(tmp_path: Path) -> None:
    """The runner's reader takes the judge's records as the judge wrote them instead of parsing their
    lines again: they are the records read back from the file (a wrong output, a pass, a harness error,
    their strings and numbers), and a copy of such a line is still read, as a second record."""
    from harness.runner import rundir

    key = b"k" * 32
    reader = rundir.SealedReader(tmp_path / "results.jsonl", key)
    judge = observations.Judge(tmp_path / "observations.jsonl", reader.path, key,
                               {"te-2.13.0": {"issue22": Role.UNPATCHED.value}}, {"te-2.13.0": "2.13.0"}, reader.written)
    with open(judge.path, "w") as out:
        out.write(observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), key))
        out.write(observations.line(OTHER.case_id, "te-2.13.0", _raw(1.5, OTHER), key))
    assert judge.poll() == 2 and len(reader.written) == 2
    with open(reader.path, "a") as out:
        out.write(reader.path.read_text().splitlines()[0] + "\n")  # a copied line
    reader.poll(final=True)
    assert not reader.written
    assert reader.records == rundir.read_sealed(reader.path, key)[0]
    assert [r["outcome"] for r in reader.records] == ["pass", "wrong_output", "pass"]


@pytest.mark.parametrize("read_step", [observations.READ_STEP, 64])  # 64: a line read in many steps
def test_a_backlog_is_judged_in_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_step: int) -> None:
    """The runner judges at most a batch of observations between two looks at its sessions, so that a
    backlog never holds back the start of the next session; the rest waits for the next poll."""
    monkeypatch.setattr(observations, "READ_STEP", read_step)
    key = b"k" * 32
    judge = _judge(tmp_path, key)
    judge.path.write_text(observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), key)
                          + observations.line(OTHER.case_id, "te-2.13.0", _raw(1.0, OTHER), key))
    assert judge.poll(limit=1) == 1 and len(judge.results.read_text().splitlines()) == 1
    assert judge.poll(limit=1) == 1 and judge.poll(limit=1) == 0
    assert len(judge.results.read_text().splitlines()) == 2


@pytest.mark.parametrize("read_step", [observations.READ_STEP, 64])
def test_a_backlog_judged_in_steps_reads_each_byte_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        read_step: int) -> None:
    """A backlog judged a batch at a time is read from the file once: what a poll read past its batch
    is kept for the next one, not read again (a run's observations are tens of MB)."""
    monkeypatch.setattr(observations, "READ_STEP", read_step)
    key = b"k" * 32
    judge = _judge(tmp_path, key)
    cases = [CASE, OTHER, CASE, OTHER]  # the repeats are rejected as copies: judged lines all the same
    judge.path.write_text("".join(observations.line(c.case_id, "te-2.13.0", _raw(1.0, c), key) for c in cases))
    read = 0
    real_open = open

    class Counting:
        def __init__(self, handle):  # type: ignore[no-untyped-def]
            self.handle = handle

        def __enter__(self):  # type: ignore[no-untyped-def]
            return self

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            self.handle.close()

        def seek(self, offset: int) -> None:
            self.handle.seek(offset)

        def read(self, size: int = -1) -> bytes:
            nonlocal read
            data = self.handle.read(size)
            read += len(data)
            return data

    monkeypatch.setattr(observations, "open", lambda path, mode: Counting(real_open(path, mode)), raising=False)
    for _ in cases:  # one line a poll, a rejected copy included
        judge.poll(limit=1)
    assert judge.offset == read == judge.path.stat().st_size
    assert len(judge.results.read_text().splitlines()) == 2 and len(judge.rejected) == 2


def test_a_backlog_is_judged_in_slices_of_time(tmp_path: Path) -> None:
    """Within a poll's slice of time the judge goes on to the next observation; past it, it stops after
    the one in hand (at least one a poll), and the rest waits for the next poll."""
    key = b"k" * 32
    judge = _judge(tmp_path, key)
    judge.path.write_text(observations.line(CASE.case_id, "te-2.13.0", _raw(1.0), key)
                          + observations.line(OTHER.case_id, "te-2.13.0", _raw(1.0, OTHER), key))
    assert judge.poll(seconds=1e-9) == 1 and len(judge.results.read_text().splitlines()) == 1
    assert judge.poll(seconds=1e-9) == 1 and judge.poll(seconds=1e-9) == 0
    assert len(judge.results.read_text().splitlines()) == 2
    assert judge.poll(seconds=60) == 0  # nothing new
