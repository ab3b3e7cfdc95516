"""The run dir's safety: one run per dir, no stale artifacts beside new results, atomic
writes, a full disk said in one line, and records read defensively.

A run holds `.repro-run.lock` (filelock, an flock released by the kernel when the run
dies in any way) from before its first write to after its last. What an earlier run left
(reports, run.json, results) is removed before the first new result is written, so a
report never mixes two runs. run.json and the reports are written to a temporary file
and renamed: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from harness.errors import UsageError

LOCK_NAME = ".repro-run.lock"
STALE_FILES = ("run.json", "report.md", "report.html", "junit.xml", "results.jsonl", "run-meta.json", "perf.json",
               "perf.svg")
STALE_DIRS = ("sessions",)
INPUTS = ("run.json", "results.jsonl", "run-meta.json")  # what `repro report` reads from a run dir
REQUIRED_KEYS = ("case_id", "target", "outcome", "verdict", "expected")


class DiskFull(UsageError):
    """No space left while writing a run's output; the partial results stay in results.jsonl."""


def check_out_location(out_dir: Path, sources: list[Path], cache: Path) -> None:
    """Refuse an --out inside a source under test or inside the target cache: a run never
    writes where it reads code from."""
    out = out_dir.expanduser().resolve()
    for forbidden, what in [*((s, "the source tree") for s in sources), (cache, "the target cache")]:
        forbidden = forbidden.resolve()
        if out == forbidden or out.is_relative_to(forbidden):
            raise UsageError(f"--out {out_dir} is inside {what} {forbidden}; a run never writes into a source "
                             "or the cache; pass an --out elsewhere")


def check_writable(out_dir: Path) -> None:
    """Create the output dir if need be, and prove a file can be written in it."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise UsageError(f"output dir {out_dir} is not writable ({exc.strerror}); pass a writable --out") from None


@contextmanager
def claim(out_dir: Path) -> Iterator[None]:
    """Hold the run dir for this run; a second run into it is refused with one line. A dir
    this run created is removed again when the run is refused before writing anything."""
    created = not out_dir.exists()
    check_writable(out_dir)
    lock = FileLock(out_dir / LOCK_NAME, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise UsageError(f"another repro run is writing to {out_dir}; wait for it to finish, "
                         "or pass another --out") from None
    try:
        yield
    except Exception:
        if created and [p.name for p in out_dir.iterdir()] == [LOCK_NAME]:
            lock.release()
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    finally:
        if lock.is_locked:
            lock.release()


def remove_stale(out_dir: Path) -> None:
    """Remove what an earlier run left, before the first new result is written."""
    for name in STALE_FILES:
        (out_dir / name).unlink(missing_ok=True)
    for name in STALE_DIRS:
        shutil.rmtree(out_dir / name, ignore_errors=True)


def _os_error(exc: OSError, path: Path) -> UsageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"disk full writing {path}; the results so far stay in {path.parent / 'results.jsonl'}; "
                        f"free space, then render them with: repro report {path.parent}")
    return UsageError(f"cannot write {path} ({exc.strerror or exc})")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same dir and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _os_error(exc, path) from None


def read_results(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Records from a results.jsonl; a line that is not UTF-8, not JSON, not an object, or
    lacks a record's keys is reported by number and skipped, never a traceback."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    if not path.is_file():
        return records, problems
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            problems.append(f"{path.name} line {number}: not UTF-8, skipped")
            continue
        except json.JSONDecodeError as exc:
            problems.append(f"{path.name} line {number}: corrupt record skipped ({exc.msg})")
            continue
        if not isinstance(record, dict):
            problems.append(f"{path.name} line {number}: not a JSON object, skipped")
            continue
        if missing := [k for k in REQUIRED_KEYS if not isinstance(record.get(k), str)]:
            problems.append(f"{path.name} line {number}: record lacks {', '.join(missing)}, skipped")
            continue
        records.append(record)
    return records, problems


def check_run_document(run: Any, path: Path) -> None:
    """Refuse a run.json that lacks what every report reads: results and the targets."""
    if not isinstance(run, dict):
        raise UsageError(f"{path} is not a run: its top level is not a JSON object")
    results = run.get("results")
    if not isinstance(results, list):
        raise UsageError(f"{path} has no results list; render the run dir's results.jsonl instead "
                         f"(repro report {path.parent})")
    targets = (run.get("environment") or {}).get("targets") if isinstance(run.get("environment"), dict) else None
    if not isinstance(targets, list) or not all(isinstance(t, dict) and isinstance(t.get("spec"), str)
                                                for t in targets):
        raise UsageError(f"{path} has no environment.targets list; it is not a complete run.json")
    for number, record in enumerate(results, start=1):
        if not isinstance(record, dict) or any(not isinstance(record.get(k), str) for k in REQUIRED_KEYS):
            raise UsageError(f"{path}: result {number} is not a record with {', '.join(REQUIRED_KEYS)}")


def check_report_output(output: Path, run_path: Path) -> None:
    """`repro report -o FILE` never overwrites the run it renders, nor its session files."""
    out = output.expanduser().resolve()
    run_dir = run_path.resolve() if run_path.is_dir() else run_path.resolve().parent
    protected = {run_path.resolve()} | {run_dir / name for name in INPUTS}
    if out in protected or out.is_relative_to(run_dir / "sessions") or out == run_dir:
        raise UsageError(f"-o {output} would overwrite the run's own input {out.name}; write the report elsewhere "
                         "(for example report.md in the run dir)")
