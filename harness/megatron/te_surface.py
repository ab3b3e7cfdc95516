"""TE as Megatron sees it, on a loaded CPU-backend target: TE's own package, nothing stood in.

Megatron imports TE at module level (it subclasses `te.pytorch.Linear`, `LayerNormLinear`,
`RMSNorm`, reads `__version__`, the FP8 state, the distributed RNG tracker, the router's
fused functions) and probes about 30 more names inside `try/except ImportError` or
`hasattr`. With the whole package loaded as shipped (harness/targets/loader.py) every one of
them resolves to TE's own code; only the compiled extension under it is stood in, and a
kernel without a stand-in says so when it is called. What is checked here is what Megatron
needs to decide at import: a readable TE version (`is_te_min_version`).
"""

from __future__ import annotations

import sys

from packaging.version import InvalidVersion, Version

from harness.errors import TargetLoadError
from harness.targets.loader import LoadedTarget


def install(target: LoadedTarget) -> list[str]:
    """Check TE before Megatron is imported; returns the TE modules Megatron will find."""
    try:
        Version(sys.modules["transformer_engine"].__version__)
    except (InvalidVersion, AttributeError, KeyError):
        raise TargetLoadError(f"target {target.prepared.spec}: Megatron reads TE's version, and this tree has none "
                              "(no VERSION.txt or dist-info); give it one in the fork config:"
                              ' version = "X.Y.Z"') from None
    return sorted(n for n in sys.modules if n.startswith("transformer_engine.pytorch.") and n.count(".") == 2)
