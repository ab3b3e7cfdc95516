"""Apply a backport from patches/ to a copy of a target's source, with `git apply`.

A patch against a tree is assessed in two parts (`assess`):
- the patch text: `applies`, `in the tree` (it reverse-applies), `stale` (neither, and the
  fix is in the tree in another form: upstream moved the code) or `conflict` (neither, and
  no fix found), the last two with git's failing hunk and line;
- the fix: recognised by an upstream marker (a marker of the patch's .toml that the patch
  does not itself add, so upstream's fix and our backport are told apart), by a fork's own
  marker, by our patch being in the tree, by a marker our patch also adds, or not found.

Applying gives the one status the loader needs: `applied`, `already-applied` (in the tree,
or stale with the fix present: the tree runs as it is) or `conflict`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from harness.errors import UsageError
from harness.targets.safegit import isolated_environment

PATCHES_DIR = Path(__file__).resolve().parents[2] / "patches"
NAME = r"[A-Za-z0-9_.-]+"
FUSER = "transformer_engine/pytorch/ops/fuser.py"
MARKER_KEYS = {"file", "pattern", "means"}
PATCH_KEYS = {"description", "patch", "fixes", "recognise"}
MARKER_TIMEOUT_S = 2.0  # a marker search takes milliseconds on a file of TE's size


@dataclass(frozen=True)
class Marker:
    """A file and pattern that show a tree already has a fix in another form."""

    file: str
    pattern: str
    means: str

    def found_in(self, tree: Path) -> bool:
        path = inside(tree, self.file, "marker file")
        return path.is_file() and self.matches(path.read_text(errors="replace"))

    def matches(self, text: str) -> bool:
        """Whether `text` holds the pattern; a pattern that backtracks past the time bound (a
        fork config is anyone's input) is refused in one line, never a hang."""
        try:
            return regex.search(self.pattern, text, regex.MULTILINE, timeout=MARKER_TIMEOUT_S) is not None
        except TimeoutError:
            raise UsageError(f"marker pattern {self.pattern!r} ({self.means}) took over {MARKER_TIMEOUT_S:g} s on "
                             f"{self.file}: it backtracks without bound; write it without nested repeats "
                             "such as (a+)+ or (a|a)*") from None


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
            regex.compile(table["pattern"])
        except regex.error as exc:
            raise UsageError(f"{where}: marker pattern {table['pattern']!r} is not a regular expression "
                             f"({exc})") from None
        inside(Path("/nonexistent-tree"), table["file"], f"{where}: marker file")
        markers.append(Marker(table["file"], table["pattern"], table["means"]))
    return tuple(markers)


TOML_MAX_BYTES = 32 * 1024  # what a target's sessions are handed travels in one argv string (128 KiB at most)


def read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        data = path.read_bytes()
        if len(data) > TOML_MAX_BYTES:
            raise UsageError(f"{what} {path} is {len(data) // 1024} KiB; it may be at most {TOML_MAX_BYTES // 1024} KiB")
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{what} {path} is not valid TOML ({exc})") from None
    except RecursionError:
        raise UsageError(f"{what} {path} nests arrays or tables too deep to read; write it flat") from None
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
    """`git apply FLAGS patch` on `tree`. A check runs in a scratch copy of the files the patch
    touches, so git never reads the user's tree (its attributes and config could name a clean
    filter); applying is only ever done to the harness's own staged copy."""
    if "--check" not in flags:
        return _run_git_apply(tree, patch, flags)
    with tempfile.TemporaryDirectory(prefix="repro-apply-check-") as scratch:
        copy = Path(scratch) / "tree"
        copy.mkdir()
        for relative in set(touched_paths(patch.read_text(encoding="utf-8", errors="replace"))):
            source = tree / relative
            if relative.startswith("/") or ".." in Path(relative).parts or not source.is_file():
                continue
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / relative, follow_symlinks=False)
        return _run_git_apply(copy, patch, flags)


