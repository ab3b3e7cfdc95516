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
from typing import Any

from harness.errors import UsageError

PATCHES_DIR = Path(__file__).resolve().parents[2] / "patches"
NAME = r"[A-Za-z0-9_.-]+"
FUSER = "transformer_engine/pytorch/ops/fuser.py"
MARKER_KEYS = {"file", "pattern", "means"}
PATCH_KEYS = {"description", "patch", "fixes", "recognise"}


@dataclass(frozen=True)
class Marker:
    """A file and pattern that show a tree already has a fix in another form."""

    file: str
    pattern: str
    means: str

    def found_in(self, tree: Path) -> bool:
        path = inside(tree, self.file, "marker file")
        return path.is_file() and re.search(self.pattern, path.read_text(errors="replace"), re.MULTILINE) is not None


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    description: str
    fixes: tuple[str, ...] = ()
    markers: tuple[Marker, ...] = ()

    @property
    def text(self) -> bytes:
        return self.path.read_bytes()

    # The first marker, for readers of the single-marker format.
    @property
    def marker_file(self) -> str | None:
        return self.markers[0].file if self.markers else None

    @property
    def marker_pattern(self) -> str | None:
        return self.markers[0].pattern if self.markers else None

    @property
    def marker_means(self) -> str | None:
        return self.markers[0].means if self.markers else None


def available_patches(patches_dir: Path = PATCHES_DIR) -> list[str]:
    return sorted(p.stem for p in patches_dir.glob("*.toml"))


def is_patch_name(name: str, patches_dir: Path = PATCHES_DIR) -> bool:
    return re.fullmatch(NAME, name) is not None and (patches_dir / f"{name}.toml").is_file()


def inside(tree: Path, relative: str, what: str) -> Path:
    """`tree / relative`, refused when it is absolute, climbs out or resolves outside `tree`."""
    if not isinstance(relative, str) or not relative or Path(relative).is_absolute() or ".." in Path(relative).parts:
        raise UsageError(f"{what} {relative!r} refused: give a path relative to the tree, without '..'")
    path = tree / relative
    if path.exists() and not path.resolve().is_relative_to(tree.resolve()):
        raise UsageError(f"{what} {relative!r} refused: it resolves to {path.resolve()}, outside the tree")
    return path


def parse_markers(raw: Any, where: str) -> tuple[Marker, ...]:
    """Markers from TOML: one table or an array of tables, each with file, pattern and means."""
    tables = [raw] if isinstance(raw, dict) else raw
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{where}: markers must be tables with keys file, pattern, means")
    markers = []
    for table in tables:
        if set(table) != MARKER_KEYS or not all(isinstance(v, str) and v for v in table.values()):
            raise UsageError(f"{where}: a marker needs exactly the string keys file, pattern, means; "
                             f"got {sorted(table)}")
        try:
            re.compile(table["pattern"])
        except re.error as exc:
            raise UsageError(f"{where}: marker pattern {table['pattern']!r} is not a regular expression "
                             f"({exc})") from None
        inside(Path("/nonexistent-tree"), table["file"], f"{where}: marker file")
        markers.append(Marker(table["file"], table["pattern"], table["means"]))
    return tuple(markers)


def read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{what} {path} is not valid TOML ({exc})") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path} ({exc.strerror})") from None


def load_patch(name: str, patches_dir: Path = PATCHES_DIR) -> Patch:
    """A patch and its .toml: `description`, `patch` (a file in patches/), `fixes` (the
    regression ids it fixes) and `[[recognise]]` markers (the older single `[recognise]`
    table is read too). Anything else, or anything pointing outside patches/, is refused."""
    meta_path = patches_dir / f"{name}.toml"
    if not is_patch_name(name, patches_dir):
        valid = ", ".join(available_patches(patches_dir)) or "none"
        raise UsageError(f"unknown patch {name!r}; valid patches: {valid}")
    if meta_path.is_symlink():
        raise UsageError(f"patch {name} refused: {meta_path.name} is a symlink")
    meta = read_toml(meta_path, "patch description")
    where = f"patch {meta_path.name}"
    if unknown := set(meta) - PATCH_KEYS:
        raise UsageError(f"{where}: unknown keys {sorted(unknown)}; valid keys: {', '.join(sorted(PATCH_KEYS))}")
    fixes = meta.get("fixes", [])
    if not isinstance(fixes, list) or not all(isinstance(f, str) and re.fullmatch(NAME, f) for f in fixes):
        raise UsageError(f"{where}: fixes must be a list of regression ids, e.g. fixes = [\"issue22\"]")
    patch_file = meta.get("patch", f"{name}.patch")
    description = meta.get("description", "")
    if not isinstance(patch_file, str) or not isinstance(description, str):
        raise UsageError(f"{where}: description and patch must be strings")
    patch = Patch(
        name=name,
        path=inside(patches_dir, patch_file, f"{where}: patch file"),
        description=description,
        fixes=tuple(fixes),
        markers=parse_markers(meta.get("recognise", []), where),
    )
    check_patch_file(patch.path)
    return patch


