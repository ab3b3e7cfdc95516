"""Hostile input, tried as a new user would (`python -m repro ...` in a subprocess): each
attack gives one line on stderr, exit status 2 (or the documented behaviour), and leaves
nothing behind. Targets come from the shared cache; a damaged cache is a private copy."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import targets
from harness.errors import UsageError
from harness.runner import rundir, sandbox
from harness.runner.completeness import incomplete_reason
from harness.targets import forkconfig, patching, sources
from repro.reports import show_command
from tests.conftest import REPO
from tests.fault_plugin import ENV, PLUGIN
from tests.processes import alive

ORPHAN_ENV = "REPRO_TEST_ORPHAN_PIDS"

SMOKE = ["--matrix", "smoke", "--only", "pipeline=rmsnorm", "-n", "1"]
FUSER = sources.FUSER_RELPATH


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "repro", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, check=False)


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under root (symlinks as their target) with its content hash."""
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.fixture(scope="module")
def release_root(cache: Path) -> Path:
    return Path(targets.prepare("te-2.13.0", cache).root or "")


@pytest.fixture
def fork(release_root: Path, tmp_path: Path) -> Path:
    """A fork's checkout: a git work tree holding a copy of 2.13.0's transformer_engine/."""
    root = tmp_path / "te-2.13.0+ascend"  # a path with a '+' that is not a patch
    shutil.copytree(release_root / "transformer_engine", root / "transformer_engine")
    (root / "build_tools").mkdir()
    (root / "build_tools/VERSION.txt").write_text("2.13.0.dev0+ascend\nsecond line\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q", "-b", "npu-main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fork"], check=True)
    return root


# ---- options, refused before anything is written ----

BAD_OPTIONS = {
    "empty --targets": (["--targets", ""], "names no target"),
    "only commas": (["--targets", ",,,"], "names no target"),
    "empty item": (["--targets", "te-2.13.0,,te-2.16.0"], "empty item"),
    "duplicate target": (["--targets", "te-2.13.0,te-2.13.0"], "given twice"),
    "no workers": (["-n", "0"], "give 1 or more"),
    "negative workers": (["-n", "-3"], "give 1 or more"),
    "more workers than CPUs": (["-n", "100000"], "CPUs this machine gives; give 1 to"),
    "control character in a target path": (["--target", "path:/tmp/te\nfork"], "control character '\\n'"),
    "escape sequence in a target path": (["--target", "path:/tmp/te\x1b[31m"], "control character '\\x1b'"),
    "zero case timeout": (["--case-timeout", "0"], "above 0"),
    "nan case timeout": (["--case-timeout", "nan"], "above 0"),
    "case timeout that overflows the timers": (["--case-timeout", "99999999999"], "at most"),
    "zero load timeout": (["--load-timeout", "0"], "above 0"),
    "zero max cases": (["--max-cases", "0"], "give 1 or more"),
    "repeated --only axis": (["--only", "pipeline=rmsnorm", "--only", "pipeline=identity"], "given twice"),
    "short version": (["--targets", "te-2.13"], "write te-2.13.0"),
    "non-canonical version": (["--targets", "te-2.6.0post1"], "te-2.6.0.post1"),
    "unknown patch": (["--targets", "te-2.13.0+nopatch"], "valid patches: backport"),
    "path without dir": (["--targets", "path:"], "names no directory"),
    "missing path": (["--targets", "path:/nonexistent/te"], "is not a directory"),
    "installed without TE": (["--targets", "installed"], "no transformer_engine is importable"),
    "fork config for a release": (["--targets", "te-2.13.0", "--fork-config", "x.toml"], "applies to path:"),
    "missing fork config": (["--targets", "path:.", "--fork-config", "/nonexistent.toml"], "no such file"),
    "unknown option": (["--bogus"], "unrecognized arguments"),
}


@pytest.mark.parametrize("name", BAD_OPTIONS)
def test_bad_option_is_one_line_and_writes_nothing(name: str, tmp_path: Path) -> None:
    args, fragment = BAD_OPTIONS[name]
    if name == "installed without TE" and importlib_has_te():
        pytest.skip("this machine has a transformer_engine installed")
    out = tmp_path / "out"
    assert_refused(cli("run", *args, "--out", str(out)), fragment)
    assert not out.exists()


def importlib_has_te() -> bool:
    """Whether a fresh interpreter (as `repro` runs) finds a transformer_engine: this test
    process may hold a loaded target in sys.modules."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('transformer_engine') is None)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


def test_minimal_on_installed_without_te() -> None:
    if importlib_has_te():
        pytest.skip("this machine has a transformer_engine installed")
    assert_refused(cli("minimal", "--target", "installed"), "no transformer_engine is importable")


def test_out_inside_a_source_or_the_cache_is_refused(fork: Path, cache: Path) -> None:
    inside_tree = fork / "transformer_engine" / "runs"
    assert_refused(cli("run", *SMOKE, "--targets", f"path:{fork}", "--out", str(inside_tree)), "inside the source tree")
    inside_cache = cache / "my-run"
    assert_refused(cli("run", *SMOKE, "--targets", "te-2.13.0", "--out", str(inside_cache)), "inside the target cache")
    assert not inside_tree.exists() and not inside_cache.exists()


def test_show_commands_are_shell_quoted() -> None:
    command = show_command("issue22:ops-rmsnorm-enabled-leaf-trainable-none-single-dense-float32-cpu", "path:/my fork/te;rm -rf x")
    words = shlex.split(command)
    assert words[words.index("--target") + 1] == "path:/my fork/te;rm -rf x"


# ---- target specs of forks: '+' and ',' in paths ----

def test_plus_in_a_path_is_a_patch_only_when_the_patch_exists(fork: Path, tmp_path: Path) -> None:
    assert targets.parse_spec(f"path:{fork}").value == str(fork)  # te-2.13.0+ascend: 'ascend' is no patch
    spec = targets.parse_spec(f"path:{fork}+backport")
    assert (spec.value, spec.patch) == (str(fork), "backport")
    literal = targets.parse_spec(f"path:{tmp_path}/te+backport/")
    assert literal.patch is None and literal.value.endswith("te+backport/")


def test_a_path_with_a_comma_is_passed_with_target(fork: Path, tmp_path: Path) -> None:
    comma = tmp_path / "te,npu"
    fork.rename(comma)
    from repro.validate import target_specs

    assert target_specs(None, [f"path:{comma}", "te-2.13.0"], ()) == [f"path:{comma}", "te-2.13.0"]
    prepared = targets.prepare(f"path:{comma}", sources.cache_dir())
    assert prepared.source == str(comma)


# ---- content-addressed sources ----

def test_editing_any_loaded_file_gives_a_new_patched_copy(fork: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = targets.prepare(f"path:{fork}+backport", cache)
    sequential = fork / "transformer_engine/pytorch/ops/sequential.py"
    sequential.write_text(sequential.read_text() + "\n# a fork's edit\n")
    after = targets.prepare(f"path:{fork}+backport", cache)
    assert after.content_sha != before.content_sha and after.root != before.root
    assert after.fuser_sha == before.fuser_sha  # fuser.py alone would not have told them apart
    assert (Path(after.root or "") / "transformer_engine/pytorch/ops/sequential.py").read_text().endswith("edit\n")
    assert before.provenance["git_state"] == "clean" and after.provenance["git_state"] == "dirty"
    head = subprocess.run(["git", "-C", str(fork), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout
    assert after.provenance["git_commit"] == head.strip() and after.provenance["git_branch"] == "npu-main"
    assert after.version == "2.13.0.dev0+ascend"


def test_editing_a_basic_op_changes_the_patched_result(fork: Path) -> None:
    assert "completed" in cli("minimal", "--target", f"path:{fork}+backport").stdout
    op = fork / "transformer_engine/pytorch/ops/basic/make_extra_output.py"
    op.write_text(op.read_text().replace("    def op_forward(", "    def op_forward_renamed_by_fork(", 1))
    result = cli("minimal", "--target", f"path:{fork}+backport")
    assert "completed" not in result.stdout, result.stdout


def _private_cache(tmp_path: Path, cache: Path) -> Path:
    private = tmp_path / "cache"
    (private / "wheels").mkdir(parents=True)
    for wheel in (cache / "wheels").glob("transformer_engine-2.13.0-*.whl"):
        shutil.copy(wheel, private / "wheels")
    return private


def test_damaged_unpacked_sources_are_unpacked_again(tmp_path: Path, cache: Path) -> None:
    private = _private_cache(tmp_path, cache)
    root = Path(targets.prepare("te-2.13.0", private, offline=True).root or "")
    good = (root / FUSER).read_bytes()
    (root / FUSER).write_bytes(good[: len(good) // 2])  # truncated
    (root / "transformer_engine/pytorch/ops/sequential.py").unlink()  # missing
    again = targets.prepare("te-2.13.0", private, offline=True)
    assert (Path(again.root or "") / FUSER).read_bytes() == good
    assert (Path(again.root or "") / "transformer_engine/pytorch/ops/sequential.py").is_file()
    (root / "transformer_engine/pytorch/ops/fuser").mkdir()  # added alone: Python prefers it to fuser.py
    (root / "transformer_engine/pytorch/ops/fuser/__init__.py").write_text("OperationFuser = None\n")
    targets.prepare("te-2.13.0", private, offline=True)
    assert not (root / "transformer_engine/pytorch/ops/fuser").exists()
    patched = Path(targets.prepare("te-2.13.0+backport", private, offline=True).root or "")
    fixed = (patched / FUSER).read_text()
    (patched / FUSER).write_text(fixed.replace("set_output_requires_grad", "edited_in_the_cache"))
    assert (Path(targets.prepare("te-2.13.0+backport", private, offline=True).root or "") / FUSER).read_text() == fixed


def test_truncated_wheel_is_refused_with_what_to_delete(tmp_path: Path, cache: Path) -> None:
    private = _private_cache(tmp_path, cache)
    wheel = next((private / "wheels").glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:100_000])
    result = cli("minimal", "--target", "te-2.13.0", "--offline", env={"TE_REPRO_CACHE": str(private)})
    assert_refused(result, "damaged", "delete it", str(wheel))
    assert not (private / "src").exists() or not any((private / "src").iterdir())


def test_symlinked_source_file_is_refused(fork: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text((fork / FUSER).read_text())
    (fork / FUSER).unlink()
    (fork / FUSER).symlink_to(outside)
    assert_refused(cli("targets", f"path:{fork}"), "symlink", "outside the tree")


# ---- never write into a source ----

def test_a_run_leaves_the_tree_byte_identical_without_pythondontwritebytecode(fork: Path, tmp_path: Path) -> None:
    before = tree_digest(fork)
    scratch = tmp_path / "tmp"  # and nothing outside the run dir either: the commands' temporary directory stays empty
    scratch.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "TMPDIR": str(scratch)}
    spec = f"path:{fork}"
    for args in (["run", *SMOKE, "--targets", f"{spec},{spec}+backport", "--out", str(tmp_path / "out")],
                 ["minimal", "--target", spec], ["targets", spec]):
        result = subprocess.run([sys.executable, "-m", "repro", *args], capture_output=True, text=True, cwd=REPO,
                                env=env, check=False)
        assert result.returncode == 0, result.stderr
        assert not list(scratch.iterdir()), args
    assert tree_digest(fork) == before


# ---- the run dir ----

def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(status.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG and the subreaper are Linux's")
def test_second_run_refused_stale_reports_removed_and_sigkill_ends_every_process(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.MARKER_NAME).write_text("")  # an earlier run's dir
    for stale in ("report.md", "report.html", "junit.xml", "run.json"):
        (out / stale).write_text("from an earlier run")
    # The first case leaves a process of its own session (setsid) behind; the second hangs.
    faults = {"issue22:ops-rmsnorm-enabled-leaf-trainable-none-single-dense-float32-cpu": "orphan",
              "issue22:ops-rmsnorm-enabled-leaf-trainable-checkpoint_reentrant-single-dense-float32-cpu": "hang"}
    command = [sys.executable, "-m", "repro", "run", *SMOKE, "--targets", "te-2.20.2", "--out", str(out)]
    # Unsandboxed: the orphan notes its pid in a file outside (in a sandbox it could not, and it would
    # end with the sandbox's PID namespace anyway); this is the reaper's work, for --no-sandbox.
    env = {**os.environ, ENV: json.dumps(faults), "PYTEST_PLUGINS": PLUGIN, ORPHAN_ENV: str(tmp_path / "orphans"),
           sandbox.DISABLE_ENV: "1"}
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (out / "run-meta.json").is_file():  # written before any session
            time.sleep(0.2)
        assert (out / "run-meta.json").is_file()
        assert not any((out / stale).exists() for stale in ("report.md", "report.html", "junit.xml", "run.json"))
        while time.time() < deadline and len(_descendants(first.pid)) < 2:  # session controller and its worker
            time.sleep(0.2)
        second = cli("run", *SMOKE, "--targets", "te-2.20.2", "--out", str(out))
        assert_refused(second, "another repro run is writing to")
        orphans = _orphans(tmp_path / "orphans", timeout=120)
        processes = _descendants(first.pid) | set(orphans)
        assert orphans and all(map(alive, orphans))
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(map(alive, processes)):
        time.sleep(0.2)
    assert not [pid for pid in processes if alive(pid)]


def test_a_run_into_an_earlier_runs_dir_judges_only_its_own_observations(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = ["run", *SMOKE, "--only", "grad_mode=no_grad", "--targets", "te-2.20.2", "--out", str(out)]
    assert cli(*command).returncode == 0
    again = cli(*command)  # the default --out is runs/<matrix>: running twice is the usual way
    run = json.loads((out / "run.json").read_text())
    assert run["rejected"] == [] and again.returncode == 0, again.stdout + again.stderr
    assert not any(p.name.startswith(".scratch-") for p in out.iterdir())


def test_disk_full_is_one_line_and_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(rundir.DiskFull, match="disk full writing .*results.jsonl.*repro report"):
        rundir.write_atomic(tmp_path / "run.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_disk_full_while_unpacking_keeps_the_wheel(tmp_path: Path, cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A write error is the cache's, not the wheel's: under --offline the wheel may be the only copy."""
    import errno
    import zipfile

    wheel = next((cache / "wheels").glob("transformer_engine-2.13.0-*.whl"))
    private = tmp_path / "cache"
    (private / "wheels").mkdir(parents=True)
    shutil.copy(wheel, private / "wheels" / wheel.name)

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "extractall", full)
    with pytest.raises(UsageError, match="No space left on device.*the wheel is kept") as refused:
        sources.unpack_wheel(private / "wheels" / wheel.name, private, "te-2.13.0")
    assert "delete" not in str(refused.value)
    assert (private / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    assert not (private / "src" / "te-2.13.0").exists()


# ---- incomplete is a failure ----

def test_target_segfaulting_on_every_affected_case_gets_every_record(tmp_path: Path) -> None:
    from cases.matrix import generate

    only = ["pipeline=extra_output_only", "dtype=float32", "device=cpu", "sequence=single", "params=trainable",
            "recompute=none,checkpoint_reentrant"]
    (selection,) = generate("issue22", only)
    cases = selection.cases
    faults = {c.case_id: "segfault" for c in cases if selection.regression.predict(c).expected == "affected"}
    assert len(faults) > 5  # more crashes than xdist's default worker restarts
    args = [a for item in only for a in ("--only", item)]
    result = cli("run", *args, "--targets", "te-2.16.0", "-n", "1", "--out", str(tmp_path),
                 env={ENV: json.dumps(faults), "PYTEST_PLUGINS": PLUGIN})
    run = json.loads((tmp_path / "run.json").read_text())
    assert {r["case_id"] for r in run["results"]} == {c.case_id for c in cases}, result.stderr
    assert all(r["outcome"] == "crash" for r in run["results"] if r["case_id"] in faults)
    assert run["not_run"] == [] and incomplete_reason(run) is None
    assert result.returncode != 0  # crashes on a fixed release


NO_GRAD_FORWARD = """        else:
            forward_func = _OperationFuserAutogradFunction.forward
"""


def test_a_tree_that_segfaults_costs_a_fork_per_crash_not_a_worker(fork: Path, tmp_path: Path) -> None:
    """The fuser itself segfaults on every forward without grad (issue 46's tree): each crash is
    recorded against its case, with its signal, and the worker goes on (its case child is forked
    again), so xdist never replaces it."""
    fuser = fork / FUSER
    assert NO_GRAD_FORWARD in fuser.read_text()
    fuser.write_text(fuser.read_text().replace(NO_GRAD_FORWARD, NO_GRAD_FORWARD.replace(
        "else:\n", "else:\n            __import__('ctypes').string_at(0)\n")))
    out = tmp_path / "run"
    result = cli("run", "--matrix", "smoke", "--only", "pipeline=rmsnorm,extra_output_only", "--target",
                 f"path:{fork}", "-n", "1", "--out", str(out))
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] and incomplete_reason(run) is None, result.stderr
    crashed = [r for r in run["results"] if r["outcome"] == "crash"]
    assert len(crashed) > 5 and len(crashed) < len(run["results"])  # more crashes than xdist's default restarts
    assert {r["case_id"] for r in run["results"] if r["grad_mode"] == "no_grad"} <= {r["case_id"] for r in crashed}
    for record in crashed:
        assert record["error"]["type"] == "WorkerDied" and record["error"]["message"] == "worker died", record["error"]
        assert "killed by signal 11 (SIGSEGV)" in record["error"]["traceback"], record["error"]
    started = [json.loads(line) for p in (out / "sessions").glob("*.inflight.jsonl") for line in p.read_text().splitlines()]
    assert {line["worker"] for line in started} == {"gw0"}  # one worker ran every case: xdist replaced none
    assert not list((out / "sessions").glob("*.follow-up-*.cases.json"))  # no case was left to a follow-up session


