"""The run dir's safety: one run per dir, no stale artifacts beside new results, atomic
writes, a full disk said in one line, and records read defensively.

A run dir is marked as one (`.repro-run`) when the harness creates it or takes an empty
dir; a non-empty dir without the mark is refused, so a run never removes files it did
not write (a dir holding the run lock, which only a run creates, counts as marked: the
run dirs of versions before the mark). Only regular files are written, and only where none or a regular file is: a
symlink, FIFO or device at an output path is refused, never replaced.

A run holds `.repro-run.lock` (filelock, an flock released by the kernel when the run
dies in any way) from before its first write to after its last. What an earlier run left
(reports, run.json, results) is removed before the first new result is written, so a
report never mixes two runs. run.json and the reports are written to a temporary file
and renamed: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout

from harness.errors import UsageError
from harness.runner import scratch, seal
from harness.runner.textsafe import safe_value

LOCK_NAME = ".repro-run.lock"
MARKER_NAME = ".repro-run"  # written into every dir the harness makes a run dir
STALE_FILES = ("run.json", "report.md", "report.html", "junit.xml", "results.jsonl", "run-meta.json", "perf.json",
               "perf.svg", "review.md", "review.json")
STALE_DIRS = ("sessions", "bench-logs")
# What the harness writes inside those dirs (harness.runner.sessions, harness.bench): only these are removed.
STALE_DIR_SUFFIXES = (".cases.json", ".log", ".description", ".startup.jsonl", ".inflight.jsonl", ".ini", ".json",
                      "observations.jsonl")  # the judge reads this one from its start: an earlier run's lines would be refused
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


def kind_of(path: Path) -> str | None:
    """None for a regular file or nothing at all; else what is there (symlink, FIFO, ...)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable entry ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_regular_output(path: Path, option: str = "output") -> None:
    """Refuse to write `path` when something other than a regular file is there: a rename
    would replace a symlink, FIFO or device node with a file."""
    if what := kind_of(path):
        stdout = " (or omit -o: the report goes to stdout)" if option == "-o" else ""
        raise UsageError(f"{option} {path} is {what}, not a regular file; repro writes only regular files "
                         f"(never through or over a link or device); pass another path{stdout}")


def _is_run_dir(out_dir: Path) -> bool:
    """Marked, or left by a version before the mark: only a run creates its lock file."""
    return any(kind_of(out_dir / name) is None and (out_dir / name).is_file() for name in (MARKER_NAME, LOCK_NAME))


def check_run_dir(out_dir: Path) -> None:
    """Refuse an --out that is not a directory, or a non-empty directory the harness did not
    make a run dir; and a run dir whose output names hold something other than regular files."""
    if not out_dir.is_dir():  # a link to a directory is that directory
        if os.path.lexists(out_dir):
            raise UsageError(f"--out {out_dir} is {kind_of(out_dir) or 'a file'}, not a directory; pass a new, "
                             "empty or run directory")
        return
    if not _is_run_dir(out_dir) and any(out_dir.iterdir()):
        raise UsageError(f"--out {out_dir} is a non-empty directory that is not a repro run dir (no {MARKER_NAME});"
                         " repro never removes files it did not write: pass a new or empty directory")
    for name in (*STALE_FILES, *STALE_DIRS, LOCK_NAME):
        what = kind_of(out_dir / name)
        if what and not (name in STALE_DIRS and what == "a directory"):
            raise UsageError(f"run dir {out_dir}: {name} is {what}, which repro did not write; remove it or pass "
                             "another --out")


