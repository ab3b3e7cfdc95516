"""The release cache is checked against what a target cannot rewrite: an unpacked tree against
the RECORD inside the wheel archive, the wheel against the sha256 the package index gave when it
was downloaded (kept beside the wheel, outside every tree). A tree that ran once can rewrite its
own files and its own RECORD; neither may change what a later run loads as "TE as shipped".

Every test works on a private copy of the cache (only the wheel it needs), never on the shared one.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from harness import targets
from harness.targets import sources
from tests.conftest import repro

FUSER = sources.FUSER_RELPATH
VERSION = "2.13.0"
TAMPERED = b"\nTAMPERED_IN_THE_CACHE = True  # a hostile tree's edit\n"
SHADOW = "transformer_engine/pytorch/ops/fuser/__init__.py"  # Python prefers a package to fuser.py


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _resign(record: str, changes: dict[str, bytes]) -> str:
    """The RECORD text with each changed path's row made to match its new bytes (added when new)."""
    rows = [row for row in csv.reader(io.StringIO(record)) if row]
    listed = {row[0] for row in rows}
    rows = [[row[0], _record_digest(changes[row[0]]), str(len(changes[row[0]]))] if row[0] in changes else row
            for row in rows]
    rows += [[name, _record_digest(data), str(len(data))] for name, data in changes.items() if name not in listed]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


@pytest.fixture
def private(tmp_path: Path, cache: Path) -> Path:
    """A cache holding only te-2.13.0's wheel (and its recorded digest, where the shared cache has one)."""
    wheel = next((cache / "wheels").glob(f"transformer_engine-{VERSION}-*.whl"))
    private = tmp_path / "cache"
    (private / "wheels").mkdir(parents=True)
    shutil.copy(wheel, private / "wheels")
    kept = wheel.with_name(wheel.name + ".sha256")
    if kept.is_file():
        shutil.copy(kept, private / "wheels")
    return private


def _wheel(private: Path) -> Path:
    return next((private / "wheels").glob("*.whl"))