def test_missing_results_give_one_line_reason() -> None:
    run = {"results": [], "complete": False, "missing": 2,
           "not_run": [{"target": "te-2.16.0", "case_id": "a", "reason": "its session exited with status 1"},
                       {"target": "te-2.16.0", "case_id": "b", "reason": "its session exited with status 1"}]}
    reason = incomplete_reason(run)
    assert reason and "2 case results missing" in reason and "status 1" in reason and "\n" not in reason
    assert incomplete_reason({"results": [], "complete": False, "missing": 3}) is not None
    assert incomplete_reason({"results": [], "complete": True, "not_run": []}) is None


# ---- reading runs ----

@pytest.fixture
def partial_run(tmp_path: Path) -> Path:
    fixture = json.loads((REPO / "tests/fixtures/run-small/run.json").read_text())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = [json.dumps(r) for r in fixture["results"][:3]]
    lines = [good[0].encode(), b"[1, 2]", b'{"case_id": "x"}', b"\xff\xfe not utf-8", b"{not json",
             *map(str.encode, good[1:])]
    (run_dir / "results.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    specs = list(dict.fromkeys(r["target"] for r in fixture["results"][:3]))
    (run_dir / "run-meta.json").write_text(json.dumps({"matrix": "smoke", "targets": specs}))
    return run_dir


def test_bad_results_lines_are_reported_not_fatal(partial_run: Path) -> None:
    result = cli("report", str(partial_run), "--format", "md")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    for problem in ("line 2: not a JSON object", "line 3: record lacks", "line 4: not UTF-8", "line 5: corrupt"):
        assert problem in result.stdout + result.stderr


def test_run_json_without_results_is_refused(partial_run: Path) -> None:
    (partial_run / "run.json").write_text(json.dumps({"schema": "repro.run/2", "environment": {"targets": []}}))
    assert_refused(cli("report", str(partial_run)), "has no results list")


def test_report_never_overwrites_its_inputs(partial_run: Path, tmp_path: Path) -> None:
    (partial_run / "review.json").write_text("{}")
    (partial_run / "sessions").mkdir()
    (partial_run / "sessions" / "x.log").write_text("log")
    hard_link = tmp_path / "elsewhere.md"
    os.link(partial_run / "results.jsonl", hard_link)
    before = tree_digest(partial_run)
    for victim in ("results.jsonl", "run-meta.json", "run.json", "review.json", "sessions/x.log"):
        assert_refused(cli("report", str(partial_run), "-o", str(partial_run / victim)), "run's own", victim)
    assert_refused(cli("report", str(partial_run), "-o", str(hard_link)), "run's own results.jsonl")
    # $GITHUB_STEP_SUMMARY is appended to: never a file of the run dir, by name or by link.
    (tmp_path / "summary-link").symlink_to(partial_run / "run-meta.json")
    for summary in (partial_run / "run.json", tmp_path / "summary-link", hard_link):
        assert_refused(cli("report", str(partial_run), env={"GITHUB_STEP_SUMMARY": str(summary)}), "run dir's own")
    out = tmp_path / "new-run"
    assert_refused(cli("run", *SMOKE, "--out", str(out), env={"GITHUB_STEP_SUMMARY": str(out / "run.json")}),
                   "run dir's own run.json")
    assert not out.exists()
    assert tree_digest(partial_run) == before


def test_paths_with_control_characters_are_one_line(partial_run: Path, tmp_path: Path) -> None:
    for bad in ("o\nline", "o\x1b[31mred", "o\u202egnp.md"):
        out = tmp_path / bad
        assert_refused(cli("run", *SMOKE, "--out", str(out)), "output path", "control character")
        assert_refused(cli("report", str(partial_run), "-o", str(out)), "output path", "control character")
        assert_refused(cli("targets", "te-2.13.0", "--cache-dir", str(out)), "cache dir", "control character")
        assert not out.exists()


# ---- patches and fork configs ----

def _patch_dir(tmp_path: Path, toml: str, patch: bytes | None = None) -> Path:
    patches = tmp_path / "patches"
    patches.mkdir(exist_ok=True)
    (patches / "p.toml").write_text(toml)
    if patch is not None:
        (patches / "p.patch").write_bytes(patch)
    return patches


HUNK = b"--- a/transformer_engine/x.py\n+++ b/transformer_engine/x.py\n@@ -1 +1 @@\n-a\n+b\n"
BAD_PATCHES = {
    "symlink": (b"diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc\n",
                "symlink"),
    "binary": (b"diff --git a/x.bin b/x.bin\nGIT binary patch\nliteral 1\nIc${iG0\n", "binary"),
    "not utf-8": (HUNK.replace(b"+b", b"+\xff\xfe"), "not UTF-8"),
    "deletes fuser.py": (b"--- a/transformer_engine/pytorch/ops/fuser.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n",
                         "deletes transformer_engine/pytorch/ops/fuser.py"),
    "climbs out": (HUNK.replace(b"transformer_engine/x.py", b"../x.py"), "outside the source tree"),
}


@pytest.mark.parametrize("name", BAD_PATCHES)
def test_unsafe_patch_is_refused(name: str, tmp_path: Path) -> None:
    text, fragment = BAD_PATCHES[name]
    with pytest.raises(UsageError, match=fragment):
        patching.load_patch("p", _patch_dir(tmp_path, 'patch = "p.patch"\n', text))


BAD_TOMLS = {
    "malformed": ("patch = \n", "not valid TOML"),
    "unknown key": ('patch = "p.patch"\nfixed = ["issue22"]\n', "unknown keys"),
    "patch outside patches/": ('patch = "../p.patch"\n', "without '..'"),
    "absolute patch": ('patch = "/etc/passwd"\n', "relative to the tree"),
    "marker outside the tree": (('patch = "p.patch"\n[[recognise]]\nfile = "../../etc/passwd"\npattern = "x"\n'
                                 'means = "m"\n'), "without '..'"),
    "marker missing means": ('patch = "p.patch"\n[[recognise]]\nfile = "a.py"\npattern = "x"\n', "exactly"),
    "bad regex": ('patch = "p.patch"\n[[recognise]]\nfile = "a.py"\npattern = "("\nmeans = "m"\n', "regular expr"),
    "fixes not a list": ('patch = "p.patch"\nfixes = "issue22"\n', "list of regression ids"),
}


@pytest.mark.parametrize("name", BAD_TOMLS)
def test_bad_patch_description_is_refused(name: str, tmp_path: Path) -> None:
    toml, fragment = BAD_TOMLS[name]
    with pytest.raises(UsageError, match=fragment) as raised:
        patching.load_patch("p", _patch_dir(tmp_path, toml, HUNK))
    assert "\n" not in str(raised.value)


def test_new_patch_format_with_several_markers(tmp_path: Path) -> None:
    toml = ('description = "d"\npatch = "p.patch"\nfixes = ["issue22"]\n'
            '[[recognise]]\nfile = "a.py"\npattern = "one"\nmeans = "first"\n'
            '[[recognise]]\nfile = "b.py"\npattern = "two"\nmeans = "second"\n')
    patch = patching.load_patch("p", _patch_dir(tmp_path, toml, HUNK))
    assert patch.fixes == ("issue22",) and [m.means for m in patch.markers] == ["first", "second"]
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "b.py").write_text("two")
    status, detail = patching.apply_patch(tree, patch)
    assert status == "already-applied" and detail.startswith("stale (") and detail.endswith("upstream marker: second")


