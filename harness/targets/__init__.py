"""Target specs and their preparation: `te-<version>`, `path:<dir>`, `installed`, each
optionally `+<patch>`. Preparing a target fetches, unpacks and patches its source in
the cache; importing it happens later, in the process that runs its cases.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.errors import TargetLoadError, UsageError
from harness.targets import patching, sources

DEFAULT_TARGETS = ("te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2")
SPEC_FORMS = "te-<version>, path:<dir> or installed, each optionally +<patch>"


@dataclass(frozen=True)
class TargetSpec:
    text: str
    kind: str  # "wheel", "path" or "installed"
    value: str  # the version, the directory, or ""
    patch: str | None

    @property
    def base(self) -> str:
        return self.text.rsplit("+", 1)[0] if self.patch else self.text


def parse_spec(text: str) -> TargetSpec:
    base, patch = text, None
    head, sep, tail = text.rpartition("+")
    if sep and re.fullmatch(r"[A-Za-z0-9_.-]+", tail):
        base, patch = head, tail
    if base == "installed":
        return TargetSpec(text, "installed", "", patch)
    if base.startswith("path:") and len(base) > 5:
        return TargetSpec(text, "path", base[5:], patch)
    match = re.fullmatch(r"te-(\d+\.\d+(?:\.\d+)?(?:\.?(?:post|rc|dev)\d+)?)", base)
    if match:
        return TargetSpec(text, "wheel", match.group(1), patch)
    raise UsageError(f"unknown target spec {text!r}; valid forms: {SPEC_FORMS}")


@dataclass(frozen=True)
class PreparedTarget:
    """Everything a worker needs to import a target; serialisable as JSON."""

    spec: str
    kind: str
    source: str
    root: str | None  # the directory holding transformer_engine/; None for native
    version: str
    fuser_sha: str
    patch: str | None
    patch_status: str  # "none", "applied", "already-applied" or "conflict"
    patch_detail: str
    backend: str  # "cpu" or "native"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PreparedTarget:
        return cls(**json.loads(text))


def _installed_root() -> Path:
    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or not spec.submodule_search_locations:
        raise TargetLoadError("installed: no transformer_engine is importable in this environment")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    if not (package_dir / "pytorch/ops/fuser.py").is_file():
        raise TargetLoadError(f"installed: {package_dir} has no pytorch/ops/fuser.py (not TE's PyTorch part)")
    return package_dir.parent


def _patched_copy(root: Path, key: str, patch: patching.Patch, cache: Path) -> tuple[Path, str, str]:
    """A patched copy of root's transformer_engine/ in the cache, made once per key."""
    final = cache / "patched" / f"{key}+{patch.name}-{sources.short_hash(patch.text)}"
    status_file = final / ".patch-status.json"
    if status_file.is_file():
        saved = json.loads(status_file.read_text())
        return final, saved["status"], saved["detail"]
    with sources.file_lock(cache / "locks" / f"patched-{final.name}.lock"):
        if status_file.is_file():
            saved = json.loads(status_file.read_text())
            return final, saved["status"], saved["detail"]
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}-") as tmp:
            staged = Path(tmp) / "tree"
            staged.mkdir()
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(root / "transformer_engine", staged / "transformer_engine", ignore=ignore)
            for info in root.glob("transformer_engine-*.dist-info"):
                shutil.copytree(info, staged / info.name)
            status, detail = patching.apply_patch(staged, patch)
            (staged / ".patch-status.json").write_text(json.dumps({"status": status, "detail": detail}))
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
    return final, status, detail


def prepare(spec_text: str, cache: Path, offline: bool = False) -> PreparedTarget:
    """Fetch, unpack and patch a target's source. Raises UsageError for bad input."""
    spec = parse_spec(spec_text)
    patch = patching.load_patch(spec.patch) if spec.patch else None
    if spec.kind == "wheel":
        wheel = sources.fetch_wheel(spec.value, cache, offline)
        root = sources.unpack_wheel(wheel, cache, f"te-{spec.value}")
        source, version, backend, key = wheel.name, sources.wheel_version(root), "cpu", f"te-{spec.value}"
    elif spec.kind == "path":
        root = sources.check_source_tree(Path(spec.value).expanduser().resolve())
        source, version, backend = str(root), sources.tree_version(root), "cpu"
        key = "path-" + sources.short_hash(str(root).encode() + sources.fuser_hash(root).encode())
    else:
        root = _installed_root()
        source, version, backend, key = str(root), sources.tree_version(root), "native", "installed"
    status, detail = "none", ""
    if patch is not None:
        root, status, detail = _patched_copy(root, key, patch, cache)
    return PreparedTarget(
        spec=spec.text, kind=spec.kind, source=source, root=str(root), version=version,
        fuser_sha=sources.fuser_hash(root), patch=spec.patch, patch_status=status,
        patch_detail=detail, backend=backend,
    )
