"""A target's role for one regression: what its results are expected to be.

Decided from what the target is, never from its name: a `+patch` that declares it fixes
the regression and applies (or is in the tree); what the user declared (`[expect]` in the
fork config); the fix found in the tree (an upstream marker, the fork's own, or our patch
in the tree); else the release version against the regression's affected releases
(specifier sets, cases/releases.py). A version that is not a release (`2.16.0.dev0`, a
fork's `2.14.0+npu`) decides only where its number settles it (see `unreleased`): else
unknown, never guessed unpatched.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import InvalidVersion, Version

from cases.regression import Regression
from harness.model import Role
from harness.targets import PreparedTarget
from harness.targets.patching import APPLIES, FIX_NONE, FIX_OURS, IN_TREE, Marker, assess, load_patch, patches_fixing


def _fork_markers(regression: Regression, prepared: PreparedTarget) -> tuple[Marker, ...]:
    """The fork config's own fix markers for the regression."""
    return tuple(Marker(m["file"], m["pattern"], m.get("means", m["pattern"]))
                 for m in (getattr(prepared, "fix_markers", None) or {}).get(regression.id, []))


def declared_role(regression: Regression, prepared: PreparedTarget) -> tuple[Role, str] | None:
    """The role the user declared in the fork config's `[expect]`, or None. A tree declared
    fixed is judged as one that must pass: reproducing there is a regression."""
    expected = (getattr(prepared, "expectations", None) or {}).get(regression.id)
    if expected is None:
        return None
    config = Path(prepared.fork_config or ".te-repro.toml")
    own = prepared.root and config.parent == Path(prepared.root)
    source = "the tree's .te-repro.toml" if own else str(config)
    where = f'[expect] {regression.id} = "{expected}" in {source}'
    if expected == "affected":
        return Role.UNPATCHED, f"declared affected: {where}"
    found = fix_in_tree(regression, prepared)
    role = Role.PATCHED if found and found[0] is Role.PATCHED else Role.FIXED_UPSTREAM
    return role, f"declared fixed: {where}" + (f"; {found[1]}" if found else "; no fix recognised in the tree")


def fix_in_tree(regression: Regression, prepared: PreparedTarget) -> tuple[Role, str] | None:
    """The fix found in the tree, from each patch that fixes the regression (its upstream
    markers, our patch reverse-applying) and the fork's own markers; None when not found."""
    if not prepared.root or not (tree := Path(prepared.root)).is_dir():
        return None
    forks = _fork_markers(regression, prepared)
    found = [(patch.name, assess(tree, patch, forks)) for patch in patches_fixing(regression.id)]
    if not found and (hit := next((m for m in forks if m.found_in(tree)), None)):
        return Role.FIXED_UPSTREAM, f"fix recognised in the tree: fork marker: {hit.means}"
    for name, part in sorted(found, key=lambda f: f[1].fix == FIX_OURS):
        if part.fix == FIX_OURS:
            return Role.PATCHED, f"our patch {name} is in the tree ({part.fix_detail})"
        if part.fix != FIX_NONE:
            return Role.FIXED_UPSTREAM, f"fix recognised in the tree: {part.fix}: {part.fix_detail}"
    return None


def unreleased(regression: Regression, prepared: PreparedTarget, version: Version) -> tuple[Role, str] | None:
    """A tree whose version is not a release: every upstream commit between two releases
    reads the next one's .dev0, and a fork may add its own local part (`2.14.0+npu`).
    Unknown where the number cannot tell: a development number near a bound of the
    affected releases, or a fork of an affected release (it may carry a fix no marker
    knows). Elsewhere the release it stands for decides (a fork of 2.14.0 has 2.5.0's fix)."""
    if prepared.kind == "wheel" or not (version.is_prerelease or version.local is not None):
        return None
    affected = regression.affected
    if not affected.settles(version) or (affected.contains(version) and not version.is_prerelease):
        return Role.UNKNOWN, (f"version {version} is not a release and nothing else says whether the tree has the"
                              " fix; declare it with [expect] in the fork config")
    role, why = release_role(regression, version, noun="version")
    if role is Role.UNPATCHED:  # a commit on the way to a release the regression is in, fix not recognised
        return role, why + ", and no fix was recognised in the tree"
    return role, why


def role_of(regression: Regression, prepared: PreparedTarget) -> tuple[Role, str]:
    """The role and the one-line reason for it."""
    carried = prepared.patch and getattr(prepared, "patch_text", "") in ("", APPLIES, IN_TREE)
    applied = carried and prepared.patch_status in ("applied", "already-applied")
    if applied and regression.id in load_patch(prepared.patch).fixes:  # type: ignore[arg-type]
        return Role.PATCHED, f"patch {prepared.patch} declares it fixes {regression.id} ({prepared.patch_status})"
    if found := declared_role(regression, prepared) or fix_in_tree(regression, prepared):
        return found
    try:
        version = Version(prepared.version)
    except InvalidVersion:
        return Role.UNKNOWN, f"version {prepared.version!r} is not a release number and no fix marker matched"
    if found := unreleased(regression, prepared, version):
        return found
    return release_role(regression, version)


def release_role(regression: Regression, version: Version, noun: str = "release") -> tuple[Role, str]:
    """A release's role from the regression's affected releases (specifier sets); `noun` names
    `version` in the reason ("version" for a number that is not a release)."""
    affected = regression.affected
    if affected.contains(version):
        return Role.UNPATCHED, f"{noun} {version} is in the affected releases {affected}"
    if affected.predates(version):
        return Role.PREDATES, f"{noun} {version} predates the affected releases {affected}"
    return Role.FIXED_UPSTREAM, f"{noun} {version} is outside the affected releases {affected}"


def predates_all(regressions: list[Regression], version: str) -> bool:
    """Whether a release comes before every one of these regressions (its patches are not needed)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return bool(regressions) and all(r.affected.predates(parsed) for r in regressions)