def test_fork_config_markers_and_a_bad_config(fork: Path, tmp_path: Path) -> None:
    (fork / forkconfig.TREE_FILE).write_text('[[fixes.issue22]]\nfile = "transformer_engine/pytorch/ops/fuser.py"\n'
                                             'pattern = "npu_guard"\nmeans = "the fork\'s guard"\n')
    prepared = targets.prepare(f"path:{fork}", tmp_path / "cache")
    assert prepared.fix_markers == {"issue22": [{"file": "transformer_engine/pytorch/ops/fuser.py",
                                                 "pattern": "npu_guard", "means": "the fork's guard"}]}
    bad = tmp_path / "bad.toml"
    bad.write_text('[standins."transformer_engine.pytorch.fp8"]\nnpu = "maybe"\n')
    assert_refused(cli("targets", f"path:{fork}", "--fork-config", str(bad)), "fork config", "standins")
    # Stand-ins only for what is absent: never the tree's package, nor the backend's extension.
    for module, what in (("transformer_engine", "the tree's own package"),
                         ("transformer_engine_torch", "the backend's extension"),
                         ("transformer_engine_torch.fused", "the backend's extension"),
                         ("transformer_engine_torch_npu", "the backend's extension")):
        bad.write_text(f'[standins."{module}"]\nfp8_available = "true"\n')
        assert_refused(cli("targets", f"path:{fork}", "--fork-config", str(bad)), "fork config", what)


def test_input_files_nested_deep_huge_or_not_utf8_are_one_line(tmp_path: Path, fork: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    assert_refused(cli("targets", f"path:{fork}", "--fork-config", str(deep)), "too deep")
    huge = tmp_path / "huge.toml"
    huge.write_text('[standins."npu_platform"]\n' + "".join(f'x{i} = "false"\n' for i in range(12000)))
    assert_refused(cli("targets", f"path:{fork}", "--fork-config", str(huge)), "at most 32 KiB")
    run = json.loads((REPO / "tests/fixtures/run-small/run.json").read_text())
    run["results"][0]["detail"] = json.loads("[" * 900 + "]" * 900)  # within the decoder's depth, not the checks'
    for name, data in (("not-utf8", b"\xff\xfe{}"), ("deep", b"[" * 100000 + b"]" * 100000),
                       ("deep-value", json.dumps(run).encode())):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_bytes(data)
        assert_refused(cli("report", str(tmp_path / name)), "cannot read", "run.json")
    # A results.jsonl line nested too deep is one skipped line, not the end of the report.
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "results.jsonl").write_text("[" * 5000 + "]" * 5000 + "\n")
    records, problems = rundir.read_results(tmp_path / "lines" / "results.jsonl")
    assert records == [] and problems == ["results.jsonl line 1: nested too deep for a record, skipped"]


