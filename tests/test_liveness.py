"""A busy machine makes a bench worker slow, never failed: the controller waits while the
worker's CPU time grows, says it is slow, and gives up only on a worker that exited or
used no CPU for the bound scaled by the load. The children here stand in for a worker."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.bench import BenchWorkerError, Worker
from harness.runner import liveness

BUSY_THEN_REPLY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\nprint('{{\"ok\": 1}}', flush=True)\n"


def _worker(tmp_path: Path, code: str, said: list[str]) -> Worker:
    worker = Worker.__new__(Worker)  # the controller's side only: any child stands in for the bench worker
    worker.spec, worker.log, worker.on_slow = "te-x", tmp_path / "worker.log", said.append
    worker.log.write_text("the child's last words\n")
    worker.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
    return worker


def test_a_slow_worker_that_works_is_waited_for_and_said_to_be_slow(tmp_path: Path) -> None:
    said: list[str] = []
    worker = _worker(tmp_path, BUSY_THEN_REPLY.format(s=4), said)
    try:
        assert worker.receive(timeout=1) == {"ok": 1}
    finally:
        worker.close()
    assert len(said) == 1 and "te-x is slow" in said[0] and "it is working" in said[0], said


def test_a_worker_that_uses_no_cpu_fails_after_the_bound(tmp_path: Path) -> None:
    worker = _worker(tmp_path, "import time\ntime.sleep(60)\n", [])
    started = time.monotonic()
    try:
        with pytest.raises(BenchWorkerError, match=r"te-x made no progress for \d+ s \(no CPU time used; load average"):
            worker.receive(timeout=1)
    finally:
        worker.process.kill()
        worker.close()
    assert time.monotonic() - started < 30 * liveness.load_factor()


def test_a_worker_that_exits_fails_at_once_with_its_last_words(tmp_path: Path) -> None:
    worker = _worker(tmp_path, "import sys\nsys.exit(3)\n", [])
    with pytest.raises(BenchWorkerError, match="te-x exited 3: the child's last words"):
        worker.receive(timeout=60)
    worker.close()


def test_cpu_seconds_grow_with_work_and_stop_with_the_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", BUSY_THEN_REPLY.format(s=1.5)], stdout=subprocess.DEVNULL)
    first = liveness.cpu_seconds(child.pid)
    time.sleep(1)
    second = liveness.cpu_seconds(child.pid)
    child.wait()
    assert first is not None and second is not None and second - first >= liveness.PROGRESS_CPU_S
    assert liveness.cpu_seconds(child.pid) is None


def _overran_after(code: str, wall_s: float, bound_s: float = 1.0) -> bool:
    """Whether a child running `code` is past a load bound of `bound_s` after `wall_s` of wall time."""
    child = subprocess.Popen([sys.executable, "-c", code])
    started, seen = time.monotonic(), {}
    try:
        while (now := time.monotonic()) - started < wall_s:
            if liveness.overran(child.pid, started, now, bound_s, seen):
                return True
            time.sleep(0.1)
        return False
    finally:
        child.kill()
        child.wait()


# Busy a fifth of the time: a worker starved by a busy machine, still working.
STARVED = "import time\nwhile True:\n    end = time.monotonic() + 0.02\n    while time.monotonic() < end: pass\n    time.sleep(0.08)\n"


def test_a_load_is_bounded_by_its_cpu_or_its_silence_not_by_wall_time() -> None:
    assert not _overran_after(STARVED, wall_s=3)  # 3 s of wall, about 0.6 s of CPU: slow, not stuck
    assert _overran_after("while True: pass", wall_s=30 * liveness.load_factor())  # a loop: 1 s of CPU
    assert _overran_after("import time\ntime.sleep(600)", wall_s=30 * liveness.load_factor())  # a hang: no CPU
