"""The run's judge, and the file that feeds it: each session's controller appends the raw
observations its workers send to `sessions/observations.jsonl`, sealed with the run's key; the
runner (the `repro` process, which never imports a target) reads them as they come, judges each
against its reference (harness.runner.records.judged) and appends the record to results.jsonl.

One judge for the run: torch is imported once, in a process that has it already, instead of
in every session's controller; and each reference that needs no target (a te.ops pipeline's, a
scenario's own, Megatron's norm's: harness.engine.reference) is computed here, once per case for
every target, never taken from a worker. A line whose seal does not hold (something other than a controller
wrote it: a target can write anywhere its user can), or a second observation of a case (a line
copied), is never judged: the run lists it among its rejected records, which fail it, as a
results line that no process of the run wrote does. So is an observation that names a field no
worker may send (harness.engine.message): its case is judged a harness error that names them.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import time
import traceback
from pathlib import Path
from typing import Any

from harness.engine import message
from harness.runner import rundir, seal
from harness.runner.textsafe import safe_value

BYTES = "$bytes"  # a tensor's bytes, as text in a JSON line
READ_STEP = 1 << 22  # bytes read at a time for a batch of observations (a line is 1-250 kB)


def _bytes_as_text(value: Any) -> Any:
    if isinstance(value, bytes):
        return {BYTES: base64.b64encode(value).decode()}
    raise TypeError(f"{type(value).__name__} is not sent raw")  # safe_value left nothing else


def _text_as_bytes(value: dict[str, Any]) -> Any:
    if len(value) == 1 and isinstance(value.get(BYTES), str):
        with contextlib.suppress(ValueError):  # not base64: left as it is, for wire.unpack to refuse
            return base64.b64decode(value[BYTES], validate=True)
    return value


def raw_text(raw: Any) -> str:
    """A worker's raw observation as the JSON text its controller forwards: encoded once, by the
    worker, so that xdist's channel carries one string (execnet walks a nested value in Python, on
    both sides) and the controller writes it as it came."""
    try:
        return json.dumps(raw, separators=(",", ":"), default=_bytes_as_text)
    except (TypeError, ValueError, RecursionError):  # a value JSON does not take: made plain first
        return json.dumps(safe_value(raw, keep_bytes=True), separators=(",", ":"), default=_bytes_as_text)


def _one_value(text: Any) -> bool:
    """Whether a worker's text is one JSON value on one line of ASCII: it then cannot add fields
    to the line it is written into, nor split it."""
    if not (isinstance(text, str) and text.isascii() and "\n" not in text and "\r" not in text):
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def line_of_text(case_id: str, target: str, text: Any, key: bytes | None) -> str:
    """The controller's line for one raw observation a worker sent as text (`raw_text`): the seal
    of the line's JSON, then the JSON, the case and target the controller's own. A text that is not
    one JSON value goes on as a string, which the judge records as a harness error of the case."""
    body = text if _one_value(text) else json.dumps(f"not an observation: {str(text)[:200]}")
    line_text = f'{{"case_id":{json.dumps(case_id)},"target":{json.dumps(target)},"raw":{body}}}'
    return f"{seal.text_mac(line_text, key) if key else '-'} {line_text}\n"


def line(case_id: str, target: str, raw: Any, key: bytes | None) -> str:
    """The line for a raw observation given as a value."""
    return line_of_text(case_id, target, raw_text(raw), key)


def _torch_for_judging() -> None:
    """torch, imported when the first observation comes rather than before the sessions start:
    its import then overlaps the workers' start-up instead of delaying it."""
    import torch

    torch.set_num_threads(1)  # tiny tensors: judging beside the workers, never against them


