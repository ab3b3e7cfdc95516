"""Where target sources come from: release wheels in a local cache, or a source tree.

Wheels are fetched with `pip download --no-deps` and unpacked into the cache. Both
steps run under a per-version file lock and finish with an atomic rename, so two
runs fetching the same release at once never see a half-written tree.

A target that ran once can rewrite anything inside its unpacked tree, its own RECORD
included, so nothing in the tree vouches for the tree: it is checked against the RECORD
read from the wheel archive, and the archive against the sha256 the package index gave
when it was fetched, kept read-only beside the wheel (`wheels/<wheel>.sha256`).
"""

from __future__ import annotations

import base64
import csv
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

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
    """Why a wheel file cannot be trusted (truncated, corrupt member), or None. It decompresses
    every member: run once when a wheel enters the cache, never on every use."""
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


def digest_path(wheel: Path) -> Path:
    """Where a cached wheel's sha256 is kept: beside the wheel, outside every unpacked tree."""
    return wheel.with_name(wheel.name + ".sha256")


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_kept(path: Path, text: str) -> None:
    """Write what vouches for something in the cache: whole (a temporary file and a rename) and
    read-only (kept once, never edited in place); a write error is one line."""
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o444)
        os.replace(temporary, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path} ({exc.strerror}); fix the cache dir and run again") from None
    finally:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def _keep_digest(wheel: Path, sha256: str, origin: str) -> None:
    """Record a wheel's digest. `origin` says where it came from: "index" (pip's report of the
    index's file), "download" (pip's report named none: the digest of the file pip downloaded) or
    "first use" (a wheel that was in the cache before digests were kept, or was put there, and the
    index was not asked or lists another file)."""
    write_kept(digest_path(wheel), json.dumps({"wheel": wheel.name, "sha256": sha256, "from": origin}) + "\n")


NOT_KEPT = "no digest was kept for it"


def _digest_problem(wheel: Path) -> str | None:
    """Why a cached wheel is not the file whose digest was kept when it entered the cache (NOT_KEPT
    when none was), or None. One sha256 of the wheel: what every use pays."""
    try:
        kept = json.loads(digest_path(wheel).read_text())
    except FileNotFoundError:
        return NOT_KEPT
    except (OSError, ValueError) as exc:
        return f"its kept digest {digest_path(wheel)} cannot be read ({type(exc).__name__})"
    if not isinstance(kept, dict) or kept.get("wheel") != wheel.name or not isinstance(kept.get("sha256"), str):
        return f"its kept digest {digest_path(wheel)} is not one for this wheel"
    try:
        actual = _file_sha256(wheel)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if actual != kept["sha256"]:
        when = {"index": "the package index gave when it was downloaded", "download": "it had when it was downloaded"}
        return f"its sha256 is not the one {when.get(str(kept.get('from')), 'it had at its first use')}, kept in {digest_path(wheel)}"
    return None


def index_digest(version: str, dist: Distribution = TE) -> tuple[str, str] | None:
    """The file name and sha256 of the wheel pip would download for a release, as pip's
    resolution report gives them (the package index's own digest where it lists one: PyPI always
    does), without installing anything; None when the index cannot be asked or gives none."""
    # pip only takes another interpreter's tags for a --target install, and then still checks
    # Requires-Python against this one.
    foreign = ("--target", "", "--ignore-requires-python") if dist.pip_tags else ()
    with tempfile.TemporaryDirectory(prefix="index-") as tmp:
        report = Path(tmp) / "report.json"
        args = [a or str(Path(tmp) / "target") for a in foreign]
        # A short bound: an index that cannot be reached leaves a kept wheel usable (its digest then
        # kept at first use), where pip's own default here would wait minutes per try.
        result = _pip("install", "--dry-run", "--ignore-installed", "--no-deps", "--only-binary=:all:", *args,
                      *dist.pip_tags, "--timeout", "20", "--retries", "1", "-q", "--report", str(report),
                      f"{dist.package}=={version}")
        try:
            installs = json.loads(report.read_text())["install"] if result.returncode == 0 else []
            info = installs[0]["download_info"]
            name = urllib.parse.unquote(info["url"].rsplit("/", 1)[-1].split("#", 1)[0])
            sha256 = info["archive_info"]["hashes"]["sha256"]
        except (OSError, ValueError, LookupError, TypeError, AttributeError):
            return None
    if len(installs) != 1 or not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return None
    return name, sha256


