"""Where Megatron's source comes from: a megatron-core release wheel in the cache, or a checkout.

`--megatron VERSION` fetches that release of `megatron-core` with `pip download --no-deps`.
Releases from 0.17 on are published for CPython 3.12 only; the modules the harness runs are
pure Python and run on 3.11, so the wheel is asked for with 3.12's tags, and only its files
are used (nothing is installed). The fetch and the unpack reuse the TE source helpers: a
per-version lock, a zip-slip check, and an atomic rename.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.targets.sources import _pip, check_wheel_members, file_lock, wheel_version

PACKAGE = "megatron-core"
DEFAULT_VERSION = "0.19.0"
MARKER = Path("megatron/core/extensions/transformer_engine.py")  # the file the bug report's frames pass through
# The tags of the wheels 0.17+ publish; the Python code is the same for every tag.
WHEEL_TAGS = ("--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
              "--platform", "manylinux_2_28_x86_64")
VERSION = r"\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?"
SPEC_FORMS = "a megatron-core version (e.g. 0.19.0) or path:<dir holding megatron/core>"


@dataclass(frozen=True)
class PreparedMegatron:
    """What a worker needs to import Megatron; JSON-serialisable, and recorded in run.json."""

    spec: str
    version: str
    source: str  # the wheel's file name, or the checkout's directory
    root: str  # the directory holding megatron/

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PreparedMegatron:
        return cls(**json.loads(text))


def _fetch_wheel(version: str, cache: Path, offline: bool) -> Path:
    wheels = cache / "wheels"
    pattern = f"megatron_core-{version}-*.whl"
    if existing := sorted(wheels.glob(pattern)):
        return existing[0]
    if offline:
        raise UsageError(f"megatron-core {version} is not in the cache ({wheels}); run once without --offline")
    with file_lock(cache / "locks" / f"wheel-megatron-core-{version}.lock"):
        if existing := sorted(wheels.glob(pattern)):
            return existing[0]
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            result = _pip("download", "--no-deps", "--only-binary=:all:", *WHEEL_TAGS, "-q", "-d", tmp,
                          f"{PACKAGE}=={version}")
            downloaded = list(Path(tmp).glob("*.whl"))
            if result.returncode != 0 or not downloaded:
                last = (result.stderr.strip().splitlines() or ["pip gave no reason"])[-1]
                raise UsageError(f"could not download {PACKAGE}=={version}: {last}; valid: {SPEC_FORMS}")
            final = wheels / downloaded[0].name
            os.replace(downloaded[0], final)
    return final


def _unpack(wheel: Path, cache: Path, key: str) -> Path:
    final = cache / "src" / key
    if (final / MARKER).is_file():
        return final
    with file_lock(cache / "locks" / f"src-{key}.lock"):
        if (final / MARKER).is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{key}-") as tmp:
            staged = Path(tmp) / "tree"
            check_wheel_members(wheel, staged)
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(staged)
            if not (staged / MARKER).is_file():
                raise UsageError(f"wheel {wheel.name} has no {MARKER}: not a megatron-core release with TE extensions")
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
    return final


def _checkout_version(root: Path) -> str:
    """A checkout's version, from Megatron's own package_info.py (read, not imported)."""
    info = root / "megatron/core/package_info.py"
    text = info.read_text() if info.is_file() else ""
    parts = dict(re.findall(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([^'\"\s#]*)", text, re.MULTILINE))
    if not {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
        return "unknown"
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"


def check_megatron_spec(spec: str) -> None:
    """The spec's form, without fetching anything; UsageError (one line) when it has none."""
    if not (spec.startswith("path:") and len(spec) > 5) and not re.fullmatch(VERSION, spec):
        raise UsageError(f"unknown Megatron spec {spec!r}; valid: {SPEC_FORMS}")


def prepare_megatron(spec: str, cache: Path, offline: bool = False) -> PreparedMegatron:
    """Fetch and unpack (or check) a Megatron source. Raises UsageError for bad input."""
    check_megatron_spec(spec)
    if spec.startswith("path:"):
        root = Path(spec[5:]).expanduser().resolve()
        if (root / "core").is_dir() and root.name == "megatron":
            root = root.parent
        if not (root / MARKER).is_file():
            raise UsageError(f"{spec} is not a Megatron checkout: it has no {MARKER}; valid: {SPEC_FORMS}")
        return PreparedMegatron(spec, _checkout_version(root), str(root), str(root))
    wheel = _fetch_wheel(spec, cache, offline)
    root = _unpack(wheel, cache, f"megatron-core-{spec}")
    return PreparedMegatron(spec, wheel_version(root, "megatron_core"), wheel.name, str(root))
