"""Why an upstream test failed on the CPU backend, in one line, read from pytest's junit XML.

Pure functions of what pytest wrote (the failure's message and text, and the warnings the
test raised, which `upstream_selection` records as properties), computed in the `repro`
process, outside the target's. The classes, most specific first:
- needs FP8: a quantization kernel was called (a quantized variant upstream does not skip on
  a device without FP8);
- missing kernel: a compiled kernel the CPU backend has no stand-in for, with TE's caller;
- device call: CUDA was reached where the test asked for the CPU;
- CPU autocast: torch's CPU autocast refused the dtype the test asked for (a GPU's takes it);
- tolerance: upstream's own comparison found values beyond its tolerance;
- difference: anything else, with the exception's first line.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

NO_CUDA = "Torch not compiled with CUDA enabled"
CPU_AUTOCAST = "CPU Autocast only supports"
_MISSING = re.compile(r"(transformer_engine/\S+:\d+) in \S+ called the compiled kernel (\S+), which has no CPU stand-in")
_FP8_KERNEL = re.compile(r"quantize|fp8|mxfp8|nvfp4|amax|cast_to", re.IGNORECASE)
_MISMATCH = re.compile(r"Mismatched elements: [^\n]*")


@dataclass(frozen=True)
class Failure:
    test: str
    reason: str


def explain(message: str, text: str, warnings: list[str]) -> str:
    """The one-line reason for one failed test."""
    missing = _MISSING.search(message) or _MISSING.search(text)
    if missing:
        where, kernel = missing.groups()
        kind = "needs FP8" if _FP8_KERNEL.search(kernel.rsplit(".", 1)[-1]) else "missing kernel"
        return f"{kind}: {kernel} has no CPU stand-in (called at {where})"
    if NO_CUDA in message or NO_CUDA in text:
        return "device call: the test reached CUDA where it asked for the CPU"
    refused = next((w for w in warnings if CPU_AUTOCAST in w), None)
    if refused:
        return f"CPU autocast: torch's CPU autocast refused the test's dtype ({refused.strip().splitlines()[0]})"
    if "Tensor-likes are not close" in message or "Tensor-likes are not close" in text:
        mismatch = _MISMATCH.search(text) or _MISMATCH.search(message)
        return "tolerance: values beyond upstream's tolerance" + (f" ({mismatch.group(0)})" if mismatch else "")
    first = (message.strip().splitlines() or ["(no message)"])[0]
    return f"difference: {first[:200]}"


def failures(junit: Path) -> list[Failure]:
    """Each failed or erroring test of a junit XML file, with its reason."""
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            continue
        warnings = [p.get("value", "") for p in case.iter("property") if p.get("name") == "warning"]
        found.append(Failure(_name(case), explain(problem.get("message", ""), problem.text or "", warnings)))
    return found


def outcomes(junit: Path) -> dict[str, str]:
    """Each test of a junit XML file -> passed, failed or skipped (an error counts as failed)."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        found[_name(case)] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds
                              else "passed")
    return found


def _name(case: ET.Element) -> str:
    """`Class::test[params]`, as pytest's node id ends (junit's classname is dotted)."""
    return f"{case.get('classname', '')}::{case.get('name', '')}".rsplit(".", 1)[-1]


def skips(junit: Path) -> list[Failure]:
    """Each skipped test of a junit XML file, with the reason pytest gave (upstream's own, or the
    selection plugin's "needs CUDA")."""
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            reason = (skipped.get("message") or "(no reason)").strip().splitlines()[0]
            found.append(Failure(_name(case), reason.removeprefix("Skipped: ")[:200]))
    return found


def by_reason(found: list[Failure]) -> list[tuple[str, int, str]]:
    """(reason, count, one test) per reason, most frequent first."""
    counts = Counter(f.reason for f in found)
    example = {f.reason: f.test for f in reversed(found)}
    return [(reason, n, example[reason]) for reason, n in counts.most_common()]
