"""Git on a user's repository with none of the repository's own commands running.

A repository's config can name commands that git runs on read-only operations: filter drivers
(`git archive` runs smudge, `git status` and `git apply` run clean), `core.fsmonitor` (status),
hooks, textconv and diff drivers, and gpg through `log.showSignature`. Every git call here
carries config of the highest precedence that turns each of them off (a caller that diffs also
passes --no-ext-diff, for `diff.external`), in an environment without the caller's GIT_*, and a revision is exported as the commit's exact blobs (`cat-file`, no filters,
no attributes), then checked against the commit's tree hash.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from harness.errors import UsageError

# Turned off in every call, whatever the repository says.
_OFF = {
    "core.fsmonitor": "false",
    "core.hooksPath": os.devnull,
    "core.attributesFile": os.devnull,
    "log.showSignature": "false",
    "status.submoduleSummary": "false",
    "diff.ignoreSubmodules": "all",
}
# The keys of a driver that name a command: `filter.<name>.clean` and the like.
_DRIVER_COMMANDS = {"filter": ("clean", "smudge", "process"), "diff": ("textconv", "command"),
                    "merge": ("driver",)}
_TIMEOUT_S = 120


def _environment(overrides: dict[str, str]) -> dict[str, str]:
    # The caller's own GIT_* (GIT_DIR, GIT_EXTERNAL_DIFF, ...) must not redirect or extend a call.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(GIT_OPTIONAL_LOCKS="0",  # read only: never refresh the user's index
               GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", GIT_CONFIG_COUNT=str(len(overrides)))
    for index, (key, value) in enumerate(overrides.items()):
        env[f"GIT_CONFIG_KEY_{index}"], env[f"GIT_CONFIG_VALUE_{index}"] = key, value
    return env


def _drivers_off(directory: Path) -> dict[str, str]:
    """An empty value for every command-naming key of a driver the repository's config defines."""
    listed = subprocess.run(["git", "-C", str(directory), "config", "--null", "--name-only", "--get-regexp",
                             r"^(filter|diff|merge)\."], capture_output=True, env=_environment(_OFF),
                            check=False, timeout=_TIMEOUT_S)
    off: dict[str, str] = {}
    for key in listed.stdout.decode(errors="replace").split("\0"):
        section, _, rest = key.partition(".")
        name = rest.rpartition(".")[0]
        if name and section.lower() in _DRIVER_COMMANDS:
            for command in _DRIVER_COMMANDS[section.lower()]:
                off[f"{section}.{name}.{command}"] = ""
            if section.lower() == "filter":
                off[f"filter.{name}.required"] = "false"
    return off


def run(directory: Path, *args: str, binary: bool = False, stdin: bytes | None = None,
        timeout: float = _TIMEOUT_S) -> subprocess.CompletedProcess:
    """`git -C directory ARGS` with the repository's commands off (text output unless `binary`)."""
    env = _environment({**_OFF, **_drivers_off(directory)})
    if stdin is not None or binary:
        return subprocess.run(["git", "-C", str(directory), *args], input=stdin, capture_output=True,
                              check=False, env=env, timeout=timeout)
    return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True,
                          check=False, env=env, timeout=timeout)


def isolated_environment(ceiling: Path) -> dict[str, str]:
    """For git outside any repository (`git apply` in a scratch copy): no system or global config,
    no repository found above `ceiling`."""
    env = _environment(_OFF)
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_CEILING_DIRECTORIES=str(ceiling))
    return env


# ---- a revision's exact blobs ----

def inside(tree_ish: str, name: str) -> str:
    """The object `name` of `tree_ish` (`sha` or `sha:prefix`), as rev-parse and cat-file read it."""
    return f"{tree_ish}/{name}" if ":" in tree_ish else f"{tree_ish}:{name}"


_FILE_MODES = {"100644": 0o644, "100755": 0o755}


# A TE tree's largest file is a few hundred KB; these bound what one revision may make the harness
# hold in memory and write (a 400 MB file once peaked at 1.28 GB).
MAX_FILE_BYTES = 64 << 20
MAX_EXPORT_BYTES = 512 << 20


def _listing(directory: Path, tree_ish: str, names: list[str]) -> list[tuple[str, str, str, int, str]]:
    """(mode, kind, object id, size in bytes (0 where git gives none), path) of each entry under `names`."""
    done = run(directory, "ls-tree", "-r", "-l", "-z", tree_ish, "--", *names, binary=True)
    if done.returncode:
        raise UsageError(f"git ls-tree {tree_ish} failed: {done.stderr.decode(errors='replace').strip()}")
    entries = []
    for line in done.stdout.decode("utf-8", errors="surrogateescape").split("\0"):
        if line:
            meta, _, path = line.partition("\t")
            mode, kind, oid, size = meta.split()
            entries.append((mode, kind, oid, int(size) if size.isdigit() else 0, path))
    return entries


