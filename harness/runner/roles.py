"""A target's role for one regression: what its results are expected to be.

Decided from what the target is, never from its name: a `+patch` that declares it fixes
the regression; a fix marker found in the tree (a patch's markers for that regression,
or the fork's own); else the release version against the regression's first affected
and first fixed releases; else unknown.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import InvalidVersion, Version

from cases.regression import Regression
from harness.model import Role
from harness.targets import PreparedTarget
from harness.targets.patching import Marker, load_patch, patches_fixing


def _markers(regression: Regression, prepared: PreparedTarget) -> list[Marker]:
    ours = [m for patch in patches_fixing(regression.id) for m in patch.markers]
    forks = [Marker(m["file"], m["pattern"], m.get("means", m["pattern"]))
             for m in (getattr(prepared, "fix_markers", None) or {}).get(regression.id, [])]
    return ours + forks


def role_of(regression: Regression, prepared: PreparedTarget) -> tuple[Role, str]:
    """The role and the one-line reason for it."""
    applied = prepared.patch and prepared.patch_status in ("applied", "already-applied")
    if applied and regression.id in load_patch(prepared.patch).fixes:  # type: ignore[arg-type]
        return Role.PATCHED, f"patch {prepared.patch} declares it fixes {regression.id} ({prepared.patch_status})"
    tree = Path(prepared.root) if prepared.root else None
    for marker in _markers(regression, prepared) if tree else []:
        if marker.found_in(tree):  # type: ignore[arg-type]
            return Role.FIXED_UPSTREAM, f"fix recognised in the tree: {marker.means}"
    try:
        version = Version(prepared.version)
    except InvalidVersion:
        return Role.UNKNOWN, f"version {prepared.version!r} is not a release number and no fix marker matched"
    if regression.first_fixed and version >= Version(regression.first_fixed):
        return Role.FIXED_UPSTREAM, f"release {version} is at or after the first fixed release {regression.first_fixed}"
    if regression.first_affected and version < Version(regression.first_affected):
        return Role.PREDATES, f"release {version} predates the first affected release {regression.first_affected}"
    return Role.UNPATCHED, (f"release {version} is before the first fixed release {regression.first_fixed}"
                            if regression.first_fixed else f"no release fixes {regression.id} yet")