def patches_fixing(regression: str) -> list[Patch]:
    return [p for p in map(load_patch, available_patches()) if regression in p.fixes]


_PATH_LINE = re.compile(r"^(?:--- |\+\+\+ |diff --git |rename (?:from|to) |copy (?:from|to) )(.*)$")
_UNSAFE = (
    (re.compile(r"^(?:GIT binary patch|Binary files .* differ)", re.MULTILINE), "it is a binary patch"),
    (re.compile(r"^(?:new file mode|old mode|new mode|deleted file mode|index \S+) ?120000", re.MULTILINE),
     "it creates or changes a symlink"),
)


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


def deleted_paths(patch_text: str) -> list[str]:
    """Paths a diff deletes or renames away: `--- a/X` followed by `+++ /dev/null`, or `rename from X`."""
    lines = patch_text.splitlines()
    gone = [re.sub(r"^a/", "", lines[i][4:].split("\t")[0]) for i in range(len(lines) - 1)
            if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ /dev/null")]
    return gone + [line[len("rename from "):] for line in lines if line.startswith("rename from ")]


def check_patch_file(path: Path) -> None:
    """Refuse a patch that is not a regular UTF-8 text file in its place, names an absolute
    path or climbs out of the tree, is binary, touches symlinks, or deletes fuser.py."""
    if not path.is_file():
        raise UsageError(f"patch file {path} does not exist")
    if path.is_symlink():
        raise UsageError(f"patch {path.name} refused: it is a symlink")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"patch {path.name} refused: it is not UTF-8 text") from None
    for pattern, why in _UNSAFE:
        if pattern.search(text):
            raise UsageError(f"patch {path.name} refused: {why}")
    for touched in touched_paths(text):
        if touched.startswith("/") or ".." in Path(touched).parts:
            raise UsageError(f"patch {path.name} refused: it touches {touched!r}, outside the source tree")
    if FUSER in deleted_paths(text):
        raise UsageError(f"patch {path.name} refused: it deletes {FUSER}, the code under test")


check_patch_paths = check_patch_file  # the earlier name


def _git_apply(tree: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    # The ceiling keeps git from treating an enclosing repository as the tree.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    return subprocess.run(
        ["git", "apply", *flags, str(patch)], cwd=tree, capture_output=True, text=True, check=False, env=env
    )


def apply_patch(tree: Path, patch: Patch, extra_markers: tuple[Marker, ...] = ()) -> tuple[str, str]:
    """Apply `patch` to `tree` in place; return (status, detail). `extra_markers` are a
    fork's own markers for the regressions the patch fixes."""
    if _git_apply(tree, patch.path, "--check").returncode == 0:
        result = _git_apply(tree, patch.path)
        if result.returncode != 0:
            return "conflict", result.stderr.strip()
        check_applied_tree(tree, patch)
        return "applied", "applied cleanly with git apply"
    if _git_apply(tree, patch.path, "--check", "--reverse").returncode == 0:
        return "already-applied", "recognised because the patch reverse-applies"
    for marker in (*patch.markers, *extra_markers):
        if marker.found_in(tree):
            return "already-applied", f"recognised by marker: {marker.means}"
    failure = _git_apply(tree, patch.path, "--check", "--verbose")
    return "conflict", (failure.stderr or failure.stdout).strip()


def check_applied_tree(tree: Path, patch: Patch) -> None:
    """After `git apply`: the copy holds no symlink and still has fuser.py as a file."""
    for path in tree.rglob("*"):
        if path.is_symlink():
            raise UsageError(f"patch {patch.name} refused: applying it left a symlink {path.relative_to(tree)}")
    if not (tree / FUSER).is_file():
        raise UsageError(f"patch {patch.name} refused: applying it removed {FUSER}")