@contextmanager
def claim(out_dir: Path) -> Iterator[None]:
    """Hold the run dir for this run; a second run into it is refused with one line. A dir
    this run created is removed again when the run is refused before writing anything."""
    check_run_dir(out_dir)
    created = not out_dir.exists()
    check_writable(out_dir)
    marker = out_dir / MARKER_NAME
    if not _is_run_dir(out_dir):
        marker.write_text("a repro run dir: repro removes only the files it wrote here\n")
    lock = FileLock(out_dir / LOCK_NAME, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise UsageError(f"another repro run is writing to {out_dir}; wait for it to finish, "
                         "or pass another --out") from None
    try:
        yield
    except Exception:
        if created and sorted(p.name for p in out_dir.iterdir()) == sorted([LOCK_NAME, MARKER_NAME]):
            lock.release()
            for name in (LOCK_NAME, MARKER_NAME):
                (out_dir / name).unlink(missing_ok=True)
            out_dir.rmdir()
        raise
    finally:
        if lock.is_locked:
            lock.release()


def remove_stale(out_dir: Path) -> None:
    """Remove what an earlier run left, before the first new result is written: the files
    the harness writes, and nothing else (a user's own file in the dir stays)."""
    for name in STALE_FILES:
        if kind_of(out_dir / name) is None:
            (out_dir / name).unlink(missing_ok=True)
    scratch.remove_left(out_dir)
    for name in STALE_DIRS:
        folder = out_dir / name
        if kind_of(folder) != "a directory":
            continue
        for entry in folder.iterdir():
            if kind_of(entry) is None and entry.name.endswith(STALE_DIR_SUFFIXES):
                entry.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()


def _os_error(exc: OSError, path: Path) -> UsageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"disk full writing {path}; the results so far stay in {path.parent / 'results.jsonl'}; "
                        f"free space, then render them with: repro report {path.parent}")
    return UsageError(f"cannot write {path} ({exc.strerror or exc})")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same dir and a rename; refused
    when something other than a regular file is at `path`."""
    check_regular_output(path)
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


def run_text(run: dict[str, Any]) -> str:
    """run.json's text: a line per top-level key and a line per result. json's `indent` takes
    its pure-Python encoder (a second on a run of thousands of results); this is the C one,
    and a diff of two run.json files still shows one result a line."""
    def encoded(key: str, value: Any) -> str:
        if key == "results" and isinstance(value, list) and value:
            return "[\n  " + ",\n  ".join(json.dumps(r) for r in value) + "\n ]"
        return json.dumps(value)

    return "{\n" + ",\n".join(f" {json.dumps(k)}: {encoded(k, v)}" for k, v in run.items()) + "\n}"


def _append_under_lock(handle: IO[str], text: str) -> None:
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        handle.write(text)
        handle.flush()
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


def append_locked(path: Path, text: str) -> None:
    """Append whole lines under a lock (the sessions of a run share its files). A flushed write
    survives the death of this process; an fsync per case (against a kernel crash) would cost
    more than the case."""
    with open(path, "a") as handle:
        _append_under_lock(handle, text)


class LockedAppender:
    """append_locked through one handle, opened at the first append and kept: a session's controller
    appends a line per case, and opening the file for each took as long as the write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    def append(self, text: str) -> None:
        if self._handle is None:
            self._handle = open(self.path, "a")  # noqa: SIM115 — kept open for the session's later lines
        _append_under_lock(self._handle, text)


def append_records(path: Path, records: list[dict[str, Any]], key: bytes | None) -> list[str]:
    """Append records as whole lines, each sealed with the run's key (harness.runner.seal); returns the lines."""
    lines = [json.dumps(seal.sealed(record, key) if key else record) for record in records]
    append_locked(path, "".join(line + "\n" for line in lines))
    return lines


