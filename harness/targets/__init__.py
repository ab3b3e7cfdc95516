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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

from harness.errors import TargetLoadError, UsageError
from harness.runner.textsafe import check_path_text
from harness.targets import forkconfig, patching, revisions, sources

DEFAULT_TARGETS = ("te-2.13.0", "te-2.13.0+backport", "te-2.16.0", "te-2.20.2")
SPEC_FORMS = "te-<x.y.z>, path:<dir> or installed, each optionally +<patch>"
_VERSION = r"\d+\.\d+\.\d+(?:\.?(?:post|rc|dev)\d+)?"


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
    """A spec's kind, value and patch. `+name` is a patch only when patches/ has `name`,
    so a path such as `path:te-2.14.0+ascend` needs no escaping; a trailing `/`
    (`path:dir+backport/`) names a directory whose name ends in a patch's name."""
    if not text or text != text.strip():
        raise UsageError(f"target spec {text!r} is empty or has surrounding spaces; valid forms: {SPEC_FORMS}")
    base, patch = text, None
    head, sep, tail = text.rpartition("+")
    if sep and patching.is_patch_name(tail):
        base, patch = head, tail
    if base.startswith("path:"):
        if len(base) == 5:
            raise UsageError(f"target spec {text!r} names no directory; write path:<dir>")
        check_path_text(base[5:], "target path")
        return TargetSpec(text, "path", base[5:], patch)
    if sep and not patch and re.fullmatch(patching.NAME, tail) and (
            head == "installed" or re.fullmatch(rf"te-{_VERSION}", head)):
        valid = ", ".join(patching.available_patches()) or "none"
        raise UsageError(f"unknown patch {tail!r} in target spec {text!r}; valid patches: {valid}")
    if base == "installed":
        return TargetSpec(text, "installed", "", patch)
    match = re.fullmatch(rf"te-({_VERSION})", base)
    if match:
        canonical = str(Version(match.group(1)))
        if canonical != match.group(1):  # the cache and the index name a release one way
            raise UsageError(f"target spec {text!r}: write the release as te-{canonical}")
        return TargetSpec(text, "wheel", match.group(1), patch)
    if re.fullmatch(r"te-\d+\.\d+", base):
        raise UsageError(f"target spec {text!r} is not a full release version; write {base}.0 (te-<x.y.z>)")
    raise UsageError(f"unknown target spec {text!r}; valid forms: {SPEC_FORMS}")


def canonical_spec(text: str) -> str:
    """One spelling per target: a `path:` dir made absolute with `..`, `.` and links resolved
    (`path:X`, `path:X/` and `path:X/../X` are one target, as are `path:X@REV` and `path:X/@REV`);
    a dir whose name ends in a patch's `+name` keeps its trailing `/`. Other specs are their own
    canonical form."""
    spec = parse_spec(text)
    if spec.kind != "path":
        return text
    directory, rev = revisions.split(spec.value)
    root = str(Path(directory).expanduser().resolve())
    _, sep, tail = root.rpartition("+")
    literal = "/" if sep and patching.is_patch_name(tail) else ""
    return f"path:{root}{literal}" + (f"@{rev}" if rev else "") + (f"+{spec.patch}" if spec.patch else "")


def parse_spec_list(text: str) -> list[str]:
    """`--targets A,B,C`: refuse an empty list, empty items and repeats. A spec holding a
    comma is passed with `--target SPEC` instead, which is never split."""
    specs = [s.strip() for s in text.split(",")]
    if not any(specs):
        raise UsageError(f"--targets {text!r} names no target; give comma-separated specs ({SPEC_FORMS})")
    if "" in specs:
        raise UsageError(f"--targets {text!r} has an empty item; separate specs by single commas "
                         "(a path with a comma: --target path:<dir>)")
    return specs


