"""Where target sources come from: release wheels in a local cache, or a source tree.

Wheels are fetched with `pip download --no-deps` and unpacked into the cache. Both
steps run under a per-version file lock and finish with an atomic rename, so two
runs fetching the same release at once never see a half-written tree.
"""

from __future__ import annotations

import base64
import csv
import errno
import fcntl
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.runner.textsafe import check_path_text
from harness.targets.safegit import run as git_run

CACHE_ENV = "TE_REPRO_CACHE"
PACKAGE = "transformer-engine"
FUSER_RELPATH = Path("transformer_engine/pytorch/ops/fuser.py")


@dataclass(frozen=True)
class Distribution:
    """A package whose release wheels are sources under test: fetched, checked and unpacked alike."""

    package: str  # the name on the package index
    marker: Path  # a file every usable release has
    what: str  # what the marker proves, for the refusal
    pip_tags: tuple[str, ...] = ()  # `pip download` tags, for wheels built for another Python

    @property
    def dist_name(self) -> str:  # the wheel's and its .dist-info's name
        return self.package.replace("-", "_")

    def label(self, version: str) -> str:
        return f"te-{version}" if self.package == PACKAGE else f"{self.package} {version}"


TE = Distribution(PACKAGE, FUSER_RELPATH, "a TE release with the op fuser")


def cache_path(override: str | os.PathLike[str] | None = None) -> Path:
    """Where the target cache is, without creating it: --cache-dir, else $TE_REPRO_CACHE,
    else $XDG_CACHE_HOME/te-fuser-repro (a relative $XDG_CACHE_HOME is ignored, as the XDG
    spec says), else ~/.cache/te-fuser-repro."""
    if override:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "te-fuser-repro"


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The target cache (created when missing): see `cache_path`."""
    path = cache_path(override)
    check_path_text(str(path), "cache dir")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise UsageError(
            f"cache dir {path} is not writable ({exc.strerror}); set {CACHE_ENV} or pass --cache-dir"
        ) from None
    return path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock held across processes for the duration of the block."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:
        raise UsageError(f"cannot take the cache lock {path} ({exc.strerror}); {path.parent} must be a directory "
                         "the cache can write: remove what is there") from None
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def fuser_hash(root: Path) -> str:
    """Short content hash of a tree's fuser.py: what identifies the code under test."""
    return short_hash((root / FUSER_RELPATH).read_bytes())


def loadable_files(root: Path) -> list[Path]:
    """Every file the loader may import from a tree: the Python files of transformer_engine/."""
    package = root / "transformer_engine"
    # A directory may be named like a module (`notes.py/`): only files are loadable.
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts and p.is_file())


def content_hash(root: Path) -> str:
    """Short hash of the names and contents of every loadable file: the identity of the
    code under test, so editing any of them (not only fuser.py) gives a new key."""
    digest = hashlib.sha256()
    package = root / "transformer_engine"
    for path in loadable_files(root):
        if path.is_symlink() and not path.resolve().is_relative_to(package.resolve()):
            raise UsageError(f"{path} is a symlink to {path.resolve()}, outside the tree; refusing to load it")
        data = path.read_bytes()
        digest.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def index_versions(package: str = PACKAGE) -> list[str]:
    """The releases of `package` the package index serves, newest first."""
    result = _pip("index", "versions", package)
    match = re.search(r"Available versions: (.+)", result.stdout)
    if result.returncode != 0 or not match:
        return []
    return [v.strip() for v in match.group(1).split(",")]