def _parsed_lines(path: Path, problems: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each line of a results.jsonl that parses as a JSON object; a
    line that is not UTF-8, not JSON or not an object is named in `problems` and skipped."""
    if path.is_file():
        yield from _parsed(path.name, path.read_bytes().splitlines(), 1, problems)


def _parsed(name: str, lines: list[bytes], first: int, problems: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, raw in enumerate(lines, start=first):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            problems.append(f"{name} line {number}: not UTF-8, skipped")
            continue
        except json.JSONDecodeError as exc:
            problems.append(f"{name} line {number}: corrupt record skipped ({exc.msg})")
            continue
        except RecursionError:
            problems.append(f"{name} line {number}: nested too deep for a record, skipped")
            continue
        if not isinstance(record, dict):
            problems.append(f"{name} line {number}: not a JSON object, skipped")
            continue
        yield number, record


def _record_of(path: Path, number: int, record: dict[str, Any], problems: list[str]) -> dict[str, Any] | None:
    if missing := [k for k in REQUIRED_KEYS if not isinstance(record.get(k), str)]:
        problems.append(f"{path.name} line {number}: record lacks {', '.join(missing)}, skipped")
        return None
    try:
        return safe_value(seal.unsealed(record))  # an escaped lone surrogate reads back as one: escaped again
    except RecursionError:
        problems.append(f"{path.name} line {number}: nested too deep for a record, skipped")
        return None


def read_results(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Records from a results.jsonl, seals unchecked (a run that never finished: its key is
    gone); a line that is not UTF-8, not JSON, not an object, or lacks a record's keys is
    reported by number and skipped, never a traceback, as is a record a controller refused."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, raw in _parsed_lines(path, problems):
        if seal.REJECTED in raw:
            problems.append(f"{raw.get('target')}: {raw[seal.REJECTED]}")
        elif (record := _record_of(path, number, raw, problems)) is not None:
            records.append(record)
    return records, problems


class SealedReader:
    """A results.jsonl read as it grows, each line once: the records whose seal holds under the
    run's key, the problems, and the rejected, as `read_sealed` gives them for the whole file. The
    runner reads it during the run (its progress) and the run is assembled from what it read."""

    def __init__(self, path: Path, key: bytes) -> None:
        self.path, self.key, self.offset, self.lines = path, key, 0, 0
        # The lines this process wrote itself (the run's judge), with their records: read back
        # without parsing them or checking their seal again. A copy of such a line is read as any line.
        self.written: dict[bytes, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.rejected: list[str] = []

    def poll(self, final: bool = False) -> list[dict[str, Any]]:
        """The records of the lines added since the last poll: whole lines only, or, `final`,
        also a last line that never got its newline (named a problem, as a corrupt record)."""
        if not self.path.is_file():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        taken = chunk if final else chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(taken)
        lines = taken.splitlines()
        first, self.lines = self.lines + 1, self.lines + len(lines)
        found: list[dict[str, Any]] = []
        for number, line in enumerate(lines, start=first):
            if (record := self.written.pop(line, None)) is not None:  # the file's order kept
                found.append(record)
                continue
            for _, raw in _parsed(self.path.name, [line], number, self.problems):
                if not seal.holds(raw, self.key):
                    self.rejected.append(f"{self.path.name} line {number}: a record for {raw.get('target')!r} "
                                         f"{raw.get('case_id')!r} that no process of this run wrote (its seal does "
                                         "not hold); ignored")
                elif seal.REJECTED in raw:
                    self.rejected.append(f"{raw.get('target')}: {raw[seal.REJECTED]}")
                elif (record := _record_of(self.path, number, raw, self.problems)) is not None:
                    found.append(record)
        self.records += found
        return found


def read_sealed(path: Path, key: bytes) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """As `read_results`, counting only the lines whose seal holds under the run's key; also
    the rejected: the records a controller refused, and each line no process of the run wrote."""
    reader = SealedReader(path, key)
    reader.poll(final=True)
    return reader.records, reader.problems, reader.rejected


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


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def run_file_at(path: Path, run_dir: Path) -> str | None:
    """What of the run dir writing `path` would change, relative to it ("." for the dir itself):
    by its name, through a symlink, or as a hard link to one of its files; None for nothing."""
    run_dir = run_dir.expanduser().resolve()
    resolved = path.expanduser().resolve()
    if resolved.is_relative_to(run_dir):
        return str(resolved.relative_to(run_dir))
    if (identity := _identity(path)) is not None and run_dir.is_dir():
        return next((str(f.relative_to(run_dir)) for f in run_dir.rglob("*")
                     if f.is_file() and _identity(f) == identity), None)
    return None


def check_report_output(output: Path, run_path: Path) -> None:
    """`repro report -o FILE` never writes into a run dir: not over the run it renders (by name,
    symlink or hard link; its renderings too: a report of another format would take their
    place), nor into any other run dir (its data, or a file its next run would remove)."""
    run_dir = run_path if run_path.is_dir() else run_path.parent
    if (hit := run_file_at(output, run_dir)) is not None:
        what = f"the run's own {hit}" if (run_dir / hit).exists() else f"a new file in the run's own dir ({hit})"
        raise UsageError(f"-o {output} would write {what}; a report never writes into a run dir: write it "
                         "elsewhere (or omit -o: the report goes to stdout)")
    resolved = output.expanduser().resolve()
    if other := next((d for d in resolved.parents if _is_run_dir(d)), None):
        raise UsageError(f"-o {output} is inside the run dir {other}; a report never writes into a run dir: "
                         "write it elsewhere (or omit -o: the report goes to stdout)")


def session_name(spec: str) -> str:
    """A file name per target: readable, and unique by a hash of the whole spec (two specs that
    differ only in characters the name cannot hold never share session files)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", spec)[-60:].lstrip(".")
    return f"{readable}-{hashlib.sha256(spec.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"