def test_symlink_loops_and_a_lock_dir_that_is_a_file_are_one_line(tmp_path: Path, cache: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = str(tmp_path / "a")
    assert_refused(cli("targets", f"path:{loop}"), "symlink loop")
    assert_refused(cli("run", *SMOKE, "--out", loop), "symlink loop")
    assert_refused(cli("run", *SMOKE, "--target", f"path:{loop}", "--out", str(tmp_path / "o")), "symlink loop")
    private = tmp_path / "cache"
    (private / "wheels").mkdir(parents=True)
    wheel = next((cache / "wheels").glob("transformer_engine-2.13.0-*.whl"))
    os.link(wheel, private / "wheels" / wheel.name)
    (private / "locks").write_text("not a directory")
    assert_refused(cli("targets", "te-2.13.0", "--cache-dir", str(private), "--offline"), "cache lock", "remove")


def test_a_marker_that_backtracks_without_bound_is_one_line(fork: Path, tmp_path: Path) -> None:
    """A fork config's marker is searched under a time bound: on fuser.py, (\\w|\\w)*! tries
    2^n ways per identifier and would never end."""
    config = tmp_path / "fork.toml"
    config.write_text(f'[[fixes.issue22]]\nfile = "{FUSER}"\npattern = "(\\\\w|\\\\w)*!"\nmeans = "the guard"\n')
    out = tmp_path / "out"
    result = cli("run", *SMOKE, "--target", f"path:{fork}", "--fork-config", str(config), "--out", str(out))
    assert_refused(result, "marker pattern", "backtracks without bound")
    assert not out.exists()


def test_fork_load_errors_name_file_line_module_and_symbol(fork: Path, tmp_path: Path) -> None:
    op = fork / "transformer_engine/pytorch/ops/op.py"
    original = op.read_text()
    op.write_text(original.replace("\nimport torch\n", "\nimport torch\nimport torch_npu\n", 1))
    line = op.read_text().splitlines().index("import torch_npu") + 1
    out = cli("targets", f"path:{fork}").stdout
    assert f"transformer_engine/pytorch/ops/op.py:{line} imports module torch_npu" in out, out

    # A symbol the fork's own module lacks is named; the fork's own real submodule of tensor/ loads.
    (fork / "transformer_engine/pytorch/tensor/npu_tensor.py").write_text("NPU_TENSOR = 1\n")
    op.write_text(original.replace("\nimport torch\n", "\nimport torch\nfrom ..quantization import npu_on\n"
                                   "from ..tensor.npu_tensor import NPU_TENSOR\n", 1))
    out = cli("targets", f"path:{fork}").stdout
    assert "op.py:" in out and "imports npu_on from transformer_engine.pytorch.quantization, which has no such name" \
        in out, out
    # A fork's own extension may be a module object with no import name: the statement names the module.
    op.write_text(original.replace("\nimport torch\n", "\nimport torch\nimport sys, types\n"
                                   "_npu = types.ModuleType('npu'); del _npu.__name__; sys.modules['npu_ext'] = _npu\n"
                                   "from npu_ext import npu_kernel\n", 1))
    out = cli("targets", f"path:{fork}").stdout
    assert "imports npu_kernel from npu_ext, which has no such name" in out and "unknown" not in out, out
    # A tree written for another torch (an older fork: torch.onnx._type_utils is gone from torch 2.13) says so.
    op.write_text(original.replace("\nimport torch\n", "\nimport torch\nfrom torch.onnx import _no_such_util\n", 1))
    out = cli("targets", f"path:{fork}").stdout
    assert "imports _no_such_util from torch.onnx, which has no such name in torch " in out, out
    assert "the tree was written for another torch" in out, out
    # A module the fork ships is never stood in; one that neither the fork nor the environment has may be.
    config = tmp_path / "fork.toml"
    for shipped in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.ops.basic"):
        config.write_text(f'[standins."{shipped}"]\nnpu_on = "false"\n')
        out = cli("targets", f"path:{fork}", "--fork-config", str(config)).stdout
        assert "has the real module" in out, out
    op.write_text(original.replace("\nimport torch\n", "\nimport torch\nfrom npu_platform_for_test import npu_on\n"
                                   "from ..tensor.npu_tensor import NPU_TENSOR\n", 1))
    config.write_text('[standins."npu_platform_for_test"]\nnpu_on = "false"\n')
    out = cli("targets", f"path:{fork}", "--fork-config", str(config)).stdout
    assert "loaded" in out, out

    op.write_text(original)
    fuser = fork / FUSER
    fuser.write_text(fuser.read_text() + "\ndef broken(:\n")
    out = cli("targets", f"path:{fork}").stdout
    assert "SyntaxError" in out and "fuser.py:" in out and "already imported" not in out, out


def test_fork_config_renamed_op(fork: Path, tmp_path: Path) -> None:
    basic = fork / "transformer_engine/pytorch/ops/basic"
    text = (basic / "make_extra_output.py").read_text()
    (basic / "make_extra_output.py").unlink()
    (basic / "npu_extra_output.py").write_text(text.replace("class MakeExtraOutput(", "class NpuExtraOutput("))
    init = basic / "__init__.py"  # the fork's package still exports the name TE's fused ops import
    init.write_text(init.read_text().replace("from .make_extra_output import MakeExtraOutput",
                                             "from .npu_extra_output import NpuExtraOutput as MakeExtraOutput"))
    out = cli("targets", f"path:{fork}").stdout
    assert "MakeExtraOutput" not in out.split("TE's own:")[1].split(";")[0], out
    config = tmp_path / "fork.toml"
    config.write_text('[renamed_ops]\nMakeExtraOutput = "npu_extra_output:NpuExtraOutput"\n')
    out = cli("targets", f"path:{fork}", "--fork-config", str(config)).stdout
    assert "MakeExtraOutput (as NpuExtraOutput)" in out, out


# ==== hostile targets and hostile paths (issue 19), by class ====

def _fork_with(fork: Path, code: str, file: str = FUSER) -> Path:
    """The fork with `code` appended to one of its files (run at import of the target)."""
    path = fork / file
    path.write_text(path.read_text() + "\n" + code + "\n")
    return fork


# ---- write only what is ours ----

def test_report_output_that_is_no_regular_file_is_refused_and_left_alone(partial_run: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("not the harness's")
    link = tmp_path / "link.md"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo.md"
    os.mkfifo(fifo)
    outputs = [link, fifo]
    try:
        device = tmp_path / "null.md"
        os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, as /dev/null
        outputs.append(device)
    except PermissionError:
        device = None
    for output in outputs:
        assert_refused(cli("report", str(partial_run), "-o", str(output)), "not a regular file")
    assert link.is_symlink() and victim.read_text() == "not the harness's"
    assert fifo.is_fifo() and (device is None or device.is_char_device())


def test_out_on_a_directory_the_harness_did_not_make_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    (mine / "sessions").mkdir(parents=True)
    for name in ("run.json", "report.md", "sessions/notes.txt"):
        (mine / name).write_text("the user's own")
    before = tree_digest(mine)
    assert_refused(cli("run", *SMOKE, "--targets", "te-2.20.2", "--out", str(mine)), "not a repro run dir")
    assert tree_digest(mine) == before and not (mine / rundir.MARKER_NAME).exists()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_refused(cli("run", *SMOKE, "--targets", "te-2.20.2", "--out", str(a_file)), "not a directory")


def test_a_run_dir_keeps_the_files_the_harness_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "sessions").mkdir(parents=True)
    (out / rundir.MARKER_NAME).write_text("")
    (out / "report.md").write_text("stale")
    (out / "notes.txt").write_text("the user's own")
    (out / "sessions" / "mine.txt").write_text("the user's own")
    rundir.remove_stale(out)
    assert not (out / "report.md").exists()
    assert (out / "notes.txt").read_text() == (out / "sessions" / "mine.txt").read_text() == "the user's own"
    (out / "results.jsonl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="results.jsonl is a symlink"):
        rundir.check_run_dir(out)
    legacy = tmp_path / "legacy"  # a run dir of a version before the mark: it holds the run lock
    legacy.mkdir()
    (legacy / rundir.LOCK_NAME).write_text("")
    (legacy / "run.json").write_text("{}")
    rundir.check_run_dir(legacy)


def test_every_writing_command_refuses_an_out_in_a_source_or_the_cache(fork: Path, cache: Path,
                                                                       partial_run: Path) -> None:
    tree_out = fork / "transformer_engine" / "bench"
    assert_refused(cli("bench", "--matrix", "smoke", "--targets", f"path:{fork}", "--out", str(tree_out)),
                   "inside the source tree")
    assert_refused(cli("bench", "--matrix", "smoke", "--targets", "te-2.20.2", "--out", str(cache / "b")),
                   "inside the target cache")
    assert_refused(cli("report", str(partial_run), "-o", str(cache / "r.md")), "inside the target cache")
    assert_refused(cli("sweep", "--matrix", "issue22", "--out", str(cache / "s")), "inside the target cache")
    assert not tree_out.exists() and not (cache / "b").exists() and not (cache / "r.md").exists()


# ---- bounds from outside, and every observation survives ----

HOSTILE_CASES = {fault: f"issue22:ops-{axes}-trainable-{recompute}-single-dense-float32-cpu" for fault, axes, recompute in [
    ("gil", "rmsnorm-no_grad-leaf", "none"), ("sigstop", "rmsnorm-no_grad-non_leaf", "none"),
    ("raise_surrogate", "rmsnorm-enabled-leaf", "none"), ("raise_huge", "rmsnorm-enabled-non_leaf", "none"),
    ("raise_controls", "rmsnorm-enabled-leaf", "checkpoint_reentrant"),
    ("raise_base", "rmsnorm-enabled-non_leaf", "checkpoint_reentrant"),
    ("raise_keyboard", "extra_output_only-enabled-leaf", "none"),
    ("grad_off", "extra_output_only-enabled-leaf", "checkpoint_reentrant"),
    ("orphan", "extra_output_only-enabled-non_leaf", "none")]}
UNTOUCHED = "issue22:ops-extra_output_only-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One run of the smoke matrix in which eight cases attack the worker: C code holding the
    GIL, SIGSTOP, messages with lone surrogates, 10 MB and terminal escapes, a BaseException
    of the target's own, KeyboardInterrupt, grad mode switched off, and a process of its own
    session left behind."""
    out = tmp_path_factory.mktemp("hostile") / "run"
    faults = {case_id: fault for fault, case_id in HOSTILE_CASES.items()}
    result = cli("run", "--matrix", "smoke", "--only", "pipeline=rmsnorm,extra_output_only", "--targets", "te-2.20.2",
                 "-n", "1",
                 "--case-timeout", "3", "--out", str(out),
                 # Unsandboxed: the test hooks note pids in files outside (see the test above).
                 env={ENV: json.dumps(faults), "PYTEST_PLUGINS": PLUGIN, ORPHAN_ENV: str(out.parent / "orphans"),
                      sandbox.DISABLE_ENV: "1"})
    return out, result


def _orphans(path: Path, timeout: float = 0) -> list[int]:
    deadline = time.time() + timeout
    while timeout and time.time() < deadline and not path.is_file():
        time.sleep(0.2)
    return [int(line) for line in path.read_text().split()] if path.is_file() else []


def test_processes_a_case_starts_end_with_its_session(hostile_run) -> None:
    out, _ = hostile_run
    orphans = _orphans(out.parent / "orphans")
    assert orphans and not [pid for pid in orphans if alive(pid)]


def _records(out: Path) -> dict[str, dict]:
    return {r["case_id"]: r for r in json.loads((out / "run.json").read_text())["results"]}


def test_cases_deaf_to_the_alarm_are_ended_by_the_controller(hostile_run) -> None:
    out, result = hostile_run
    run = json.loads((out / "run.json").read_text())
    assert run["complete"], result.stderr
    records = _records(out)
    for fault in ("gil", "sigstop"):
        record = records[HOSTILE_CASES[fault]]
        assert record["outcome"] == "crash" and record["error"]["message"] == "per-case timeout", record
    assert records[UNTOUCHED]["verdict"] == "fixed"  # the other cases still ran, and were judged as usual


def test_every_exception_is_recorded_with_its_type_and_made_safe(hostile_run) -> None:
    out, _ = hostile_run
    records = _records(out)
    types = {fault: records[HOSTILE_CASES[fault]]["error"]["type"] for fault in HOSTILE_CASES if
             fault.startswith("raise_")}
    assert types == {"raise_surrogate": "RuntimeError", "raise_huge": "RuntimeError",
                     "raise_controls": "RuntimeError", "raise_base": "TargetsOwnBaseException",
                     "raise_keyboard": "KeyboardInterrupt"}
    assert "\\udcff" in records[HOSTILE_CASES["raise_surrogate"]]["error"]["message"]
    huge = records[HOSTILE_CASES["raise_huge"]]["error"]["message"]
    assert len(huge) < 100_000 and re.search(r"truncated: 100000\d\d characters in all", huge), huge[-80:]


def test_reports_escape_control_characters_and_stay_small(hostile_run) -> None:
    out, result = hostile_run
    assert (out / "report.html").stat().st_size < 2_000_000
    for text in ((out / "report.md").read_text(), (out / "report.html").read_text(), result.stdout + result.stderr,
                 cli("report", str(out), "--format", "md").stdout):
        assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text
    assert "\\x1b" in (out / "report.md").read_text()


def test_an_error_that_echoes_a_hostile_path_is_escaped() -> None:
    result = cli("targets", "path:/tmp/\x1b]0;owned\x07\x1b[2J")
    assert_refused(result, "\\x1b]0;owned\\x07")
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_a_case_that_changes_global_state_is_named(hostile_run) -> None:
    out, result = hostile_run
    record = _records(out)[HOSTILE_CASES["grad_off"]]
    assert record["verdict"] == "harness_error" and "global_state" in record["failed_checks"]
    assert any("grad mode" in line for line in record["details"]["global_state"]), record
    assert result.returncode == 1


def test_an_escaped_surrogate_in_results_jsonl_renders(tmp_path: Path) -> None:
    fixture = json.loads((REPO / "tests/fixtures/run-small/run.json").read_text())
    record = {**fixture["results"][0], "note": "lone \udcff surrogate"}
    (tmp_path / "results.jsonl").write_text(json.dumps(record) + "\n")  # json writes it as \udcff
    for fmt in ("md", "html", "summary", "junit", "json"):
        result = cli("report", str(tmp_path), "--format", fmt)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_a_target_that_allocates_past_the_bound_is_recorded_as_over_it(fork: Path, tmp_path: Path) -> None:
    """The target's own op asks torch for 4 GiB: torch's allocator refuses it inside the case,
    and the record says the case went over the worker's bound, not that the target failed."""
    _fork_with(fork, "_forward = RMSNorm.op_forward\n"
                     "def _hoarding(self, *args, **kwargs):\n"
                     "    torch.empty(4 << 30, dtype=torch.uint8).fill_(1)\n"
                     "    return _forward(self, *args, **kwargs)\n"
                     "RMSNorm.op_forward = _hoarding", "transformer_engine/pytorch/ops/basic/rmsnorm.py")
    out = tmp_path / "run"
    result = cli("run", *SMOKE, "--target", f"path:{fork}", "--max-rss", "2", "--out", str(out))
    records = json.loads((out / "run.json").read_text())["results"]
    ran = [r for r in records if r["outcome"] != "not_applicable"]
    assert result.returncode == 1 and ran, result.stderr
    assert {r["error"]["type"] for r in ran} == {"MemoryBound"}, [r["error"] for r in ran]


def test_a_target_that_loops_at_import_is_a_load_failure(fork: Path, tmp_path: Path) -> None:
    _fork_with(fork, "while True:\n    pass")
    out = tmp_path / "run"
    result = cli("run", *SMOKE, "--targets", f"path:{fork}", "--load-timeout", "10", "--out", str(out))
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] and result.returncode == 1, result.stderr
    assert all(r["verdict"] == "harness_error" and "did not load within 10 s" in r["note"] for r in run["results"])
    for command in (["targets", f"path:{fork}"], ["minimal", "--target", f"path:{fork}"]):
        probed = cli(*command, "--load-timeout", "5")
        assert "probe timed out after 5 s" in probed.stdout and "Traceback" not in probed.stderr, probed


def test_the_controller_dying_is_recorded_against_its_case(tmp_path: Path, cache: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.runner import sessions

    victim = HOSTILE_CASES["gil"]
    monkeypatch.setenv(ENV, json.dumps({victim: "kill_controller"}))
    monkeypatch.setenv(sandbox.DISABLE_ENV, "1")  # the test hook kills the controller, which a sandbox forbids
    monkeypatch.setenv("PYTEST_PLUGINS", PLUGIN)
    run = sessions.run_matrix("smoke", ["pipeline=rmsnorm"], ["te-2.20.2"], tmp_path, 1, cache,
                              progress=lambda _: None)
    record = {r["case_id"]: r for r in run["results"]}[victim]
    assert run["complete"] and record["outcome"] == "crash", run["problems"]
    assert record["error"]["type"] == "ControllerDied" and record["verdict"] == "regression"
    assert any("controller died" in p and victim in p for p in run["problems"])


def test_a_dead_controllers_in_flight_file_counts_only_the_sessions_own_cases(tmp_path: Path) -> None:
    from cases.case import Case
    from harness.runner import sessions
    from harness.runner.rundir import session_name

    spec, real, done = "te-2.20.2", HOSTILE_CASES["gil"], HOSTILE_CASES["sigstop"]
    target = SimpleNamespace(spec=spec)  # all the function reads of the target
    (tmp_path / "sessions").mkdir()
    # What a target could write into the file: a non-case, something not a string, garbage, a real case.
    (tmp_path / "sessions" / f"{session_name(spec)}.inflight.jsonl").write_text("".join(
        json.dumps({"case_id": value}) + "\n" for value in ("issue22:not-a-case", {"a": 1}, real, done)) + "not json\n")
    started = sessions.StartedReader(tmp_path).poll(spec)
    jsonl = tmp_path / "results.jsonl"
    lines = sessions._record_lost_in_flight(target, [Case.from_id(real), Case.from_id(done)], {}, jsonl, started,
                                            {done}, -9)
    assert [json.loads(line)["case_id"] for line in jsonl.read_text().splitlines()] == [real]
    assert len(lines) == 1 and real in lines[0]


# ---- one identity per target ----

def test_session_names_are_unique_per_spec() -> None:
    from harness.runner.rundir import session_name

    pairs = [("path:/a/b_c", "path:/a/b/c"), ("path:col a", "path:col_a"), ("te-2.13.0+backport", "te-2.13.0_backport")]
    for one, other in pairs:
        assert session_name(one) != session_name(other)
    assert "/" not in session_name("path:/x/../../etc") and not session_name("path:..").startswith(".")


def test_one_tree_spelled_three_ways_is_one_target(fork: Path) -> None:
    from repro.validate import target_specs

    spellings = [f"path:{fork}", f"path:{fork}/", f"path:{fork}/../{fork.name}"]
    for other in spellings[1:]:
        with pytest.raises(UsageError, match="given twice"):
            target_specs(None, [spellings[0], other], ())


# ---- the judge keeps its own tools ----

def test_a_target_that_swaps_the_judges_tools_is_named(fork: Path, tmp_path: Path) -> None:
    _fork_with(fork, "import torch, torch.testing\ntorch.testing.assert_close = lambda *a, **k: None\n"
                     "torch.set_grad_enabled(False)")
    out = tmp_path / "run"
    result = cli("run", *SMOKE, "--targets", f"path:{fork}", "--out", str(out))
    run = json.loads((out / "run.json").read_text())
    flagged = [r for r in run["results"] if "global_state" in r["failed_checks"]]
    assert flagged and result.returncode == 1, result.stderr
    named = " ".join(flagged[0]["details"]["global_state"])
    assert "torch.testing.assert_close was replaced" in named and "grad mode" in named
    # Every case ran under the judge's own state: none looks fixed because grad mode was off.
    assert not [r for r in run["results"] if r["verdict"] == "unexpected_pass"]


# At import, a tree with issue 22 turns the judge's tools in its own process into no-ops, makes
# every record it could reach read "pass", and scales RMSNorm's output by 1.5: the judge, in the
# controller and the reference process, sees the crash and the wrong values all the same.
JUDGE_SWAPPER = """
import importlib as _importlib
def _module(name):
    try:
        return _importlib.import_module(name)
    except ImportError:
        return None
_checks, _compare = _module("harness.engine.checks"), _module("harness.engine.compare")
_records, _execute = _module("harness.runner.records"), _module("harness.engine.execute")
_checks.assert_close = lambda *a, **k: None
for _tols in _checks.TOLERANCES.values():
    _tols.update(rtol=1e9, atol=1e9)
if _compare:
    _compare.failed_checks = lambda *a, **k: {}
_passed = {"outcome": "pass", "failed_checks": [], "details": {}, "error": None, "side_effects": [],
           "known_deviations": [], "note": None, "duration_s": 0.0}
FORGE_RECORDS = True
if FORGE_RECORDS:  # the harness's own functions that make a case's record, wherever they are
    _records.observe = lambda *a, **k: {"observed": dict(_passed)}
    _execute.run_case = lambda *a, **k: dict(_passed)
from transformer_engine.pytorch.ops.basic import rmsnorm as _rmsnorm
_forward = _rmsnorm.RMSNorm.op_forward
_rmsnorm.RMSNorm.op_forward = lambda self, *a, **k: _forward(self, *a, **k) * 1.5
"""


def test_a_target_cannot_change_its_own_verdict(fork: Path, tmp_path: Path) -> None:
    _fork_with(fork, JUDGE_SWAPPER, "transformer_engine/pytorch/__init__.py")
    out = tmp_path / "run"
    result = cli("run", "--matrix", "smoke", "--only", "pipeline=rmsnorm,fused_residual_rmsnorm", "-n", "1",
                 "--target", f"path:{fork}", "--out", str(out))
    run = json.loads((out / "run.json").read_text())
    assert result.returncode == 1 and run["complete"] and run["summary"]["status"] == "FAIL"
    # The forged "pass" observations are not the judge's: each case is a harness error that says so.
    forged = [r for r in run["results"] if r["outcome"] == "harness_error"]
    assert forged and all("claims outcome 'pass' without the sides" in r["note"] for r in forged), run["results"][0]
    assert not [r for r in run["results"] if r["verdict"] in ("fixed", "unaffected", "unexpected_pass")]


def test_the_judge_compares_what_the_target_computed(fork: Path, tmp_path: Path) -> None:
    """The same tree without the forged observations: its tools swapped in its own process, its
    RMSNorm off by 1.5, and its issue 22 are all seen."""
    _fork_with(fork, JUDGE_SWAPPER.replace("FORGE_RECORDS = True", "FORGE_RECORDS = False"),
               "transformer_engine/pytorch/__init__.py")
    out = tmp_path / "run"
    cli("run", "--matrix", "smoke", "--only", "pipeline=rmsnorm,fused_residual_rmsnorm", "-n", "1",
        "--target", f"path:{fork}", "--out", str(out))
    results = json.loads((out / "run.json").read_text())["results"]
    ran = [r for r in results if r["outcome"] != "not_applicable"]
    assert {r["outcome"] for r in ran} <= {"wrong_output", "crash"}, {r["outcome"] for r in ran}
    assert any(r["outcome"] == "wrong_output" and "outputs" in r["failed_checks"] for r in ran)
    assert any(r["error"] and "requires_grad flags of leaf variables" in r["error"]["message"] for r in ran)


def test_a_library_that_patches_torch_in_the_worker_does_not_reach_the_reference(fork: Path, tmp_path: Path) -> None:
    """A vendor device library commonly patches torch process-wide at import. The reference runs in
    a process that never imported the target, so both sides cannot go wrong the same way."""
    _fork_with(fork, "import torch\n_rsqrt = torch.rsqrt\ntorch.rsqrt = lambda t, *a, **k: _rsqrt(t, *a, **k) * 1.5",
               "transformer_engine/pytorch/__init__.py")
    out = tmp_path / "run"
    cli("run", *SMOKE, "--target", f"path:{fork}", "--out", str(out))
    ran = [r for r in json.loads((out / "run.json").read_text())["results"] if r["outcome"] != "not_applicable"]
    assert ran and all("outputs" in r["failed_checks"] for r in ran if r["outcome"] != "crash"), ran[0]


# A tree in a worker finds its session's controller's command line: its parent's, or, for a worker the
# run's fork server forked, that of the pytest process whose target is a path: tree (this one).
CONTROLLER_ARGS = """
import os as _os
def _controller_args():
    for _pid in [_os.getppid(), *(int(p) for p in _os.listdir("/proc") if p.isdigit())]:
        try:
            _found = open(f"/proc/{_pid}/cmdline", "rb").read().decode().split("\\0")
        except OSError:
            continue
        if "--repro-jsonl=RESULTS" in _found:  # its own run's, by the run dir: not another run's on the machine
            return _found
    return []
_args = _controller_args()
"""
# At import, a tree whose RMSNorm is off by 1.5 finds the run's observations file on its controller's
# command line and appends, for each of its cases, an observation whose sides match the reference.
OBSERVATION_FORGER = CONTROLLER_ARGS + """
import json as _json
from pathlib import Path as _Path
_path = next((_Path(a.split("=", 1)[1]) for a in _args if a.startswith("--repro-observations=")), None)
if _path:
    from cases.case import Case as _Case
    from harness.engine import reference as _reference
    from harness.runner import observations as _observations
    from harness.runner.textsafe import safe_value as _safe
    _cases = next(a for a in _args if a.endswith(".cases.json"))
    with open(_path, "a") as _out:
        for _fields in _json.loads(_Path(_cases).read_text())["cases"]:
            _case = _Case(**_fields)
            if _reference.independent(_case):
                _raw = _safe({"test": _reference.reference_side(_case), "error": None}, keep_bytes=True)
                _out.write(_observations.line(_case.case_id, _json.loads(next(
                    a for a in _args if a.startswith("--repro-target="))[len("--repro-target="):])["spec"], _raw, None))
from transformer_engine.pytorch.ops.basic import rmsnorm as _rmsnorm
_forward = _rmsnorm.RMSNorm.op_forward
_rmsnorm.RMSNorm.op_forward = lambda self, *a, **k: _forward(self, *a, **k) * 1.5
"""


def test_observations_a_tree_writes_are_not_judged(fork: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    _fork_with(fork, OBSERVATION_FORGER.replace("RESULTS", str(out / "results.jsonl")),
               "transformer_engine/pytorch/__init__.py")
    # Unsandboxed: in a sandbox the tree cannot write the run dir at all (TestTheSandboxHoldsTheTarget);
    # the seal is what holds where it runs without one.
    cli("run", *SMOKE, "--target", f"path:{fork}", "--target", "te-2.20.2", "--out", str(out),
        env={sandbox.DISABLE_ENV: "1"})
    run = json.loads((out / "run.json").read_text())
    forged = sum(1 for line in (out / "sessions" / "observations.jsonl").read_text().splitlines()
                 if line.startswith("- "))
    assert forged and any(f"{forged} lines no session of this run wrote" in p for p in run["problems"])
    assert len(run["rejected"]) == forged  # as a results line no session wrote: it fails the run
    results = run["results"]
    ran = [r for r in results if r["outcome"] != "not_applicable" and r["target"] != "te-2.20.2"]
    completed = [r for r in ran if r["outcome"] != "crash"]
    assert completed and all("outputs" in r["failed_checks"] for r in completed), completed[0]
    mine = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sum(1 for r in mine if r.get("target") != "te-2.20.2") == len(ran) + sum(
        1 for r in results if r["target"] != "te-2.20.2" and r["outcome"] == "not_applicable")  # one record a case
    other = [r for r in results if r["target"] == "te-2.20.2" and r["outcome"] != "not_applicable"]
    assert other and all(r["outcome"] == "pass" for r in other)  # nor are the other target's results changed


VICTIM_CASE = "issue22:ops-rmsnorm-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"
# At import, a tree reads the results file's path from its controller's command line and appends
# a record of its own for another target: that target's affected case "fixed".
FORGER = CONTROLLER_ARGS + f"""
import json as _json
_path = next((a.split("=", 1)[1] for a in _args if a.startswith("--repro-jsonl=")), None)
if _path:
    with open(_path, "a") as _out:
        _out.write(_json.dumps({{"case_id": "{VICTIM_CASE}", "target": "te-2.13.0", "outcome": "pass",
                                "verdict": "fixed", "expected": "fail"}}) + "\\n")
"""


def test_a_record_no_session_wrote_is_rejected_and_fails_the_run(fork: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    _fork_with(fork, FORGER.replace("RESULTS", str(out / "results.jsonl")))
    # Unsandboxed, as the test above: the seal is what holds where the tree can write the run dir.
    result = cli("run", *SMOKE, "--target", f"path:{fork}", "--target", "te-2.13.0", "--out", str(out),
                 env={sandbox.DISABLE_ENV: "1"})
    assert '"verdict": "fixed"' in (out / "results.jsonl").read_text()  # the forgery was written
    run = json.loads((out / "run.json").read_text())
    victim = next(r for r in run["results"] if r["target"] == "te-2.13.0" and r["case_id"] == VICTIM_CASE)
    assert victim["verdict"] == "unaffected"  # its own session's record, not the forged "fixed"
    assert len(run["rejected"]) == 1 and "no process of this run wrote" in run["rejected"][0], run["rejected"]
    assert result.returncode == 1 and run["summary"]["status"] == "FAIL"
    assert "1 records rejected" in " ".join(run["summary"]["fail_reasons"])


def test_the_controller_refuses_a_record_that_is_not_the_workers_to_send(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.runner import plugin

    monkeypatch.setitem(plugin._state, "recorded", {"issue22:done"})
    monkeypatch.setitem(plugin._state, "session_cases", {"issue22:done", "issue22:x", "issue22:y"})
    record = {"case_id": "issue22:x", "target": "te-2.13.0"}
    assert plugin._refusal(record, "te-2.13.0", "issue22:x") is None
    assert "another target" in (plugin._refusal({**record, "target": "te-2.16.0"}, "te-2.13.0", "issue22:x") or "")
    assert "not in flight" in (plugin._refusal(record, "te-2.13.0", "issue22:y") or "")
    assert "second record" in (plugin._refusal({**record, "case_id": "issue22:done"}, "te-2.13.0",
                                               "issue22:done") or "")
    assert "without a case id" in (plugin._refusal(["not", "a", "dict"], "te-2.13.0", None) or "")
    assert "not a case of this session" in (plugin._refusal({**record, "case_id": "issue22:z"}, "te-2.13.0",
                                                            "issue22:z") or "")


def test_the_controller_refuses_a_start_that_is_not_the_workers_to_announce(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.runner import plugin

    monkeypatch.setitem(plugin._state, "recorded", {"issue22:done"})
    monkeypatch.setitem(plugin._state, "session_cases", {"issue22:done", "issue22:x", "issue22:y"})
    monkeypatch.setitem(plugin._state, "inflight_by_worker",
                        {"gw1": ("issue22:y", 0.0, False), "gw0": ("issue22:x", 0.0, True)})
    assert plugin._start_refusal("issue22:x", "gw0") is None  # its own case, loading, then started
    assert "not a case of this session" in (plugin._start_refusal("issue22:z", "gw0") or "")
    assert "not a case of this session" in (plugin._start_refusal({"case_id": "issue22:x"}, "gw0") or "")
    assert "recorded already" in (plugin._start_refusal("issue22:done", "gw0") or "")
    assert "in flight on another worker" in (plugin._start_refusal("issue22:y", "gw0") or "")


def test_the_state_guard_names_and_undoes_each_change() -> None:
    import torch

    from harness.runner import state

    backward = torch.Tensor.backward
    try:
        with state.guarded() as changed:
            torch.Tensor.backward = lambda *a, **k: None  # type: ignore[method-assign]
            torch.set_default_dtype(torch.float64)
            torch.set_anomaly_enabled(True)
            torch.use_deterministic_algorithms(True)
    finally:
        names = " ".join(changed)
        restored = (torch.Tensor.backward is backward, torch.get_default_dtype(), torch.is_anomaly_enabled(),
                    torch.are_deterministic_algorithms_enabled())
        torch.Tensor.backward = backward  # type: ignore[method-assign]
    for what in ("torch.Tensor.backward was replaced", "default dtype", "anomaly detection",
                 "deterministic algorithms"):
        assert what in names, names
    assert restored == (True, torch.float32, False, False)


# ---- exit statuses and one-line errors ----

def test_diff_with_an_incomplete_run_is_not_zero(partial_run: Path) -> None:
    complete = REPO / "tests/fixtures/run-small"
    assert cli("diff", str(complete), str(partial_run)).returncode == 1
    assert cli("diff", str(partial_run), str(complete)).returncode == 1


def test_exec_passes_the_childs_status_through(tmp_path: Path, fork: Path) -> None:
    assert cli("exec", "--target", "te-2.20.2", "--", "sh", "-c", "kill -9 $$").returncode == 137
    assert cli("exec", "--target", "te-2.20.2", "--", "sh", "-c", "exit 7").returncode == 7
    script = tmp_path / "script.py"
    script.write_text("print('hi')\n")
    assert_refused(cli("exec", "--target", "te-2.20.2", "--", str(script)), "not executable")
    _fork_with(fork, "raise RuntimeError('the fork fails at import')")
    assert_refused(cli("exec", "--target", f"path:{fork}", "--", sys.executable, "-c", "pass"),
                   "the fork fails at import")


def test_a_fork_that_prints_or_holds_odd_files_still_probes(fork: Path) -> None:
    _fork_with(fork, "import atexit\nprint('hello from the fork')\natexit.register(print, 'bye from the fork')")
    (fork / "transformer_engine" / "notes.py").mkdir()
    for command in (["targets", f"path:{fork}"], ["minimal", "--target", f"path:{fork}"]):
        result = cli(*command)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert "probe process failed" not in result.stdout and "Error" not in result.stdout.split("raised")[0]
        assert "loaded" in result.stdout or "raised RuntimeError at transformer_engine" in result.stdout, result.stdout


def test_values_that_would_break_every_session_are_refused_or_handled(tmp_path: Path) -> None:
    assert_refused(cli("run", *SMOKE, "--case-timeout", "99999999999", "--out", str(tmp_path / "o")), "at most")
    summary_dir = tmp_path / "summary-is-a-dir"
    summary_dir.mkdir()
    assert_refused(cli("run", *SMOKE, "--out", str(tmp_path / "o"), env={"GITHUB_STEP_SUMMARY": str(summary_dir)}),
                   "GITHUB_STEP_SUMMARY")
    assert not (tmp_path / "o").exists()
    # A relative --out that reads as an option, under a PYTEST_ADDOPTS that would break every session.
    env = {**os.environ, "PYTEST_ADDOPTS": "--no-such-option -x", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "repro", "run", *SMOKE, "--targets", "te-2.20.2", "--out=-rdash"],
                            capture_output=True, text=True, cwd=tmp_path, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "-rdash" / "run.json").read_text())["complete"]
    # A local worker in another directory gets the harness and the cases by xdist's rsync.
    workdir = tmp_path / "workers"
    result = cli("run", *SMOKE, "--targets", "te-2.20.2", "--tx", f"popen//chdir={workdir}",
                 "--out", str(tmp_path / "chdir"))
    assert result.returncode == 0, result.stderr


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sources.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert sources.cache_path() == Path.home() / ".cache" / "te-fuser-repro"
    monkeypatch.setenv("XDG_CACHE_HOME", "/abs/cache")
    assert sources.cache_path() == Path("/abs/cache/te-fuser-repro")


# At import, a tree announces through the harness's own plugin (it runs in the worker's process) that a
# case which is not one starts, then ends its worker: the controller would attribute the death to that id.
FALSE_START = """
import os as _os, sys as _sys
_frame = _sys._getframe()
while _frame is not None and type(_frame.f_locals.get("self")).__name__ != "CaseChunk":
    _frame = _frame.f_back
if _frame is not None:  # imported by a case's chunk (the worker loads the target there)
    _frame.f_locals["self"]._notify("started", "issue22:not-a-case")
    _os._exit(3)
"""

def test_a_start_announced_for_a_case_not_in_the_session_is_refused_and_fails_the_run(fork: Path,
                                                                                      tmp_path: Path) -> None:
    _fork_with(fork, FALSE_START)
    out = tmp_path / "run"  # one case: its crash, at the import of the target, is its own
    result = cli("run", *SMOKE, "--only", "grad_mode=no_grad", "--only", "input=leaf", "--target", f"path:{fork}",
                 "--out", str(out))
    assert "Traceback" not in result.stderr, result.stderr
    run = json.loads((out / "run.json").read_text())
    assert any("issue22:not-a-case" in line and "not a case of this session" in line for line in run["rejected"]), run
    assert not any(r["case_id"] == "issue22:not-a-case" for r in run["results"])
    assert run["complete"]  # the worker's real case is recorded as the crash it was
    assert result.returncode == 1 and run["summary"]["status"] == "FAIL"


# ==== what a worker sends: observations, never record fields (issue 46) ====

# At import, a tree wraps the harness's own observe (it runs in the worker's process): every observation
# it sends also names record fields (FORGED), beside the sides it observed.
FIELD_FORGER = """
import importlib as _importlib
_records = _importlib.import_module("harness.runner.records")
_observe = _records.observe
def _forged(*args, **kwargs):
    raw = _observe(*args, **kwargs)
    raw.setdefault("fields", {}).update(FORGED)
    return raw
_records.observe = _forged
"""
# At import, a tree makes each case the rules predict affected (and only those) say it cannot run there.
APPLICABILITY_CLAIMER = """
import importlib as _importlib
_records = _importlib.import_module("harness.runner.records")
_regressions = _importlib.import_module("cases.regressions").REGRESSIONS
_observe = _records.observe
def _claimed(case, spec, *args, **kwargs):
    if _regressions[case.regression].predict(case).expected == "affected":
        return {"observed": _records._not_run(_records.Outcome.NOT_APPLICABLE, "applicability",
                                              f"not applicable on this release: {spec} lacks MakeExtraOutput")}
    return _observe(case, spec, *args, **kwargs)
_records.observe = _claimed
"""
WITH_AFFECTED = ["--matrix", "smoke", "--only", "pipeline=rmsnorm,fused_residual_rmsnorm", "-n", "1"]


def _declared_fixed(fork: Path, code: str) -> str:
    """The fork with `code` run at its import and `[expect] issue22 = "fixed"`: a tree that must pass."""
    _fork_with(fork, code, "transformer_engine/pytorch/__init__.py")
    (fork / ".te-repro.toml").write_text('[expect]\nissue22 = "fixed"\n')
    return targets.canonical_spec(f"path:{fork}")


class TestWorkerSendsObservationsOnly:
    """A worker imports the target: what it sends is an observation, and the record's other fields
    (outcome, verdict, checks, target, case id, axes, expected, role) are the judge's own."""

    CASE_ID = "issue22:ops-fused_residual_rmsnorm-no_grad-non_leaf-trainable-none-single-dense-float32-cpu"

    @pytest.mark.parametrize("forged, named", [
        ({"outcome": "pass", "verdict": "fixed", "failed_checks": [], "error": None, "details": {}}, "fields.outcome"),
        ({"target": "te-2.16.0", "case_id": "issue22:made-up", "pipeline": "identity"}, "fields.target"),
    ], ids=["verdict", "filing"])
    def test_fields_a_tree_adds_are_refused_and_fail_the_run(self, fork: Path, tmp_path: Path, forged: dict,
                                                             named: str) -> None:
        spec = _declared_fixed(fork, FIELD_FORGER.replace("FORGED", repr(forged)))
        out = tmp_path / "run"
        result = cli("run", *WITH_AFFECTED, "--target", f"path:{fork}", "--out", str(out))
        run = json.loads((out / "run.json").read_text())
        planned = {case_id for _, case_id in json.loads((out / "run-meta.json").read_text())["expected_keys"]}
        results = run["results"]
        # Every case filed where the judge files it, under the run's own target and case id: none missing.
        assert run["complete"] and {r["case_id"] for r in results} == planned, run["summary"]
        assert {r["target"] for r in results} == {spec}
        assert all(r["outcome"] == "harness_error" and named in r["note"] for r in results), results[0]["note"]
        assert len(run["rejected"]) == len(results) and all(named in line for line in run["rejected"])
        assert result.returncode == 1 and run["summary"]["status"] == "FAIL"
        assert f"{len(results)} records rejected" in " ".join(run["summary"]["fail_reasons"])

    @pytest.mark.parametrize("raw, named", [
        ({"error": None, "fields": {"fused_ops": [], "outcome": "pass"}}, "fields.outcome"),
        ({"error": None, "fields": {"verdict": "fixed"}}, "fields.verdict"),
        ({"error": None, "fields": {"case_id": "issue22:x"}}, "fields.case_id"),
        ({"error": None, "target": "te-2.16.0"}, "target"),
        ({"error": {"type": "RuntimeError", "message": "m", "location": None, "verdict": "fixed"}}, "error.verdict"),
        ({"observed": {"outcome": "not_applicable", "failed_checks": [], "details": {}, "error": None,
                       "side_effects": [], "known_deviations": [], "note": "n", "duration_s": 0.0,
                       "target": "te-2.16.0"}}, "observed.target"),
        ({"observed": {"outcome": "harness_error", "failed_checks": ["harness"], "details": {}, "error": None,
                       "side_effects": [], "known_deviations": [], "note": "n", "duration_s": 0.0,
                       "pipeline": "identity"}}, "observed.pipeline"),
        ({"lost": {"why": "worker died", "text": "", "error_type": None, "verdict": "fixed"}}, "lost.verdict"),
        ({"lost": {"why": "worker died", "text": "", "error_type": None}, "role": "fixed_upstream"}, "role"),
    ])
    def test_a_message_naming_a_field_no_worker_may_send_is_a_harness_error(self, raw: dict, named: str) -> None:
        from cases.case import Case
        from harness.engine import reference
        from harness.model import Role
        from harness.runner.records import judged

        case = Case.from_id(self.CASE_ID)
        if "observed" not in raw and "lost" not in raw:
            raw = {"test": reference.reference_side(case), **raw}
        record = judged(case, "te-2.13.0", Role.UNPATCHED, raw, None, "2.13.0")
        assert record["outcome"] == "harness_error" and record["verdict"] == "harness_error", record
        assert "no worker may send" in record["note"] and named in record["note"], record["note"]
        assert (record["case_id"], record["target"], record["pipeline"]) == (self.CASE_ID, "te-2.13.0",
                                                                              "fused_residual_rmsnorm")

    def test_the_runs_judge_lists_the_refusal_among_rejected_records(self, tmp_path: Path) -> None:
        from cases.case import Case
        from harness.engine import reference
        from harness.model import Role
        from harness.runner import observations
        from harness.runner.textsafe import safe_value

        key = b"k" * 32
        judge = observations.Judge(tmp_path / "observations.jsonl", tmp_path / "results.jsonl", key,
                                   {"te-2.13.0": {"issue22": Role.UNPATCHED.value}}, {"te-2.13.0": "2.13.0"})
        raw = safe_value({"test": reference.reference_side(Case.from_id(self.CASE_ID)), "error": None,
                          "fields": {"outcome": "pass", "fused_ops": []}}, keep_bytes=True)
        judge.path.write_text(observations.line(self.CASE_ID, "te-2.13.0", raw, key))
        assert judge.poll() == 1
        records, _, rejected = rundir.read_sealed(judge.results, key)
        assert [(r["case_id"], r["outcome"]) for r in records] == [(self.CASE_ID, "harness_error")]
        assert len(rejected) == 1 and self.CASE_ID in rejected[0] and "fields.outcome" in rejected[0], rejected


class TestApplicabilityIsNotTheWorkers:
    """A case the rules predict affected that comes back not applicable from a loaded target is coverage
    the run lost: never a pass by absence."""

    def test_affected_cases_claimed_not_applicable_fail_the_run(self, fork: Path, tmp_path: Path) -> None:
        _declared_fixed(fork, APPLICABILITY_CLAIMER)
        out = tmp_path / "run"
        result = cli("run", *WITH_AFFECTED, "--target", f"path:{fork}", "--out", str(out))
        run = json.loads((out / "run.json").read_text())
        claimed = [r for r in run["results"] if r["outcome"] == "not_applicable"]
        assert claimed and all(r["expected"] == "affected" for r in claimed)
        assert all(r["verdict"] == "not_judged" and "lost coverage" in r["verdict_reason"] for r in claimed), claimed[0]
        assert result.returncode == 1 and run["summary"]["status"] == "FAIL"
        assert any("lost coverage" in line for line in run["headlines"]["issue22"]), run["headlines"]

    @pytest.mark.parametrize("spec, role, expected, verdict", [
        ("path:/src/fork", "unpatched", "affected", "not_judged"),
        ("path:/src/fork@HEAD", "fixed_upstream", "affected", "not_judged"),
        ("path:/src/fork", "unknown", "affected", "not_judged"), ("installed", "patched", "affected", "not_judged"),
        ("path:/src/fork", "predates", "affected", "not_applicable"),  # before the bug's releases: nothing to lose
        ("path:/src/fork", "unpatched", "unaffected", "not_applicable"),  # no rule predicts anything there
        # An upstream release is taken at its word: 2.6's te.ops has no in_place, and nothing is hidden there.
        ("te-2.6.0.post1", "unpatched", "affected", "not_applicable"),
        ("te-2.6.0.post1+backport", "patched", "affected", "not_applicable"),
    ])
    def test_the_judge_decides_which_not_applicable_case_is_lost_coverage(self, spec: str, role: str, expected: str,
                                                                         verdict: str) -> None:
        from cases.case import Case
        from harness.model import Outcome, Role
        from harness.runner.records import _not_run, judged

        case_id = TestWorkerSendsObservationsOnly.CASE_ID
        if expected == "unaffected":
            case_id = case_id.replace("no_grad-non_leaf", "enabled-leaf")
        case = Case.from_id(case_id)
        raw = {"observed": _not_run(Outcome.NOT_APPLICABLE, "applicability", "not applicable: lacks X")}
        record = judged(case, spec, Role(role), raw, None, "2.13.0")
        assert record["expected"] == expected and record["verdict"] == verdict, record["verdict_reason"]
        assert ("lost coverage" in (record.get("coverage_gap") or "")) is (verdict == "not_judged")


class TestRunFilesAndTreesAreNamedOnce:
    """The leftovers of round 2: a damaged run-meta.json, one tree under two spellings, and an output
    path that is a file of a run dir: each one line on stderr and exit 2, nothing written."""

    @pytest.mark.parametrize("meta, said", [
        ({"matrix": "smoke", "targets": 5}, "'targets' is 5 (a JSON number); it must be a list of target specs"),
        ({"matrix": "smoke", "targets": ["te-2.13.0", 5]}, "'targets' is [\"te-2.13.0\", 5]"),
        ({"matrix": "smoke", "roles": 5}, "'roles' is 5 (a JSON number); it must be {target: {regression: role}}"),
        ({"matrix": "smoke", "expected_keys": "all"}, "'expected_keys' is \"all\" (a JSON string)"),
        ({"matrix": 5}, "'matrix' is 5"),
        ([1, 2], "is a JSON array, not an object"),
    ], ids=["targets", "a target", "roles", "expected_keys", "matrix", "array"])
    def test_a_malformed_run_meta_is_one_line_in_report_and_diff(self, partial_run: Path, meta: object,
                                                                 said: str) -> None:
        (partial_run / "run-meta.json").write_text(json.dumps(meta))
        assert_refused(cli("report", str(partial_run)), "run-meta.json", said, "fix or remove")
        assert_refused(cli("diff", str(partial_run), str(REPO / "tests/fixtures/run-small")), said)
        assert_refused(cli("diff", str(REPO / "tests/fixtures/run-small"), str(partial_run)), said)

    def test_one_tree_spelled_two_ways_is_refused_by_review(self, fork: Path, tmp_path: Path) -> None:
        out = tmp_path / "review"
        for base, head, said in [(f"path:{fork}", f"path:{fork}/", "are both path:"),
                                 (f"path:{fork}@HEAD", f"path:{fork}/@HEAD", "are both path:"),
                                 (f"path:{fork}@npu-main", f"path:{fork}@HEAD", "are both commit")]:
            assert_refused(cli("review", "--base", base, "--head", head, *SMOKE, "--out", str(out)), said)
        assert not out.exists()

    def test_no_output_is_a_file_of_a_run_dir(self, partial_run: Path, tmp_path: Path) -> None:
        (partial_run / "report.md").write_text("the run's report")
        other = tmp_path / "other-run"  # another run's dir, as `repro run` marks it
        other.mkdir()
        (other / rundir.MARKER_NAME).write_text("")
        (other / "run.json").write_text("{}")
        before = tree_digest(partial_run), tree_digest(other)
        for output, said in [(partial_run / "report.md", "the run's own report.md"),
                             (partial_run / "junit.xml", "a new file in the run's own dir (junit.xml)"),
                             (other / "run.json", "inside the run dir"), (other / "new.md", "inside the run dir")]:
            assert_refused(cli("report", str(partial_run), "--format", "junit", "-o", str(output)), said)
        summary = tmp_path / "summary.md"
        assert_refused(cli("report", str(partial_run), "-o", str(summary), env={"GITHUB_STEP_SUMMARY": str(summary)}),
                       "is the report's own -o")
        assert (tree_digest(partial_run), tree_digest(other)) == before and not summary.exists()
        result = cli("report", str(partial_run), "-o", str(tmp_path / "report.md"))  # outside any run dir: written
        assert result.returncode == 0 and (tmp_path / "report.md").is_file(), result.stderr


# At import, a tree makes its worker send its own side as the reference of every case that ran.
REFERENCE_FORGER = """
import importlib as _importlib
_records = _importlib.import_module("harness.runner.records")
_observe = _records.observe
def _own_reference(*args, **kwargs):
    raw = _observe(*args, **kwargs)
    if isinstance(raw.get("test"), dict):
        raw["reference"] = raw["test"]
    return raw
_records.observe = _own_reference
"""
# ... and its RMSNorm is off by 1.5: a wrong output its own reference would hide.
RMSNORM_OFF = """
from transformer_engine.pytorch.ops.basic import rmsnorm as _rmsnorm
_forward = _rmsnorm.RMSNorm.op_forward
_rmsnorm.RMSNorm.op_forward = lambda self, *a, **k: _forward(self, *a, **k) * 1.5
"""


class TestReferencesAreNotTheWorkers:
    """A reference never comes from the code under test: a scenario's reference and a Megatron norm's
    are computed by the judge, and the reference side a worker sends is not used for them."""

    def test_a_scenario_reference_the_worker_sends_is_not_used(self, fork: Path, tmp_path: Path) -> None:
        _fork_with(fork, REFERENCE_FORGER, "transformer_engine/pytorch/__init__.py")
        (fork / ".te-repro.toml").write_text('[expect]\nextra_state_pickle = "fixed"\n')
        out = tmp_path / "run"
        result = cli("run", "--matrix", "extra_state_pickle", "--only", "pipeline=rmsnorm", "-n", "1",
                     "--target", f"path:{fork}", "--out", str(out))
        run = json.loads((out / "run.json").read_text())
        crafted = [r for r in run["results"] if r["checkpoint"] == "crafted_pickle"]
        # 2.13.0 runs the crafted pickle's payload: the judge's reference, which never ran it, says so,
        # on a tree declared fixed (on today's code: "fixed", the run PASS).
        assert [(r["verdict"], r["symptom"]) for r in crafted] == [("regression", True)], crafted
        assert crafted[0]["details"]["observations"] == ["payload_executed: True, reference False"]
        assert {r["verdict"] for r in run["results"] if r["checkpoint"] == "round_trip"} == {"unaffected"}
        assert result.returncode == 1 and run["summary"]["status"] == "FAIL", run["summary"]

    def test_the_judge_reads_no_reference_a_worker_sends_for_a_trial(self) -> None:
        from cases.case import Case
        from harness.engine import reference, wire
        from harness.model import Role
        from harness.runner.records import judged

        case = Case.from_id("extra_state_pickle:rmsnorm-crafted_pickle")
        side = wire.unpack(reference.reference_side(case))
        assert side["observed"] == {"payload_executed": False}
        side["observed"] = {"payload_executed": True}  # the payload ran on the target's side
        raw = {"test": wire.pack(side), "reference": wire.pack(side), "error": None, "label": "steps"}
        record = judged(case, "te-2.13.0", Role.UNPATCHED, raw, None, "2.13.0")
        assert (record["outcome"], record["verdict"]) == ("side_effect", "reproduced"), record["details"]
        assert record.get("reference_from") is None

    def test_a_megatron_block_record_says_its_reference_came_from_the_target(self) -> None:
        from cases.case import Case
        from harness.engine import reference, wire
        from harness.model import Role
        from harness.runner.records import judged

        block = Case.from_id("issue22:megatron_block-fused_residual_rmsnorm-enabled-non_leaf-trainable-full_block-"
                             "single-dense-float32-cpu")
        assert not reference.independent(block)
        side = wire.pack({"outputs": [], "requires_grad": [], "before": {}, "after": {}, "grads": {}})
        record = judged(block, "te-2.13.0", Role.UNPATCHED, {"test": side, "reference": side, "error": None}, None,
                        "2.13.0")
        assert "the judge cannot vouch" in record["reference_from"], record

    def test_a_megatron_norm_reference_the_worker_sends_is_not_used(self, fork: Path, tmp_path: Path) -> None:
        _fork_with(fork, REFERENCE_FORGER + RMSNORM_OFF, "transformer_engine/pytorch/__init__.py")
        out = tmp_path / "run"
        cli("run", "--matrix", "issue22", "--only", "client=megatron_norm", "--only", "grad_mode=enabled",
            "--only", "input=leaf,non_leaf", "--only", "recompute=none", "--only", "sequence=single",
            "--only", "dtype=float32", "--only", "params=trainable", "--only", "grad_form=dense", "-n", "1",
            "--target", f"path:{fork}", "--out", str(out))
        results = json.loads((out / "run.json").read_text())["results"]
        assert results and all("outputs" in r["failed_checks"] for r in results if r["outcome"] != "crash"), \
            [(r["case_id"], r["outcome"], r["note"]) for r in results]
        assert any(r["outcome"] == "wrong_output" for r in results)


# ---- the sandbox: a tree cannot reach another process, the project, the venv or a fork server ----

SECRET = b"run-key-1f2e3d4c"  # what a hostile tree would read out of another process's memory
# A tree's RMSNorm that tries each way out of its worker and raises what each attempt gave, so the
# case's record carries every refusal. PTRACE_SEIZE, not ATTACH: unsandboxed, it must not stop the test.
SANDBOX_ATTACKS = """
import ctypes as _c, json as _json, os as _os, socket as _socket, torch as _torch
_forward = RMSNorm.op_forward
def _attempt(said, name, action):
    try:
        said[name] = action()
    except OSError as exc:
        said[name] = f"refused: {exc.strerror}"
def _read_memory():
    libc = _c.CDLL(None, use_errno=True)
    class Iov(_c.Structure):
        _fields_ = [("base", _c.c_void_p), ("len", _c.c_size_t)]
    buffer = _c.create_string_buffer(SIZE)
    local, remote = Iov(_c.addressof(buffer), SIZE), Iov(ADDRESS, SIZE)
    if libc.process_vm_readv(VICTIM, _c.byref(local), 1, _c.byref(remote), 1, 0) != SIZE:
        raise OSError(_c.get_errno(), _os.strerror(_c.get_errno()))
    return "read " + buffer.raw.decode(errors="replace")
def _ptrace():
    libc = _c.CDLL(None, use_errno=True)
    if libc.ptrace(0x4206, VICTIM, 0, 0) != 0:
        raise OSError(_c.get_errno(), _os.strerror(_c.get_errno()))
    return "attached"
def _proc_mem():
    with open(f"/proc/{VICTIM}/mem", "rb") as handle:
        handle.seek(ADDRESS)
        return "read " + handle.read(SIZE).decode(errors="replace")
def _open_for_writing(path):
    with open(path, "ab"):
        return "opened for writing"
def _connect(name):
    with _socket.socket(_socket.AF_UNIX) as client:
        client.connect("\\0" + name)
        return "connected"
def _attacking(self, *args, **kwargs):
    said = {}
    _attempt(said, "process_vm_readv", _read_memory)
    _attempt(said, "ptrace", _ptrace)
    _attempt(said, "proc_mem", _proc_mem)
    _attempt(said, "project", lambda: _open_for_writing(PROJECT_FILE))
    _attempt(said, "venv", lambda: _open_for_writing(_torch.__file__))
    _attempt(said, "run_dir", lambda: _open_for_writing(RUN_FILE))
    _attempt(said, "other_socket", lambda: _connect(SOCKET))
    _attempt(said, "fork_server", lambda: _connect(_os.environ.get("REPRO_FORKSERVER") or "none-named"))
    raise RuntimeError("sandbox attempts: " + _json.dumps(said))
RMSNorm.op_forward = _attacking
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces and seccomp are Linux's")
class TestTheSandboxHoldsTheTarget:
    """A tree whose op tries, in its worker, to read another process's memory (the test's own, by
    process_vm_readv, ptrace and /proc/PID/mem), to write the project's source, the venv and its run's
    results file, and to
    connect to another run's abstract socket and to its own run's fork server: each is refused, and
    the refusal is in the case's record. Skipped, with the kernel's reason, where namespaces are refused."""

    @pytest.fixture(scope="class")
    def attempts(self, release_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
        if reason := sandbox.refusal():
            pytest.skip(f"no sandbox on this machine: {reason}")
        root = tmp_path_factory.mktemp("attacker")
        shutil.copytree(release_root / "transformer_engine", root / "transformer_engine")
        listener = socket.socket(socket.AF_UNIX)  # another run's fork server, as a tree finds it in /proc/net/unix
        name = f"te-fuser-repro-victim-{os.getpid()}"
        listener.bind("\0" + name)
        listener.listen(8)
        code = SANDBOX_ATTACKS
        for placeholder, value in (("VICTIM", os.getpid()), ("ADDRESS", id(SECRET) + sys.getsizeof(b"") - 1),
                                   ("SIZE", len(SECRET)), ("PROJECT_FILE", repr(str(REPO / "harness/__init__.py"))),
                                   ("SOCKET", repr(name)),
                                   ("RUN_FILE", repr(str(root.parent / "run" / "results.jsonl")))):
            code = re.sub(rf"\b{placeholder}\b", str(value), code)
        _fork_with(root, code, "transformer_engine/pytorch/ops/basic/rmsnorm.py")
        out = root.parent / "run"
        try:
            cli("run", *SMOKE, "--target", f"path:{root}", "--out", str(out))
        finally:
            listener.close()
        errors = [r["error"]["message"] for r in json.loads((out / "run.json").read_text())["results"]
                  if r.get("error") and "sandbox attempts: " in r["error"]["message"]]
        assert errors, "no case ran the tree's op"
        return [json.loads(e.split("sandbox attempts: ", 1)[1]) for e in errors]

    @pytest.mark.parametrize("attack", ["process_vm_readv", "ptrace", "proc_mem"])
    def test_another_processes_memory_is_out_of_reach(self, attempts: list[dict[str, str]], attack: str) -> None:
        assert all(a[attack].startswith("refused: ") for a in attempts), attempts

    @pytest.mark.parametrize("attack", ["project", "venv", "run_dir"])
    def test_the_project_the_venv_and_the_run_dir_are_read_only(self, attempts: list[dict[str, str]], attack: str) -> None:
        assert all(a[attack] == "refused: Read-only file system" for a in attempts), attempts

    @pytest.mark.parametrize("attack", ["other_socket", "fork_server"])
    def test_no_abstract_socket_outside_is_reachable(self, attempts: list[dict[str, str]], attack: str) -> None:
        assert all(a[attack] == "refused: Connection refused" for a in attempts), attempts