def _within_bounds(files: list[tuple[str, str, int, str]], what: str) -> None:
    """A UsageError naming the file (or the total) past the bounds, before anything is read."""
    for _, _, size, path in files:
        if size > MAX_FILE_BYTES:
            raise UsageError(f"{what}: {path} is {size:,} bytes; a file of a TE tree to test may be at most"
                             f" {MAX_FILE_BYTES:,} bytes ({MAX_FILE_BYTES >> 20} MiB)")
    if (total := sum(size for _, _, size, _ in files)) > MAX_EXPORT_BYTES:
        raise UsageError(f"{what}: the files to export are {total:,} bytes in all; at most"
                         f" {MAX_EXPORT_BYTES:,} bytes ({MAX_EXPORT_BYTES >> 20} MiB)")


def _blobs(directory: Path, oids: list[str]) -> dict[str, bytes]:
    """The raw content of each blob (`cat-file --batch`: what the commit holds, never filtered)."""
    done = run(directory, "cat-file", "--batch", stdin="".join(f"{oid}\n" for oid in oids).encode())
    if done.returncode:
        raise UsageError(f"git cat-file failed: {done.stderr.decode(errors='replace').strip()}")
    out, at, blobs = done.stdout, 0, {}
    for oid in oids:
        header_end = out.index(b"\n", at)
        _, kind, size = out[at:header_end].decode().split()
        if kind != "blob":
            raise UsageError(f"git cat-file: {oid} is a {kind}, not a blob")
        start = header_end + 1
        blobs[oid] = out[start:start + int(size)]
        at = start + int(size) + 1
    return blobs


def export_blobs(directory: Path, tree_ish: str, names: list[str], dest: Path, what: str) -> None:
    """Write `names` of `tree_ish` under `dest` as the commit's blobs, then check that the written
    tree hashes to the commit's. `what` names the revision in a refusal (a symlink, a bad path)."""
    entries = _listing(directory, tree_ish, names)
    gitlinks = {}
    files = []
    for mode, kind, oid, size, path in entries:
        parts = Path(path).parts
        if path.startswith("/") or ".." in parts or ".git" in parts:
            raise UsageError(f"{what}: the commit holds a path outside its tree: {path!r}")
        if mode == "160000":
            gitlinks[path] = oid  # a submodule: not exported, but part of the tree's hash
        elif mode == "120000":
            raise UsageError(f"{what}: the commit holds a symlink at {path!r}; a TE tree to test has none "
                             "(a link could point outside the tree)")
        elif kind == "blob" and mode in _FILE_MODES:
            files.append((mode, oid, size, path))
        else:
            raise UsageError(f"{what}: the commit holds {path!r} with mode {mode}, which is not a file")
    _within_bounds(files, what)
    blobs = _blobs(directory, [oid for _, oid, _, _ in files])
    for mode, oid, _, path in files:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blobs[oid])
        target.chmod(_FILE_MODES[mode])
    for name in names:
        expected = run(directory, "rev-parse", inside(tree_ish, name)).stdout.strip()
        actual = tree_hash(dest / name, {p.removeprefix(f"{name}/"): o for p, o in gitlinks.items()
                                         if p.startswith(f"{name}/")}, like=expected)
        if expected != actual:
            raise UsageError(f"{what}: the exported {name} hashes to {actual}, not the commit's {expected} "
                             "(does the cache's file system fold case or drop file modes?)")


def _object_id(kind: str, body: bytes, algorithm: str) -> bytes:
    return hashlib.new(algorithm, f"{kind} {len(body)}\0".encode() + body).digest()


def tree_hash(path: Path, gitlinks: dict[str, str] | None = None, like: str = "") -> str:
    """The git object id of `path` as git would store it: a file's blob, or a directory's tree,
    with `gitlinks` (relative path -> commit) as the submodules it holds; sha256 when `like`
    (an id of the same repository) is one, as in a repository made with --object-format=sha256."""
    algorithm = "sha256" if len(like) == 64 else "sha1"
    if path.is_file() and not path.is_symlink():
        return _object_id("blob", path.read_bytes(), algorithm).hex()
    return _tree_id(path, gitlinks or {}, algorithm).hex()


def _tree_id(directory: Path, gitlinks: dict[str, str], algorithm: str) -> bytes:
    entries: list[tuple[bytes, bytes]] = []  # (sort key, entry)
    here = {p.partition("/")[0]: o for p, o in gitlinks.items() if "/" not in p}
    for child in directory.iterdir():
        name = child.name.encode("utf-8", errors="surrogateescape")
        if child.is_symlink():
            raise UsageError(f"{child}: a symlink in an exported tree")
        if child.is_dir():
            below = {p.partition("/")[2]: o for p, o in gitlinks.items() if p.startswith(f"{child.name}/")}
            entries.append((name + b"/", b"40000 " + name + b"\0" + _tree_id(child, below, algorithm)))
        else:
            mode = b"100755" if child.stat().st_mode & 0o100 else b"100644"
            entries.append((name, mode + b" " + name + b"\0" + _object_id("blob", child.read_bytes(), algorithm)))
    for name_text, oid in here.items():
        name = name_text.encode()
        entries.append((name, b"160000 " + name + b"\0" + bytes.fromhex(oid)))
    return _object_id("tree", b"".join(entry for _, entry in sorted(entries)), algorithm)
