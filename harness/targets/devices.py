"""The small device interface: availability, synchronisation, memory. (Megatron's CUDA
calls are pointed at the CPU in harness/megatron/cpu_redirects.py.)

Availability is probed in a subprocess with TORCH_DEVICE_BACKEND_AUTOLOAD=0, since a
torch_npu without CANN makes `import torch` itself fail (DESIGN.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache

import torch

_PROBE = r"""
import json, sys
out = {"cpu": None}
try:
    import torch
except Exception as exc:
    print(json.dumps({"cpu": f"import torch failed: {exc}", "cuda": "torch did not import", "npu": "torch did not import"}))
    sys.exit()
out["cuda"] = None if torch.cuda.is_available() else "torch.cuda.is_available() is False"
try:
    import torch_npu  # noqa: F401
    out["npu"] = None if torch.npu.is_available() else "torch_npu imported but torch.npu.is_available() is False"
except Exception as exc:
    out["npu"] = f"torch_npu does not load: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
print(json.dumps(out))
"""


@cache
def unavailable_reasons() -> dict[str, str | None]:
    """device -> None when usable, else the exact reason it is not."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False, env=env, timeout=120)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        reason = (result.stderr.strip().splitlines() or ["device probe gave no output"])[-1]
        return {"cpu": None, "cuda": reason, "npu": reason}


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]