def _adopt(wheel: Path, version: str, offline: bool, dist: Distribution) -> str | None:
    """A cached wheel without a kept digest (cached before digests were kept, or put there by
    hand): online it is checked against the index, which keeps the index's digest; where the index
    cannot be asked, or serves another file for the release, its digest now is kept ("first use").
    Say why it must be fetched again, or None once its digest is kept."""
    if (damage := _wheel_damage(wheel)) is not None:
        return damage
    actual = _file_sha256(wheel)
    told = None if offline else index_digest(version, dist)
    if told is not None and told[0] == wheel.name:
        if told[1] != actual:
            return "its sha256 is not the one the package index gives for it"
        _keep_digest(wheel, actual, "index")
    else:
        _keep_digest(wheel, actual, "first use")
    return None


def fetch_wheel(version: str, cache: Path, offline: bool, dist: Distribution = TE) -> Path:
    """The cached wheel for a release, downloading it first unless offline. A cached wheel whose
    sha256 is not the one kept when it was fetched (damaged, or rewritten) is deleted and fetched
    again; offline, it is refused with what to delete."""
    wheels = cache / "wheels"
    pattern = f"{dist.dist_name}-{version}-*.whl"
    lock = cache / "locks" / f"wheel-{dist.package}-{version}.lock"
    existing = sorted(wheels.glob(pattern))
    if existing and _digest_problem(existing[0]) is None:
        return existing[0]
    if existing:
        wheel = existing[0]
        with file_lock(lock):
            problem = _digest_problem(wheel) if wheel.exists() else None
            if problem == NOT_KEPT:
                problem = _adopt(wheel, version, offline, dist)
                if problem is None:
                    return wheel
            elif problem is None and wheel.exists():  # another run settled it while we waited
                return wheel
            if problem is not None:
                if offline:
                    raise UsageError(f"cached wheel {wheel} is damaged or altered: {problem}; delete it, then "
                                     "run without --offline")
                wheel.unlink(missing_ok=True)
                digest_path(wheel).unlink(missing_ok=True)
    if offline:
        raise UsageError(
            f"{dist.label(version)} is not in the cache ({wheels}); run once without --offline to fetch "
            f"{dist.package}=={version}, or put its wheel there"
        )
    with file_lock(lock):
        existing = sorted(wheels.glob(pattern))
        if existing and _digest_problem(existing[0]) is None:  # another run fetched it while we waited
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
            # pip checked the file against the index's hash; its report names that hash, which is kept.
            actual, told = _file_sha256(downloaded[0]), index_digest(version, dist)
            if told is not None and told != (downloaded[0].name, actual):
                raise UsageError(f"the downloaded wheel {downloaded[0].name} (sha256 {actual[:16]}) is not the file "
                                 f"the package index lists ({told[0]}, sha256 {told[1][:16]}); run again")
            final = wheels / downloaded[0].name
            _keep_digest(final, actual, "index" if told else "download")  # before the wheel: never one without it
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


@dataclass(frozen=True)
class ArchiveRecord:
    """A wheel's RECORD as the archive holds it: each path with its listed digest ("" for the
    rows listed without one, RECORD itself), those rows' bytes, compared whole, and the folders
    the archive makes (its files' parents, and any folder it holds as a member)."""

    digests: dict[str, str]
    unhashed: dict[str, bytes]
    folders: frozenset[str]


