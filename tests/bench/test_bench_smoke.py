"""Every bench script run on its smallest input, so a change that breaks one fails the test suite
(issue 56, point 6: the command docs/benchmarks.md gave for bench/source_build.py had failed since
a refactor, and nothing ran it). No timing is judged here: each run must finish and say what it
says on its real input, small. The figures on docs/benchmarks.md come from the full runs.

Each script runs as docs/benchmarks.md runs it, a subprocess from the repository's root, with a
cache (ENVSPEC_CACHE) shared by this file's runs, so smoke.lock's .debs are fetched once, and its
own temporary folder. Scripts that need what this machine may lack (a GPU, root, loop devices,
the Debian mirror) skip with the reason."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "lockfiles/smoke.lock"
CONTAINERS = all(shutil.which(t) for t in ("podman", "buildah", "skopeo"))
pytestmark = [pytest.mark.network]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-cache")


def run(args: list[str], cache: Path, tmp: Path, timeout: int = 600, **env: str) -> str:
    """``python bench/ARGS...`` from the repository's root; its stdout, or the test fails with
    its output's tail."""
    e = dict(os.environ, ENVSPEC_CACHE=str(cache), TMPDIR=str(tmp), **env)
    e["PYTHONPATH"] = str(ROOT / "src") + (
        os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else ""
    )
    cp = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout
    )
    assert cp.returncode == 0, (
        f"{' '.join(args)} exited {cp.returncode}:\n{(cp.stdout + cp.stderr)[-4000:]}"
    )
    return cp.stdout


def needs_containers():
    if not CONTAINERS:
        pytest.skip("podman, buildah and skopeo are needed (scripts/dev.sh setup)")


@pytest.fixture
def storage(tmp_path):
    """A containers-storage of the test's own (ENVSPEC_STORAGE_ROOT, which the scripts' runs
    inherit), every image and mount in it removed afterwards (tests/e2e/conftest.private_storage)."""
    import importlib.util

    needs_containers()
    spec = importlib.util.spec_from_file_location("e2e_conftest", ROOT / "tests/e2e/conftest.py")
    assert spec is not None and spec.loader is not None
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)  # by its path: pytest has a `conftest` module of its own
    with e2e.private_storage(tmp_path / "storage"):
        yield


# --- offline or index-only scripts ------------------------------------------------------------


def test_abi(cache, tmp_path):
    out = run(["bench/abi.py", SMOKE, "--runs", "1"], cache, tmp_path)
    assert out.strip()


def test_explain_floor(cache, tmp_path):
    assert run(["bench/explain_floor.py", "--runs", "1"], cache, tmp_path).strip()


def test_explain_ab_against_this_tree(cache, tmp_path):
    assert run(["bench/explain_ab.py", str(ROOT), "--runs", "1"], cache, tmp_path).strip()


def test_lock(cache, tmp_path):
    assert run(["bench/lock.py", "specs/smoke.toml", "--runs", "1"], cache, tmp_path).strip()


def run_json(script: str, args: list[str], cache: Path, tmp: Path) -> dict:
    """``python bench/SCRIPT.py ARGS --json TMP/SCRIPT.json``: the results it wrote, read back."""
    out = tmp / f"{script}.json"
    run([f"bench/{script}.py", *args, "--json", str(out)], cache, tmp)
    said = json.loads(out.read_text())
    assert said, f"bench/{script}.py wrote no results"
    return said


def test_pyc(cache, tmp_path):
    said = run_json("pyc", [SMOKE], cache, tmp_path)
    assert said["layers"] and said["total"]["pyc_files"] > 0


def test_startup_hook(cache, tmp_path):
    assert run(["bench/startup_hook.py", "--lock", SMOKE, "--runs", "2"], cache, tmp_path).strip()


def test_verify_h200_summary_of_a_recorded_run(cache, tmp_path):
    rec = ROOT / "tests/data/verify/h200-run-2026-12-03/results.json"
    assert run(["bench/verify_h200_summary.py", str(rec)], cache, tmp_path).strip()


def test_cuda_extension_check_says_its_arguments(cache, tmp_path):
    """It needs a CUDA GPU and a built torchsort wheel (the device's run): here its arguments."""
    assert "usage" in run(["bench/cuda_extension_check.py", "--help"], cache, tmp_path)


