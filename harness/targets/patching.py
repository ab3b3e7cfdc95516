"""Apply a backport from patches/ to a copy of a target's source, with `git apply`.

The result is exactly one status:
- `applied`: the patch applied cleanly;
- `already-applied`: the source already has the fix, recognised either because the
  patch reverse-applies or, where upstream's fix has another form, by the marker the
  patch declares in its .toml;
- `conflict`: neither; the detail holds git's report of the failing hunk.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError

PATCHES_DIR = Path(__file__).resolve().parents[2] / "patches"


@dataclass(frozen=True)
class Marker:
    """Recognises a fix of another shape than the patch: a pattern in one file of the tree."""

    file: str
    pattern: str
    means: str

    def found_in(self, tree: Path) -> bool:
        path = tree / self.file
        return path.is_file() and re.search(self.pattern, path.read_text(errors="replace"), re.MULTILINE) is not None


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    description: str
    fixes: tuple[str, ...]  # the ids of the regressions it fixes
    markers: tuple[Marker, ...]

    @property
    def text(self) -> bytes:
        return self.path.read_bytes()


def available_patches() -> list[str]:
    return sorted(p.stem for p in PATCHES_DIR.glob("*.toml"))


def load_patch(name: str, patches_dir: Path = PATCHES_DIR) -> Patch:
    meta_path = patches_dir / f"{name}.toml"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not meta_path.is_file():
        valid = ", ".join(available_patches()) or "none"
        raise UsageError(f"unknown patch {name!r}; valid patches: {valid}")
    try:
        meta = tomllib.loads(meta_path.read_text())
        markers = tuple(Marker(m["file"], m["pattern"], m.get("means", m["pattern"])) for m in meta.get("recognise", []))
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise UsageError(f"patch description {meta_path.name} is malformed ({exc}); it needs description, patch, "
                         "fixes = [regression ids] and [[recognise]] tables with file and pattern") from None
    patch = Patch(
        name=name,
        path=patches_dir / meta.get("patch", f"{name}.patch"),
        description=meta.get("description", ""),
        fixes=tuple(meta.get("fixes", ())),
        markers=markers,
    )
    check_patch_paths(patch.path)
    return patch


def patches_fixing(regression: str) -> list[Patch]:
    return [p for p in map(load_patch, available_patches()) if regression in p.fixes]


_PATH_LINE = re.compile(r"^(?:--- |\+\+\+ |diff --git |rename (?:from|to) |copy (?:from|to) )(.*)$")


def touched_paths(patch_text: str) -> list[str]:
    """Every path a unified or git diff names, with its a/ or b/ prefix removed."""
    paths = []
    for line in patch_text.splitlines():
        match = _PATH_LINE.match(line)
        if not match:
            continue
        for token in match.group(1).split("\t")[0].split(" "):
            if token and token != "/dev/null":
                paths.append(re.sub(r"^[ab]/", "", token))
    return paths


def check_patch_paths(path: Path) -> None:
    """Refuse a patch that names an absolute path or climbs out of the tree."""
    if not path.is_file():
        raise UsageError(f"patch file {path} does not exist")
    for touched in touched_paths(path.read_text()):
        if touched.startswith("/") or ".." in Path(touched).parts:
            raise UsageError(f"patch {path.name} refused: it touches {touched!r}, outside the source tree")


def _git_apply(tree: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    # The ceiling keeps git from treating an enclosing repository as the tree.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    return subprocess.run(
        ["git", "apply", *flags, str(patch)], cwd=tree, capture_output=True, text=True, check=False, env=env
    )


def apply_patch(tree: Path, patch: Patch) -> tuple[str, str]:
    """Apply `patch` to `tree` in place; return (status, detail)."""
    if _git_apply(tree, patch.path, "--check").returncode == 0:
        result = _git_apply(tree, patch.path)
        if result.returncode != 0:
            return "conflict", result.stderr.strip()
        return "applied", "applied cleanly with git apply"
    if _git_apply(tree, patch.path, "--check", "--reverse").returncode == 0:
        return "already-applied", "recognised because the patch reverse-applies"
    for marker in patch.markers:
        if marker.found_in(tree):
            return "already-applied", f"recognised by marker: {marker.means}"
    failure = _git_apply(tree, patch.path, "--check", "--verbose")
    return "conflict", (failure.stderr or failure.stdout).strip()
