"""Test-only fault injection: prove the runner survives a case that kills, hangs or
exhausts its worker. Inert unless REPRO_TEST_INJECT_FAULTS names cases, as JSON
{"<case_id>": "segfault" | "exit" | "hang" | "allocate"}; only the fault tests set it."""

from __future__ import annotations

import ctypes
import json
import os
import time

ENV = "REPRO_TEST_INJECT_FAULTS"


def inject_if_asked(case_id: str) -> None:
    raw = os.environ.get(ENV)
    if not raw:
        return
    fault = json.loads(raw).get(case_id)
    if fault == "segfault":
        ctypes.string_at(0)
    elif fault == "exit":
        os._exit(3)
    elif fault == "hang":
        time.sleep(3600)
    elif fault == "allocate":
        hoard = []
        while True:  # bounded by the address-space limit the test sets (RLIMIT_AS)
            hoard.append(bytearray(64 << 20))