def test_build_containers_storage_script_parses():
    cp = subprocess.run(["bash", "-n", "bench/build-containers-storage.sh"], cwd=ROOT)
    assert cp.returncode == 0


# --- builds of smoke.lock ---------------------------------------------------------------------


def test_source_build(cache, tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/dev.sh setup)")
    out = run(
        ["bench/source_build.py", "bench/lockfiles/cpu-source.lock", "--runs", "1"], cache, tmp_path
    )
    assert "from its sdist (same bytes every run)" in out


def test_push(cache, tmp_path):
    needs_containers()
    run_json(
        "push", ["--lock", SMOKE, "--compression", "none", "--tmp", str(tmp_path)], cache, tmp_path
    )


def test_cache_pull(cache, tmp_path):
    needs_containers()
    args = ["--lock", SMOKE, "--rounds", "1", "--fs", "tmp", "--tmp", str(tmp_path)]
    run_json("cache", args, cache, tmp_path)


def test_startup(cache, tmp_path, storage):
    args = ["--lock", SMOKE, "--runs", "1", "--verify-runs", "1", "--no-peer"]
    run_json("startup", args, cache, tmp_path)


def test_build_cli(cache, tmp_path, storage):
    args = ["--cli", "--lock", SMOKE, "--settle", "0", "--skip-empty-cache"]
    run_json("build", args, cache, tmp_path)


def test_arm64(cache, tmp_path, storage):
    args = ["--amd64-lock", SMOKE, "--arm64-lock", "lockfiles/smoke-arm64.lock"]
    run_json("arm64", [*args, "--rounds", "1", "--settle", "0"], cache, tmp_path)


def test_local_source(cache, tmp_path):
    needs_containers()
    if os.geteuid() != 0:
        pytest.skip("it mounts a loop file system of its own: root")
    args = ["--lock", SMOKE, "--rounds", "1", "--ways", "inplace", "--tmp", str(tmp_path)]
    run_json("local_source", args, cache, tmp_path)


def test_verify_quick_in_a_built_image(cache, tmp_path, storage):
    built = json.loads(run(["-m", "envspec", "build", SMOKE, "--json", "--quiet"], cache, tmp_path))
    run_json("verify_quick", ["--image", built["image"], "--runs", "1"], cache, tmp_path)


# --- the verifier's benches: on a GPU machine for their figures, on this one to run at all ------


def test_verify_h200_without_a_gpu(cache, tmp_path):
    run(
        ["bench/verify_h200.py", "--out", str(tmp_path / "h200"), "--gpus", "1", "--timeout", "15"],
        cache,
        tmp_path,
    )
    assert any((tmp_path / "h200").iterdir())


def test_verify_cpu_nodes(cache, tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("it runs the verifier's all-reduce across processes with this Python's torch")
    run(
        [
            "bench/verify_cpu_nodes.py",
            "--nodes",
            "2",
            "--out",
            str(tmp_path / "n"),
            "--timeout",
            "120",
        ],
        cache,
        tmp_path,
    )
    assert any((tmp_path / "n").iterdir())


def test_verify_ab_of_this_tree_against_itself(cache, tmp_path):
    """verify_ab.sh runs two trees' verifiers (here this tree's twice, with the system's Python:
    the verifier needs the standard library alone), verify_ab_compare.py finds no difference."""
    old = tmp_path / "old"
    shutil.copytree(ROOT / "src" / "envspec", old / "envspec")
    results = tmp_path / "ab"
    cp = subprocess.run(
        ["bash", "bench/verify_ab.sh", str(old), str(results), SMOKE],
        cwd=ROOT,
        env=dict(os.environ, PYTHON=shutil.which("python3") or sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    out = run(["bench/verify_ab_compare.py", str(results)], cache, tmp_path)
    assert "quick round 2" in out and "DIFFERS" not in out, out


def test_every_bench_script_has_a_smoke_run():
    """A script added to bench/ is added here too, or this fails."""
    text = Path(__file__).read_text()
    scripts = [p for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh")]
    assert len(scripts) > 15
    ran = [
        p.name
        for p in scripts
        if f"bench/{p.name}" in text or re.search(rf'run_json\(\s*"{p.stem}"', text)
    ]
    assert sorted({p.name for p in scripts} - {"_common.py", *ran}) == []