def _run_git_apply(tree: Path, patch: Path, flags: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    # No system or global config, and the ceiling keeps git from finding any repository around it.
    return subprocess.run(["git", "apply", *flags, str(patch.resolve())], cwd=tree, capture_output=True, text=True,
                          check=False, env=isolated_environment(tree.parent))


# What the two parts read; `advice` turns them into the reviewer's answer.
APPLIES, IN_TREE, STALE, CONFLICT = "applies", "in the tree", "stale", "conflict"
FIX_UPSTREAM, FIX_FORK, FIX_OURS, FIX_MARKER, FIX_NONE = (
    "upstream marker", "fork marker", "our patch in the tree", "marker our patch also adds", "not found")


@dataclass(frozen=True)
class Assessment:
    """The patch text against a tree, and whether the tree has the fix (see the module docstring)."""

    text: str
    text_detail: str
    fix: str
    fix_detail: str

    @property
    def status(self) -> str:
        """The single status of a patched copy: what the loader runs."""
        if self.text == APPLIES:
            return "applied"
        return "conflict" if self.text == CONFLICT else "already-applied"

    def advice(self, patch: str) -> str:
        """The sync reviewer's answer for this patch on this tree. A stale patch whose fix is
        recognised (even by a marker our patch also adds: our patch is not there, so the
        matching code is someone else's) can go."""
        found = {FIX_UPSTREAM: "upstream's fix", FIX_FORK: "the fork's own fix",
                 FIX_MARKER: "a fix in the form our patch has"}.get(self.fix)
        if self.text == STALE:
            return f"{found} is present and {patch} is stale: drop the backport"
        if self.text == IN_TREE and self.fix == FIX_UPSTREAM:
            return f"upstream's fix is present and {patch} is in the tree too: drop the backport"
        if self.text == IN_TREE:
            return f"{patch} is in the tree and upstream's fix is not: keep the backport"
        if self.text == APPLIES and found:
            return f"{found} is present, yet {patch} still applies: check by hand before applying or dropping it"
        if self.text == APPLIES:
            return f"{patch} is still needed and applies"
        return f"{patch} is still needed and conflicts: {self.text_detail}"


def added_lines(patch_text: str, file: str) -> list[str]:
    """The lines a diff adds to `file` (without their '+')."""
    lines, current = [], None
    for line in patch_text.splitlines():
        if line.startswith("+++ "):
            current = re.sub(r"^b/", "", line[4:].split("\t")[0])
        elif line.startswith("+") and current == file:
            lines.append(line[1:])
    return lines


def adds_marker(patch: Patch, marker: Marker) -> bool:
    """Whether the patch itself adds a line the marker matches: then the marker cannot tell
    our backport from upstream's fix."""
    added = "\n".join(added_lines(patch.text.decode("utf-8", "replace"), marker.file))
    return marker.matches(added)


def failing_hunk(patch: Patch, git_output: str, tree: Path) -> str:
    """git's failing hunk as one line: file:line, which hunk of the patch, and the first line
    git searched for that the file no longer has."""
    failed = re.search(r"^error: patch failed: (.+):(\d+)$", git_output, re.MULTILINE)
    if not failed:  # e.g. a file the patch changes is missing: git's last error line
        errors = [line for line in git_output.splitlines() if line.startswith("error:")] or ["git apply failed"]
        return errors[-1]
    file, line = failed.group(1), int(failed.group(2))
    text = patch.text.decode("utf-8", "replace")
    headers = [(m.group(0).split(" @@")[0] + " @@", int(m.group(1)))
               for m in re.finditer(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", _file_section(text, file), re.MULTILINE)]
    which = next((f"hunk {i} of {len(headers)} ({h})" for i, (h, start) in enumerate(headers, 1) if start == line),
                 "a hunk")
    searched = re.search(r"error: while searching for:\n(.*?)\n\nerror:", git_output, re.DOTALL)
    missing = ""
    if searched:
        target = tree / file
        have = {t.strip() for t in target.read_text(errors="replace").splitlines()} if target.is_file() else set()
        gone = next((t.strip() for t in searched.group(1).splitlines() if t.strip() and t.strip() not in have), None)
        missing = f"; the tree no longer has `{gone}`" if gone else "; its lines are in the tree, but not together as the hunk has them"
    return f"{which} fails at {file}:{line}{missing}"


def _file_section(text: str, file: str) -> str:
    """The part of a diff that changes `file`."""
    sections = re.split(r"^(?=diff --git |--- )", text, flags=re.MULTILINE)
    return "".join(s for s in sections if f"+++ b/{file}" in s or f"+++ {file}" in s) or text


def assess(tree: Path, patch: Patch, extra_markers: tuple[Marker, ...] = ()) -> Assessment:
    """The patch text against `tree` and the fix in it, without changing the tree.
    `extra_markers` are a fork's own markers for the regressions the patch fixes."""
    forward = _git_apply(tree, patch.path, "--check").returncode == 0
    reverse = not forward and _git_apply(tree, patch.path, "--check", "--reverse").returncode == 0
    found = [(FIX_MARKER if adds_marker(patch, m) else FIX_UPSTREAM, m) for m in patch.markers if m.found_in(tree)]
    found += [(FIX_FORK, m) for m in extra_markers if m.found_in(tree)]
    found.sort(key=lambda kind_marker: (FIX_UPSTREAM, FIX_FORK, FIX_MARKER).index(kind_marker[0]))
    if found and found[0][0] != FIX_MARKER:
        fix, fix_detail = found[0][0], found[0][1].means
    elif reverse:
        fix, fix_detail = FIX_OURS, "the patch reverse-applies"
    elif found:
        fix, fix_detail = FIX_MARKER, found[0][1].means
    else:
        fix, fix_detail = FIX_NONE, ""
    if forward:
        return Assessment(APPLIES, "applies cleanly with git apply", fix, fix_detail)
    if reverse:
        return Assessment(IN_TREE, "the patch reverse-applies", fix, fix_detail)
    failure = _git_apply(tree, patch.path, "--check", "--verbose")
    hunk = failing_hunk(patch, failure.stderr or failure.stdout, tree)
    return Assessment(STALE if fix != FIX_NONE else CONFLICT, hunk, fix, fix_detail)


def apply_patch(tree: Path, patch: Patch, extra_markers: tuple[Marker, ...] = ()) -> tuple[str, str]:
    """Apply `patch` to `tree` in place when it applies; return (status, detail)."""
    status, detail, _ = apply_assessed(tree, patch, extra_markers)
    return status, detail


def apply_assessed(tree: Path, patch: Patch,
                   extra_markers: tuple[Marker, ...] = ()) -> tuple[str, str, Assessment]:
    """Assess, then apply when the text applies; (status, one-line detail, assessment)."""
    found = assess(tree, patch, extra_markers)
    if found.text == APPLIES:
        result = _git_apply(tree, patch.path)
        if result.returncode != 0:
            return "conflict", result.stderr.strip(), found
        check_applied_tree(tree, patch)
        return "applied", "applied cleanly with git apply", found
    if found.text == CONFLICT:
        return "conflict", found.text_detail, found
    if found.text == IN_TREE:
        return "already-applied", "recognised because the patch reverse-applies", found
    return "already-applied", f"stale ({found.text_detail}); fix recognised by {found.fix}: {found.fix_detail}", found


def check_applied_tree(tree: Path, patch: Patch) -> None:
    """After `git apply`: the copy holds no symlink and still has fuser.py as a file."""
    for path in tree.rglob("*"):
        if path.is_symlink():
            raise UsageError(f"patch {patch.name} refused: applying it left a symlink {path.relative_to(tree)}")
    if not (tree / FUSER).is_file():
        raise UsageError(f"patch {patch.name} refused: applying it removed {FUSER}")