class Judge:
    """Reads the observations file from where it left off and judges each sealed line once."""

    def __init__(self, path: Path, results: Path, key: bytes | None, roles: dict[str, dict[str, str]],
                 versions: dict[str, str], written: dict[bytes, dict[str, Any]] | None = None) -> None:
        """`written`: where to leave each line written with its record (rundir.SealedReader.written)."""
        self.path, self.results, self.key, self.written = path, results, key, written
        self.roles, self.versions = roles, versions
        self.offset, self.lines = 0, 0
        self.unread = b""  # read past `offset` by an earlier poll, not judged yet: never read twice
        self.rejected: list[str] = []
        self.judged: set[tuple[str, str]] = set()  # (target, case id)
        self.references: dict[str, dict[str, Any]] = {}  # by case id: the same for every target
        self.refusals: list[dict[str, Any]] = []  # messages naming fields no worker may send, to write

    def poll(self, limit: int = 0, seconds: float = 0.0) -> int:
        """Judge every complete line added since the last poll, or the first `limit` of them, or those
        judged within `seconds` (at least one); returns how many records it wrote. The place read up to
        moves on once their records are written: a poll interrupted (Ctrl-C) is done again whole."""
        if not self.path.is_file():
            return 0
        data, end = self._read(limit)
        if end:
            _torch_for_judging()
        deadline = time.monotonic() + seconds if seconds else None
        records, used = [], 0
        for ended in data[:end].splitlines(keepends=True):  # bytes split at \n, \r and \r\n only
            used += len(ended)
            if (record := self._judged(ended.rstrip(b"\r\n"))) is not None:
                records.append(record)
            if deadline is not None and time.monotonic() > deadline:
                break
        if records:
            lines = rundir.append_records(self.results, records, self.key)
            if self.written is not None:
                self.written.update((line.encode("utf-8", "surrogateescape"), record)
                                    for line, record in zip(lines, records))
        if self.refusals:  # sealed as a controller's refusals are: read back among the run's rejected
            rundir.append_records(self.results, self.refusals, self.key)
            self.refusals = []
        self.offset += used
        self.unread = data[used:]
        return len(records)

    def _read(self, limit: int) -> tuple[bytes, int]:
        """What lies past `offset` (the bytes an earlier poll read but left, then the file's new ones),
        and where its first `limit` complete lines end (all of them without a limit). A batch reads
        only as far as its lines reach, each byte once, and counts the lines it has as it goes."""
        data, end, found = self.unread, 0, 0
        with open(self.path, "rb") as handle:
            handle.seek(self.offset + len(data))
            if not limit:
                data += handle.read()
                return data, data.rfind(b"\n") + 1
            while True:
                while found < limit and (newline := data.find(b"\n", end)) >= 0:
                    end, found = newline + 1, found + 1
                if found == limit or not (more := handle.read(READ_STEP)):
                    return data, end
                data += more

    def _judged(self, text: bytes) -> dict[str, Any] | None:
        self.lines += 1
        mac, _, body = text.decode("utf-8", "surrogateescape").partition(" ")
        entry = None
        if self.key is None or hmac.compare_digest(mac, seal.text_mac(body, self.key)):
            try:
                entry = json.loads(body, object_hook=_text_as_bytes)
            except (ValueError, RecursionError):
                pass
        if (not isinstance(entry, dict) or entry.get("target") not in self.roles
                or not isinstance(entry.get("case_id"), str)):
            self.rejected.append(f"{self.path.name} line {self.lines}: an observation no session of this run wrote "
                                 "(its seal does not hold, or it names no target of the run): not judged")
            return None
        if (entry["target"], entry["case_id"]) in self.judged:
            self.rejected.append(f"{self.path.name} line {self.lines}: a second observation of {entry['case_id']} on "
                                 f"{entry['target']} (a copied line): not judged")
            return None
        self.judged.add((entry["target"], entry["case_id"]))
        if names := message.refused(entry.get("raw")):  # judged all the same: a harness error that names them
            self.refusals.append({seal.REJECTED: f"the observation of {entry['case_id']} names fields no worker may "
                                                 f"send ({', '.join(names)}): refused", "target": entry["target"]})
        return self.judge(entry["case_id"], entry["target"], entry.get("raw"))

    def judge(self, case_id: str, spec: str, raw: Any) -> dict[str, Any]:
        """One case's record; a raw observation that is not one, or a judge that fails on it, is a
        harness error or a lost case of that case, never a pass and never a result lost."""
        from cases.case import Case
        from harness.model import Role
        from harness.runner.records import judged, lost_case_record

        roles = self.roles[spec]
        try:
            case = Case.from_id(case_id)
            role = Role(roles.get(case.regression, Role.UNKNOWN.value))
            return judged(case, spec, role, raw, self._reference(case), self.versions[spec], roles)
        except Exception as exc:  # noqa: BLE001 — the judge's own failure: a result, never a lost one
            return lost_case_record(case_id, spec, Role(roles.get(case_id.partition(":")[0], Role.UNKNOWN.value)),
                                    "the judge failed", traceback.format_exc(), type(exc).__name__)

    def _reference(self, case: Any) -> dict[str, Any] | None:
        from harness.engine import wire
        from harness.engine.reference import independent, reference_side

        if not independent(case):
            return None
        if case.case_id not in self.references:  # read back once, for every target (unpack keeps a tensor as is)
            self.references[case.case_id] = wire.unpack(reference_side(case))
        return self.references[case.case_id]

    def problems(self) -> list[str]:
        """One line for the run's problems, when lines were rejected (each is in `rejected`)."""
        if not self.rejected:
            return []
        return [(f"{self.path.name}: {len(self.rejected)} lines no session of this run wrote (their seal does not "
                 "hold, they name no target of the run, or they copy a line): not judged")]
