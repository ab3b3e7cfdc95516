"""Test-only fault injection, loaded into the target sessions through PYTEST_PLUGINS
(pytest's own environment variable): it implements the runner's
`pytest_repro_case_started` hook and kills, hangs or exhausts the worker on the cases
named in REPRO_TEST_INJECT_FAULTS, as JSON {"<case_id>": "segfault" | "exit" | "hang" |
"stuck" | "allocate"}; "stuck" hangs deaf to the per-case alarm, as a case spinning in C
code would. Production code never imports this module."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import time

ENV = "REPRO_TEST_INJECT_FAULTS"
PLUGIN = "tests.fault_plugin"


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
    elif fault == "allocate":
        hoard = []
        while True:  # bounded by the address-space limit the test sets (RLIMIT_AS)
            hoard.append(bytearray(64 << 20))