def check_unique(specs: list[str]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec in seen:
            raise UsageError(f"target {spec!r} is given twice; name each target once")
        seen.add(spec)


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
    # Hash of every loadable file of the tree that is imported (the patched copy when patched).
    content_sha: str = ""
    # path: trees: git_commit, git_branch, git_state ("clean"/"dirty") when a git work tree.
    provenance: dict[str, str] = field(default_factory=dict)
    fork_config: str | None = None
    # From the fork config: regression id -> [{file, pattern, means}] showing the fork's own fix.
    fix_markers: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    extra_standins: dict[str, dict[str, str]] = field(default_factory=dict)  # module -> symbol -> kind
    renamed_ops: dict[str, str] = field(default_factory=dict)  # our op name -> "module:Class" or "Class"
    # The patch in two parts (patching.Assessment): its text against the tree, and the fix.
    patch_text: str = ""
    patch_text_detail: str = ""
    patch_fix: str = ""
    patch_fix_detail: str = ""
    # From the fork config's [expect]: regression id -> "fixed" or "affected".
    expectations: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PreparedTarget:
        return cls(**json.loads(text))


def _installed_root() -> Path:
    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or not spec.submodule_search_locations:
        raise TargetLoadError("installed: no transformer_engine is importable in this environment; install TE, "
                              "or name a release (te-<x.y.z>) or a checkout (path:<dir>)")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    if not (package_dir / "pytorch/ops/fuser.py").is_file():
        raise TargetLoadError(f"installed: {package_dir} has no pytorch/ops/fuser.py (not TE's PyTorch part)")
    return package_dir.parent


def check_available(specs: list[str]) -> None:
    """Refuse, before any work, a spec that cannot be had on this machine (installed TE, a
    path: that is not a TE source tree)."""
    for spec in map(parse_spec, specs):
        if spec.kind == "installed":
            _installed_root()
        elif spec.kind == "path" and revisions.split(spec.value)[1] is None:
            sources.check_source_tree(Path(spec.value).expanduser())


def source_roots(specs: list[str]) -> list[Path]:
    """The trees the specs read from (path: dirs, the installed TE), for refusing an --out
    inside them; without preparing anything."""
    roots = []
    for spec in map(parse_spec, specs):
        if spec.kind == "path":
            roots.append(Path(revisions.split(spec.value)[0]).expanduser().resolve())
        elif spec.kind == "installed" and (found := importlib.util.find_spec("transformer_engine")):
            roots += [Path(p).resolve() for p in found.submodule_search_locations or []]
    return roots


def _status_path(final: Path) -> Path:
    """Where a patched copy's status and content hash are kept: beside the copy, not in it, where
    a target that ran from the copy could rewrite them with its files."""
    return final.with_name(final.name + ".status.json")


def _read_status(final: Path) -> tuple[str, str, patching.Assessment] | None:
    """The saved patch status and assessment of a patched copy, when the copy is intact."""
    try:
        saved = json.loads(_status_path(final).read_text())
        if saved["content"] == sources.content_hash(final):
            return saved["status"], saved["detail"], patching.Assessment(**saved["assessment"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _patched_copy(root: Path, key: str, patch: patching.Patch, cache: Path,
                  extra_markers: tuple[patching.Marker, ...]) -> tuple[Path, str, str, patching.Assessment]:
    """A patched copy of root's transformer_engine/ in the cache, keyed by the content of
    the source and of the patch; a copy found damaged is made again."""
    extra = sources.short_hash(json.dumps([m.__dict__ for m in extra_markers]).encode()) if extra_markers else ""
    final = cache / "patched" / f"{key}+{patch.name}-{sources.short_hash(patch.text)}{extra}"
    if saved := _read_status(final):
        return final, *saved
    with sources.file_lock(cache / "locks" / f"patched-{final.name}.lock"):
        if saved := _read_status(final):
            return final, *saved
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}-") as tmp:
            staged = Path(tmp) / "tree"
            staged.mkdir()
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(root / "transformer_engine", staged / "transformer_engine", ignore=ignore)
            for info in root.glob("transformer_engine-*.dist-info"):
                shutil.copytree(info, staged / info.name)
            status, detail, assessment = patching.apply_assessed(staged, patch, extra_markers)
            kept = json.dumps({"status": status, "detail": detail, "assessment": asdict(assessment),
                               "content": sources.content_hash(staged)})
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
            # Written once the copy is in place: a copy found without it is made again, never taken.
            sources.write_kept(_status_path(final), kept)
    return final, status, detail, assessment


def prepare(spec_text: str, cache: Path, offline: bool = False, fork_config: str | None = None) -> PreparedTarget:
    """Fetch, unpack and patch a target's source. Raises UsageError for bad input.
    `fork_config` applies to path: and installed targets (a tree's own .te-repro.toml otherwise)."""
    spec = parse_spec(spec_text)
    patch = patching.load_patch(spec.patch) if spec.patch else None
    provenance: dict[str, str] = {}
    if spec.kind == "wheel":
        wheel = sources.fetch_wheel(spec.value, cache, offline)
        root = sources.unpack_wheel(wheel, cache, f"te-{spec.value}")
        source, version, backend = wheel.name, sources.wheel_version(root), "cpu"
        if version != spec.value:
            raise UsageError(f"cached wheel {wheel} holds version {version}, not {spec.value}; delete it")
        content = sources.content_hash(root)
        key = f"te-{spec.value}-{content}"
    elif spec.kind == "path":
        directory, rev = revisions.split(spec.value)
        if rev is None:
            root = sources.check_source_tree(Path(directory).expanduser().resolve())
            source, provenance = str(root), sources.git_provenance(root)
        else:  # a commit of the tree, exported into the cache
            root, provenance = revisions.export(Path(directory), rev, cache)
            source = provenance["revision"]
        version, backend = sources.tree_version(root), "cpu"
        content = sources.content_hash(root)
        key = f"path-{content}"
    else:
        root = _installed_root()
        source, version, backend = str(root), sources.tree_version(root), "native"
        content = sources.content_hash(root)
        key = f"installed-{content}"
    config_path = forkconfig.find(root, fork_config) if spec.kind != "wheel" else None
    config, markers = forkconfig.load(config_path) if config_path else (forkconfig.ForkConfig(), {})
    if config.version and version == "unknown":  # a tree without a version file, given one by its config
        version = config.version
    status, detail, assessment = "none", "", None
    if patch is not None:
        extra = tuple(patching.Marker(**m) for fix in patch.fixes for m in markers.get(fix, []))
        root, status, detail, assessment = _patched_copy(root, key, patch, cache, extra)
        content = sources.content_hash(root)  # the patched copy's: each file is hashed once per tree
    parts = {"patch_text": assessment.text, "patch_text_detail": assessment.text_detail,
             "patch_fix": assessment.fix, "patch_fix_detail": assessment.fix_detail} if assessment else {}
    return PreparedTarget(
        spec=spec.text, kind=spec.kind, source=source, root=str(root), version=version,
        fuser_sha=sources.fuser_hash(root), patch=spec.patch, patch_status=status,
        patch_detail=detail, backend=backend, content_sha=content, provenance=provenance,
        fork_config=str(config_path) if config_path else None, fix_markers=markers,
        extra_standins={module: dict(symbols) for module, symbols in config.standins.items()}, renamed_ops=config.renamed_ops, expectations=dict(config.expect),
        **parts,
    )