def _wheel_damage(wheel: Path) -> str | None:
    """Why a wheel file cannot be trusted (truncated, corrupt member), or None."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            bad = archive.testzip()
            if bad:
                return f"member {bad} fails its CRC check"
            if not any(n.endswith(".dist-info/RECORD") for n in archive.namelist()):
                return "it has no .dist-info/RECORD"
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def fetch_wheel(version: str, cache: Path, offline: bool, dist: Distribution = TE) -> Path:
    """The cached wheel for a release, downloading it first unless offline. A damaged
    cached wheel is deleted and fetched again; offline, it is refused with what to delete."""
    wheels = cache / "wheels"
    pattern = f"{dist.dist_name}-{version}-*.whl"
    lock = cache / "locks" / f"wheel-{dist.package}-{version}.lock"
    existing = sorted(wheels.glob(pattern))
    if existing:
        damage = _wheel_damage(existing[0])
        if damage is None:
            return existing[0]
        if offline:
            raise UsageError(f"cached wheel {existing[0]} is damaged ({damage}); delete it, then run without --offline")
        with file_lock(lock):
            if existing[0].exists() and _wheel_damage(existing[0]) is not None:
                existing[0].unlink()
    if offline:
        raise UsageError(
            f"{dist.label(version)} is not in the cache ({wheels}); run once without --offline to fetch "
            f"{dist.package}=={version}, or put its wheel there"
        )
    with file_lock(lock):
        existing = sorted(wheels.glob(pattern))
        if existing:  # another run fetched it while we waited
            return existing[0]
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            result = _pip("download", "--no-deps", "--only-binary=:all:", *dist.pip_tags, "-q", "-d", tmp,
                          f"{dist.package}=={version}")
            downloaded = list(Path(tmp).glob("*.whl"))
            if result.returncode != 0 or not downloaded:
                if "No matching distribution" in result.stderr or "from versions" in result.stderr:
                    known = index_versions(dist.package)
                    valid = ", ".join(known[:12]) + (" ..." if len(known) > 12 else "")
                    raise UsageError(f"{dist.package}=={version} is not on the package index; valid versions: {valid}")
                last = (result.stderr.strip().splitlines() or ["pip gave no reason"])[-1]
                raise UsageError(f"could not download {dist.package}=={version}: {last}")
            damage = _wheel_damage(downloaded[0])
            if damage:
                raise UsageError(f"the downloaded wheel {downloaded[0].name} is damaged ({damage})")
            final = wheels / downloaded[0].name
            os.replace(downloaded[0], final)
    return final


def check_wheel_members(wheel: Path, dest: Path) -> None:
    """Refuse a wheel with a member that would land outside `dest` (zip-slip)."""
    dest = dest.resolve()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            target = (dest / name).resolve()
            if name.startswith("/") or not target.is_relative_to(dest):
                raise UsageError(f"wheel {wheel.name} refused: member {name!r} points outside its destination")


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record_mismatch(root: Path, dist: Distribution = TE) -> str | None:
    """Check an unpacked wheel against its own RECORD both ways (every listed file present with
    the listed sha256, and no file the RECORD does not list: Python would prefer an added
    `ops/fuser/__init__.py` to fuser.py); say what is wrong, or None when the tree is as shipped."""
    records = list(root.glob(f"{dist.dist_name}-*.dist-info/RECORD"))
    if len(records) != 1:
        return "its .dist-info/RECORD is missing"
    rows = list(csv.reader(io.StringIO(records[0].read_text(errors="replace"))))
    listed = {Path(row[0]).as_posix() for row in rows if row}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if (path.is_file() or path.is_symlink()) and relative not in listed:
            return f"{relative} is not in the wheel's RECORD"
    for row in rows:
        if len(row) < 2 or not row[1]:
            continue  # RECORD lists itself without a hash
        path = root / row[0]
        if not path.is_file() or path.is_symlink():
            return f"{row[0]} is missing"
        if _record_digest(path.read_bytes()) != row[1]:
            return f"{row[0]} differs from the wheel's RECORD"
    if not (root / dist.marker).is_file():
        return f"{dist.marker} is missing"
    return None


# Errors of writing into the cache, not of reading the wheel.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE}


def unpack_wheel(wheel: Path, cache: Path, key: str, dist: Distribution = TE) -> Path:
    """Unpack a wheel into cache/src/<key> once; later calls reuse the tree after checking
    it against the wheel's RECORD, and unpack it again when it was damaged."""
    final = cache / "src" / key
    if final.is_dir() and record_mismatch(final, dist) is None:
        return final
    with file_lock(cache / "locks" / f"src-{key}.lock"):
        if final.is_dir() and record_mismatch(final, dist) is None:
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{key}-") as tmp:
            try:
                check_wheel_members(wheel, Path(tmp))
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(tmp)
            except OSError as exc:
                if exc.errno in WRITE_ERRNOS:  # the cache's side: the wheel may be intact (and the only copy)
                    raise UsageError(f"cannot unpack {wheel.name} into {final.parent} ({exc.strerror}); free space or "
                                     "fix the cache dir and run again (the wheel is kept)") from None
                raise UsageError(f"cached wheel {wheel} is damaged ({type(exc).__name__}: {exc}); delete it") from None
            except (zipfile.BadZipFile, EOFError) as exc:
                raise UsageError(f"cached wheel {wheel} is damaged ({type(exc).__name__}: {exc}); delete it") from None
            if not (Path(tmp) / dist.marker).is_file():
                raise UsageError(f"wheel {wheel.name} has no {dist.marker}: not {dist.what}")
            staged = Path(tmp) / "tree"
            staged.mkdir()
            for child in list(Path(tmp).iterdir()):
                if child != staged:
                    child.rename(staged / child.name)
            if (problem := record_mismatch(staged, dist)) is not None:
                raise UsageError(f"wheel {wheel} does not match its own RECORD ({problem}); delete it")
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
    return final


def wheel_version(root: Path, dist: Distribution = TE) -> str:
    """The version in an unpacked wheel's METADATA."""
    for metadata in root.glob(f"{dist.dist_name}-*.dist-info/METADATA"):
        for line in metadata.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def tree_version(root: Path) -> str:
    """Version of a source checkout, from TE's own version file where it has one (its
    first non-empty line: the version is one line in every record and table)."""
    for candidate in ("build_tools/VERSION.txt", "transformer_engine/VERSION.txt", "VERSION.txt"):
        path = root / candidate
        if path.is_file():
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
            return lines[0][:80] if lines else "unknown"
    return wheel_version(root)


def _git(root: Path, *args: str) -> str | None:
    try:
        result = git_run(root, *args, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def git_provenance(root: Path) -> dict[str, str]:
    """Commit, branch and dirty state of a source tree that is a git work tree (read only);
    empty when it is not one. Two commits of upstream main share a version string."""
    if _git(root, "rev-parse", "--is-inside-work-tree") != "true":
        return {}
    commit = _git(root, "rev-parse", "HEAD") or "no commit yet"
    branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD") or "?"
    if branch == "HEAD":  # not on a branch
        branch = f"detached at {commit[:12]}"
    status = _git(root, "status", "--porcelain", "--ignore-submodules=all", "--", ".")
    dirty = "unknown" if status is None else ("dirty" if status else "clean")
    return {"git_commit": commit, "git_branch": branch, "git_state": dirty}


def check_source_tree(path: Path) -> Path:
    """A `path:` target must be a directory holding transformer_engine/pytorch/ops/fuser.py."""
    if not path.is_dir():
        raise UsageError(f"path:{path} is not a directory; give a TE source tree (the dir holding transformer_engine/)")
    if (path / "pytorch/ops/fuser.py").is_file() and path.name == "transformer_engine":
        path = path.parent
    if not (path / FUSER_RELPATH).is_file():
        raise UsageError(f"path:{path} is not a TE source tree: it has no {FUSER_RELPATH}")
    return path