def _resign_tree(root: Path, changes: dict[str, bytes]) -> None:
    """What a tree that ran once can do: rewrite its files and fix their rows in its own RECORD."""
    for name, data in changes.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    record = next(root.glob("transformer_engine-*.dist-info/RECORD"))
    record.write_text(_resign(record.read_text(), changes))
    rows = [row for row in csv.reader(io.StringIO(record.read_text())) if row]
    assert all(_record_digest((root / row[0]).read_bytes()) == row[1] for row in rows if row[1])  # it agrees with itself
    assert {row[0] for row in rows} == {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _resign_wheel(wheel: Path, changes: dict[str, bytes]) -> None:
    """A wheel rewritten the same way: still a sound zip whose RECORD matches its members."""
    with zipfile.ZipFile(wheel) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    record = next(name for name in members if name.endswith(".dist-info/RECORD"))
    members.update(changes)
    members[record] = _resign(members[record].decode(), changes).encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _fuser_as_shipped(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(FUSER.as_posix())


@pytest.mark.parametrize("edit", ["fuser_edited", "package_added"])
def test_a_release_resigned_through_its_own_record_is_unpacked_again(private: Path, edit: str) -> None:
    root = Path(targets.prepare(f"te-{VERSION}", private, offline=True).root or "")
    shipped = _fuser_as_shipped(_wheel(private))
    if edit == "fuser_edited":
        _resign_tree(root, {FUSER.as_posix(): shipped + TAMPERED})
    else:
        _resign_tree(root, {SHADOW: b"OperationFuser = None\n"})
    again = Path(targets.prepare(f"te-{VERSION}", private, offline=True).root or "")
    assert (again / FUSER).read_bytes() == shipped  # the tampered line is gone
    assert not (again / SHADOW).exists()
    with zipfile.ZipFile(_wheel(private)) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        assert (again / record).read_bytes() == archive.read(record)  # the tree's RECORD is the wheel's again


def test_a_tampered_wheel_is_refused_offline_with_one_line(private: Path) -> None:
    targets.prepare(f"te-{VERSION}", private, offline=True)  # the first use, before any target code ran
    wheel = _wheel(private)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    _resign_wheel(wheel, {FUSER.as_posix(): _fuser_as_shipped(wheel) + TAMPERED})
    shutil.rmtree(private / "src")  # or the intact tree from before would hide the wheel's state
    result = repro("targets", f"te-{VERSION}", "--offline", env={**os.environ, sources.CACHE_ENV: str(private)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert str(wheel) in lines[0] and "sha256" in lines[0] and "without --offline" in lines[0], lines[0]
    assert not list((private / "src").glob(f"te-{VERSION}/**/fuser.py"))  # nothing unpacked from it
    kept = json.loads(wheel.with_name(wheel.name + ".sha256").read_text())  # at download, else at the first use
    assert kept["wheel"] == wheel.name and kept["sha256"] == digest, kept


def test_a_tampered_wheel_is_downloaded_again(private: Path) -> None:
    """Online: the digest comes from the package index (asked once for a wheel cached before
    digests were kept), and a wheel that no longer matches it is fetched again."""
    original = _wheel(private).read_bytes()
    root = Path(targets.prepare(f"te-{VERSION}", private).root or "")
    _resign_wheel(_wheel(private), {FUSER.as_posix(): _fuser_as_shipped(_wheel(private)) + TAMPERED})
    _resign_tree(root, {FUSER.as_posix(): _fuser_as_shipped(_wheel(private))})  # the tree made to agree with it
    again = Path(targets.prepare(f"te-{VERSION}", private).root or "")
    assert _wheel(private).read_bytes() == original
    assert TAMPERED not in (again / FUSER).read_bytes()
    sidecar = _wheel(private).with_name(_wheel(private).name + ".sha256")
    kept = json.loads(sidecar.read_text())
    assert kept["sha256"] == hashlib.sha256(original).hexdigest() and kept["from"] == "index", kept
    assert not sidecar.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)  # written once, read-only


def test_a_resigned_megatron_tree_is_unpacked_again(tmp_path: Path, cache: Path) -> None:
    """megatron-core's wheels go through the same fetch and unpack."""
    from harness.megatron.source import DEFAULT_VERSION, MARKER, prepare_megatron

    wheel = next((cache / "wheels").glob(f"megatron_core-{DEFAULT_VERSION}-*.whl"))
    private = tmp_path / "cache"
    (private / "wheels").mkdir(parents=True)
    shutil.copy(wheel, private / "wheels")
    root = Path(prepare_megatron(DEFAULT_VERSION, private, offline=True).root)
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read(MARKER.as_posix())
    (root / MARKER).write_bytes(shipped + TAMPERED)
    record = next(root.glob("megatron_core-*.dist-info/RECORD"))
    record.write_text(_resign(record.read_text(), {MARKER.as_posix(): shipped + TAMPERED}))
    again = Path(prepare_megatron(DEFAULT_VERSION, private, offline=True).root)
    assert (again / MARKER).read_bytes() == shipped


def test_a_patched_copy_resigned_through_its_own_status_is_made_again(private: Path) -> None:
    """te-2.13.0+backport is a patched copy in the cache; what vouches for it must lie outside it too."""
    root = Path(targets.prepare(f"te-{VERSION}+backport", private, offline=True).root or "")
    fixed = (root / FUSER).read_bytes()
    (root / FUSER).write_bytes(fixed + TAMPERED)
    status = root / ".patch-status.json"  # where the copy kept its own content hash
    saved = json.loads(status.read_text()) if status.is_file() else {}
    status.write_text(json.dumps({**saved, "content": sources.content_hash(root)}))
    again = Path(targets.prepare(f"te-{VERSION}+backport", private, offline=True).root or "")
    assert (again / FUSER).read_bytes() == fixed
