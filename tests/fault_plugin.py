"""Test-only fault injection, loaded into the target sessions through PYTEST_PLUGINS
(pytest's own environment variable): it implements the runner's
`pytest_repro_case_started` hook and kills, hangs or exhausts the worker on the cases
named in REPRO_TEST_INJECT_FAULTS, as JSON {"<case_id>": "segfault" | "exit" | "hang" |
"stuck" | "allocate" | "allocate_tensor" | "gil" | "sigstop" | "kill_controller" | "kill_worker" | "orphan" |
"grad_off" | a raise_* fault}; "kill_worker" kills the worker the case's child was forked from; "stuck" hangs deaf to the per-case alarm, as a case spinning in C code
would; "gil" holds the GIL in C code (deaf to the alarm, and no other thread of the worker
runs); "sigstop" stops the worker; "kill_controller" kills the session's controller with
the case in flight; "orphan" leaves a process of its own session behind; the raise_*
faults raise what a hostile target may. Production code never imports this module."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

ENV = "REPRO_TEST_INJECT_FAULTS"
PLUGIN = "tests.fault_plugin"
ORPHAN_PIDS = os.environ.get("REPRO_TEST_ORPHAN_PIDS", "/dev/null")  # where "orphan" notes its process


class TargetsOwnBaseException(BaseException):
    """What a hostile target may raise: no Exception, so no `except Exception` takes it."""


RAISES = {
    "raise_surrogate": lambda: RuntimeError("bytes \udcff\udc80 from a surrogateescape decode"),
    "raise_huge": lambda: RuntimeError("x" * 10_000_000),
    "raise_controls": lambda: RuntimeError("NUL\x00 ESC\x1b[31mred\x1b[0m OSC\x1b]0;title\x07 bidi\u202e"),
    "raise_base": lambda: TargetsOwnBaseException("not an Exception"),
    "raise_keyboard": KeyboardInterrupt,
}


_main_argv: list[str] = []


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    _main_argv[:] = getattr(config, "workerinput", {}).get("mainargv", [])


def _controller() -> int:
    """The session's controller: a worker the run's fork server forked is not its child, so it is
    found by its command line (xdist hands each worker the controller's argv)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                args = handle.read().decode(errors="replace").split("\0")[:-1]
        except (OSError, ValueError):
            continue
        if _main_argv and args[3:] == _main_argv[1:] and args[1:3] == ["-m", "pytest"]:
            return int(entry)
    return os.getppid()


def pytest_repro_case_started(case_id: str) -> None:
    fault = json.loads(os.environ.get(ENV) or "{}").get(case_id)
    if fault == "segfault":
        ctypes.string_at(0)
    elif fault == "exit":
        os._exit(3)
    elif fault == "hang":
        time.sleep(3600)
    elif fault == "stuck":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)
    elif fault == "gil":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # else the alarm cuts sleep(3) short
        ctypes.PyDLL(None).sleep(3600)  # a C call that keeps the GIL: the worker's own threads stop too
    elif fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault == "kill_worker":  # the case runs in a child of the worker (harness.runner.casechild)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(3600)
    elif fault == "kill_controller":
        time.sleep(2)  # the controller has noted the case as in flight
        os.kill(_controller(), signal.SIGKILL)
        time.sleep(3600)
    elif fault == "orphan":
        code = (f"import os, time; open({ORPHAN_PIDS!r}, 'a').write(str(os.getpid()) + '\\n'); "
                "time.sleep(3600)")
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        time.sleep(1)
    elif fault == "grad_off":
        import torch

        torch.set_grad_enabled(False)
    elif fault in RAISES:
        raise RAISES[fault]()
    elif fault == "allocate":
        hoard = []
        while True:  # bounded by the worker's memory bound (--max-rss)
            hoard.append(bytearray(64 << 20))
    elif fault == "allocate_tensor":
        import torch

        torch.empty(4 << 30, dtype=torch.uint8).fill_(1)  # 4 GiB at once, as a case with a runaway shape
