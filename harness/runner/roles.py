"""A target's role for one regression: what its results are expected to be.

Decided from what the target is, never from its name: a `+patch` that declares it fixes
the regression; a fix marker found in the tree (a patch's markers for that regression,
or the fork's own); else the release version against the regression's affected releases
(specifier sets, cases/releases.py); else unknown.
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
    return release_role(regression, version)


def release_role(regression: Regression, version: Version) -> tuple[Role, str]:
    """A release's role from the regression's affected releases (specifier sets)."""
    affected = regression.affected
    if affected.contains(version):
        return Role.UNPATCHED, f"release {version} is in the affected releases {affected}"
    if affected.predates(version):
        return Role.PREDATES, f"release {version} predates the affected releases {affected}"
    return Role.FIXED_UPSTREAM, f"release {version} is outside the affected releases {affected}"
