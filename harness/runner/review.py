"""What an upstream-sync review runs: the base and head trees, each also with every patch of
patches/ that fixes a regression of the matrix and applies to it, and each such patch
assessed against both trees (its text, and the fix found there)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.targets import PreparedTarget
from harness.targets.patching import APPLIES, Marker, assess, available_patches, load_patch


def patch_assessments(prepared: PreparedTarget, regressions: list[str]) -> list[dict[str, Any]]:
    """Each patch fixing one of `regressions`, against the tree: the two parts and the advice."""
    found = []
    for name in available_patches():
        patch = load_patch(name)
        if not set(patch.fixes) & set(regressions) or not prepared.root:
            continue
        forks = tuple(Marker(m["file"], m["pattern"], m.get("means", m["pattern"]))
                      for fix in patch.fixes for m in (prepared.fix_markers or {}).get(fix, []))
        part = assess(Path(prepared.root), patch, forks)
        found.append({"patch": name, "fixes": list(patch.fixes), **asdict(part), "advice": part.advice(name)})
    return found


def review_specs(base: str, head: str, assessed: dict[str, list[dict[str, Any]]]) -> list[str]:
    """base, head, then each with every patch whose text applies to it."""
    patched = [f"{spec}+{a['patch']}" for spec in (base, head) for a in assessed[spec] if a["text"] == APPLIES]
    return [base, head, *patched]


def patched_regressions(specs: list[str], assessed: dict[str, list[dict[str, Any]]]) -> dict[str, set[str]]:
    """A patched variant runs only the regressions its patch fixes; base and head run every one."""
    found = {}
    for tree, assessments in assessed.items():
        for a in assessments:
            if f"{tree}+{a['patch']}" in specs:
                found[f"{tree}+{a['patch']}"] = set(a["fixes"])
    return found
