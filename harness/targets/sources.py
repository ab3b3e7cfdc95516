"""Where target sources come from: release wheels in a local cache, or a source tree.

Wheels are fetched with `pip download --no-deps` and unpacked into the cache. Both
steps run under a per-version file lock and finish with an atomic rename, so two
runs fetching the same release at once never see a half-written tree.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.errors import UsageError

CACHE_ENV = "TE_REPRO_CACHE"
PACKAGE = "transformer-engine"
FUSER_RELPATH = Path("transformer_engine/pytorch/ops/fuser.py")


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The target cache: --cache-dir, else $TE_REPRO_CACHE, else the XDG cache dir."""
    if override:
        path = Path(override)
    elif os.environ.get(CACHE_ENV):
        path = Path(os.environ[CACHE_ENV])
    else:
        path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "te-fuser-repro"
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
    path.parent.mkdir(parents=True, exist_ok=True)
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


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def index_versions() -> list[str]:
    """The transformer-engine releases the package index serves, newest first."""
    result = _pip("index", "versions", PACKAGE)
    match = re.search(r"Available versions: (.+)", result.stdout)
    if result.returncode != 0 or not match:
        return []
    return [v.strip() for v in match.group(1).split(",")]


def fetch_wheel(version: str, cache: Path, offline: bool) -> Path:
    """The cached wheel for a release, downloading it first unless offline."""
    wheels = cache / "wheels"
    existing = sorted(wheels.glob(f"transformer_engine-{version}-*.whl"))
    if existing:
        return existing[0]
    if offline:
        raise UsageError(
            f"te-{version} is not in the cache ({wheels}); run once without --offline to fetch "
            f"{PACKAGE}=={version}, or put its wheel there"
        )
    with file_lock(cache / "locks" / f"wheel-{version}.lock"):
        existing = sorted(wheels.glob(f"transformer_engine-{version}-*.whl"))
        if existing:  # another run fetched it while we waited
            return existing[0]
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            result = _pip("download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp, f"{PACKAGE}=={version}")
            downloaded = list(Path(tmp).glob("*.whl"))
            if result.returncode != 0 or not downloaded:
                if "No matching distribution" in result.stderr or "from versions" in result.stderr:
                    known = index_versions()
                    valid = ", ".join(known[:12]) + (" ..." if len(known) > 12 else "")
                    raise UsageError(f"{PACKAGE}=={version} is not on the package index; valid versions: {valid}")
                last = (result.stderr.strip().splitlines() or ["pip gave no reason"])[-1]
                raise UsageError(f"could not download {PACKAGE}=={version}: {last}")
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


def unpack_wheel(wheel: Path, cache: Path, key: str) -> Path:
    """Unpack a wheel into cache/src/<key> once; later calls reuse the tree."""
    final = cache / "src" / key
    if (final / FUSER_RELPATH).is_file():
        return final
    with file_lock(cache / "locks" / f"src-{key}.lock"):
        if (final / FUSER_RELPATH).is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{key}-") as tmp:
            check_wheel_members(wheel, Path(tmp))
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(tmp)
            if not (Path(tmp) / FUSER_RELPATH).is_file():
                raise UsageError(f"wheel {wheel.name} has no {FUSER_RELPATH}: not a TE release with the op fuser")
            staged = Path(tmp) / "tree"
            staged.mkdir()
            for child in list(Path(tmp).iterdir()):
                if child != staged:
                    child.rename(staged / child.name)
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
    return final


def wheel_version(root: Path) -> str:
    for metadata in root.glob("transformer_engine-*.dist-info/METADATA"):
        for line in metadata.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def tree_version(root: Path) -> str:
    """Version of a source checkout, from TE's own version file where it has one."""
    for candidate in ("build_tools/VERSION.txt", "transformer_engine/VERSION.txt", "VERSION.txt"):
        path = root / candidate
        if path.is_file():
            return path.read_text().strip()
    return wheel_version(root)


def check_source_tree(path: Path) -> Path:
    """A `path:` target must be a directory holding transformer_engine/pytorch/ops/fuser.py."""
    if not path.is_dir():
        raise UsageError(f"path:{path} is not a directory; give a TE source tree (the dir holding transformer_engine/)")
    if (path / "pytorch/ops/fuser.py").is_file() and path.name == "transformer_engine":
        path = path.parent
    if not (path / FUSER_RELPATH).is_file():
        raise UsageError(f"path:{path} is not a TE source tree: it has no {FUSER_RELPATH}")
    return path
