"""The environment upstream's CI gives the fuser tests at a revision, read from the checkout.

Upstream's L0 job (`qa/L0_pytorch_unittest/test.sh`) runs `tests/pytorch/test_fusible_ops.py`
with variables set on its command line at some tags (v2.16: `NVTE_GROUPED_LINEAR_SINGLE_PARAM=1
NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 python3 -m pytest ... test_fusible_ops.py`); without them the
same tests run other code paths than upstream ran them on. The script is read, never run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

CI_SCRIPT = "qa/L0_pytorch_unittest/test.sh"
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def ci_environment(script: Path, test_file: str = "tests/pytorch/test_fusible_ops.py") -> tuple[dict[str, str], str]:
    """The variables the script sets on the command that runs `test_file`, and where it says so
    (`qa/...test.sh:LINE`, or why there is nothing)."""
    if not script.is_file():
        return {}, f"no {CI_SCRIPT} in the checkout"
    for number, line in enumerate(script.read_text(errors="replace").splitlines(), 1):
        if "pytest" not in line or not re.search(rf"(^|[/$\s}}]){re.escape(test_file)}\b", line):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        env = {}
        for word in words:
            if not _ASSIGNMENT.match(word):
                break
            name, value = word.split("=", 1)
            env[name] = value
        return env, f"{CI_SCRIPT}:{number}"
    return {}, f"{CI_SCRIPT} does not run {test_file}"