def archive_record(wheel: Path, dist: Distribution = TE) -> ArchiveRecord | None:
    """The RECORD inside the wheel archive (one .dist-info of this distribution), or None when
    the archive has none or cannot be read."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist()
                     if re.fullmatch(rf"{re.escape(dist.dist_name)}-[^/]+\.dist-info/RECORD", n)]
            if len(names) != 1:
                return None
            rows = [row for row in csv.reader(io.StringIO(archive.read(names[0]).decode(errors="replace"))) if row]
            digests = {PurePosixPath(row[0]).as_posix(): (row[1] if len(row) > 1 else "") for row in rows}
            unhashed = {name: archive.read(name) for name, digest in digests.items()
                        if not digest and name in archive.NameToInfo}
            members = [name.rstrip("/") for name in archive.namelist()]
    except (zipfile.BadZipFile, OSError, EOFError, csv.Error, RuntimeError):
        return None
    folders = {parent.as_posix() for name in [*digests, *members] for parent in PurePosixPath(name).parents}
    folders |= {name for name in members if name not in digests}
    return ArchiveRecord(digests, unhashed, frozenset(folders - {"."}))


def _entries(root: Path) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every entry under root with its path relative to root, not following symlinks."""
    pending = [("", str(root))]
    while pending:
        prefix, directory = pending.pop()
        with os.scandir(directory) as listing:
            for entry in listing:
                yield prefix + entry.name, entry
                if entry.is_dir(follow_symlinks=False):
                    pending.append((f"{prefix}{entry.name}/", entry.path))


def _listed_digest(data: bytes, listed: str) -> bool:
    algorithm, _, expected = listed.partition("=")
    if algorithm not in ("sha256", "sha384", "sha512"):  # what wheels use; a weaker one vouches for nothing
        return False
    actual = base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode()
    return actual == expected


def record_mismatch(root: Path, record: ArchiveRecord, dist: Distribution = TE) -> str | None:
    """Check an unpacked tree against the wheel archive's RECORD both ways: every listed file
    present with the listed digest (a row without one byte for byte as the archive holds it), and
    nothing the RECORD does not list (Python would prefer an added `ops/fuser/__init__.py` to
    fuser.py). Say what is wrong, or None when the tree is as shipped."""
    listed = record.digests
    if any(name.startswith("/") or ".." in PurePosixPath(name).parts for name in listed):
        return "the wheel's RECORD names a path outside the tree"
    files: set[str] = set()
    try:
        for relative, entry in _entries(root):
            if entry.is_symlink():
                return f"{relative} is a symlink, which the wheel does not hold"
            if entry.is_dir():
                if relative not in record.folders:
                    return f"{relative}/ is not in the wheel's RECORD"
            elif not entry.is_file() or relative not in listed:
                return f"{relative} is not in the wheel's RECORD"
            else:
                files.add(relative)
        for name, digest in listed.items():
            if name not in files:
                return f"{name} is missing"
            data = (root / name).read_bytes()
            if not (_listed_digest(data, digest) if digest else data == record.unhashed.get(name)):
                return f"{name} differs from the wheel's RECORD"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if not (root / dist.marker).is_file():
        return f"{dist.marker} is missing"
    return None


# Errors of writing into the cache, not of reading the wheel.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE}


def unpack_wheel(wheel: Path, cache: Path, key: str, dist: Distribution = TE) -> Path:
    """Unpack a wheel into cache/src/<key> once; later calls reuse the tree after checking it
    against the RECORD inside the wheel (never the tree's own), and unpack it again when it differs."""
    final = cache / "src" / key
    record = archive_record(wheel, dist)
    if record is not None and final.is_dir() and record_mismatch(final, record, dist) is None:
        return final
    with file_lock(cache / "locks" / f"src-{key}.lock"):
        if record is not None and final.is_dir() and record_mismatch(final, record, dist) is None:
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
            if record is None:
                raise UsageError(f"wheel {wheel} has no readable {dist.dist_name}-*.dist-info/RECORD; delete it")
            if (problem := record_mismatch(staged, record, dist)) is not None:
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
