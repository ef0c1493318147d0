"""`envspec lock` against the real indexes (PyPI / configured mirrors, Debian's mirror)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envspec import lock as lockmod
from envspec.cli import main
from envspec.sources import reachable

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(
        not reachable("https://pypi.org/simple") and not os.environ.get("CI"),
        reason="PyPI unreachable",
    ),
]

SMOKE = ROOT / "specs" / "smoke.toml"


def run_cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args], capture_output=True, text=True, env=env, cwd=ROOT
    )


def test_lock_smoke_pins_everything_and_is_reproducible(tmp_path):
    out = tmp_path / "smoke.lock"
    assert main(["lock", str(SMOKE), "-o", str(out), "-q"]) == 0
    lk = lockmod.load(out)
    assert {w.name for w in lk.wheels} == {"six", "idna"}
    assert all(len(w.sha256) == 64 and w.filename.endswith(".whl") and w.index for w in lk.wheels)
    assert lk.debian and lk.debian.suite == "bookworm"
    names = {p.name for p in lk.debian.packages}
    assert {"python3.11", "libc6", "ca-certificates"} <= names
    assert all(len(p.sha256) == 64 and p.filename.startswith("pool/") for p in lk.debian.packages)
    assert "file://" not in out.read_text(), "a lock never names a mirror's address"
    first = out.read_text()
    assert main(["lock", str(SMOKE), "-o", str(out), "-q"]) == 0
    assert out.read_text() == first, "re-locking an unchanged spec gives the same bytes"
    assert main(["lock", str(SMOKE), "-o", str(out), "--check"]) == 0


def test_a_two_platform_spec_locks_into_one_lock_with_a_section_each(tmp_path):
    out = tmp_path / "multi.lock"
    assert main(["lock", str(ROOT / "specs" / "smoke-multi.toml"), "-o", str(out), "-q"]) == 0
    lk = lockmod.load(out)
    assert (lk.version, lk.platform_names) == (2, ["linux-x86_64", "linux-aarch64"])
    for part, deb_arch, tag in zip(lk.parts, ("amd64", "arm64"), ("x86_64", "aarch64")):
        assert part.debian is not None and part.debian.architecture == deb_arch
        assert {p.architecture for p in part.debian.packages} <= {deb_arch, "all"}
        assert part.platform.platform_tag.endswith(tag) and {w.name for w in part.wheels} == {
            "six",
            "idna",
        }
    libc = [
        next(p for p in part.debian.packages if p.name == "libc6")
        for part in lk.parts
        if part.debian
    ]
    assert libc[0].sha256 != libc[1].sha256, "each section pins its own architecture's files"
    first = out.read_text()
    assert main(["lock", str(ROOT / "specs" / "smoke-multi.toml"), "-o", str(out), "--check"]) == 0
    assert main(["lock", str(ROOT / "specs" / "smoke-multi.toml"), "-o", str(out), "-q"]) == 0
    assert out.read_text() == first


def test_check_fails_with_reasons_when_the_spec_changes(tmp_path, capsys):
    spec = tmp_path / "smoke.toml"
    spec.write_text(SMOKE.read_text())
    out = tmp_path / "smoke.lock"
    assert main(["lock", str(spec), "-o", str(out), "-q"]) == 0
    spec.write_text(SMOKE.read_text().replace('"idna==3.7"', '"idna==3.6"'))
    capsys.readouterr()
    assert main(["lock", str(spec), "-o", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert "idna 3.7 in the lock does not satisfy 'idna==3.6'" in err and "envspec lock" in err


def test_a_hand_edited_lock_is_refused_and_relocking_rewrites_it(tmp_path, capsys, monkeypatch):
    """issue 43, 1: `lock --check` and `build` refuse a lock edited by hand, naming the field (the
    text `envspec lock` wrote is in the cache); `envspec lock` rewrites it from the spec."""
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    spec = tmp_path / "smoke.toml"
    spec.write_text(SMOKE.read_text())
    out = tmp_path / "smoke.lock"
    assert main(["lock", str(spec), "-o", str(out), "-q"]) == 0
    written = out.read_text()
    idna = next(w for w in lockmod.load(out).wheels if w.name == "idna")
    at = written.index('name = "idna"')
    out.write_text(
        written[:at] + written[at:].replace(f'version = "{idna.version}"', 'version = "3.99"', 1)
    )
    capsys.readouterr()
    for argv in (
        ["lock", str(spec), "-o", str(out), "--check"],
        ["build", "--dry-run", str(out)],
        ["doctor", str(out)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert (
            "lock-tampered" in err
            and f'wheels[idna].version, "{idna.version}" as written, "3.99" now' in err
        ), err
    assert main(["lock", str(spec), "-o", str(out), "-q"]) == 0
    assert "keeping none of its versions" in capsys.readouterr().err
    assert out.read_text() == written
    assert main(["lock", str(spec), "-o", str(out), "--check"]) == 0


def test_a_dry_run_of_a_spec_without_a_lock_writes_no_lockfile(tmp_path, capsys, monkeypatch):
    """issue 43, 6: `build --dry-run SPEC` resolved the spec into its lockfile and printed ~330 lines
    of JSON; it now locks in a temporary folder, leaves the lockfile alone, and says what it would
    build in a few lines (the whole plan with --json)."""
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs" / "smoke.toml"
    spec.write_text(SMOKE.read_text())
    capsys.readouterr()
    assert main(["build", "--dry-run", str(spec)]) == 0
    out, err = capsys.readouterr()
    assert not (tmp_path / "lockfiles").exists(), "a dry run writes no lockfile"
    assert "does not exist; locking" in err and "--dry-run" in err and "is not written" in err
    lines = out.splitlines()
    assert lines[0].startswith("dry run of ") and "nothing is built, fetched or written" in lines[0]
    assert any(line.startswith("image localhost/envspec/smoke:") for line in lines)
    assert len(lines) < 20 and "{" not in out
    assert main(["build", "--dry-run", "--json", str(spec)]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["image"].startswith("localhost/envspec/smoke:")
    assert not (tmp_path / "lockfiles").exists()


def test_relock_keeps_pins_and_upgrade_package_frees_one(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(
        'name = "pins"\n[python]\nversion = "3.11"\npackages = ["six", "idna"]\n[system]\nbase = "none"\n'
    )
    out = tmp_path / "pins.lock"
    assert main(["lock", str(spec), "-o", str(out), "-q"]) == 0
    # pretend an older lock pinned six 1.16.0 (with that file's real hash, as a lock would)
    lk = lockmod.loads(out.read_text())
    six = next(w for w in lk.wheels if w.name == "six")
    old = [
        w
        if w.name != "six"
        else w.model_copy(
            update={
                "version": "1.16.0",
                "filename": "six-1.16.0-py2.py3-none-any.whl",
                "sha256": "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254",
                "size": 11053,
            }
        )
        for w in lk.wheels
    ]
    lockmod.write_atomic(out, lockmod.dumps(lk.replace_part(wheels=old).with_hash()))
    assert main(["lock", str(spec), "-o", str(out), "-q"]) == 0
    assert next(w for w in lockmod.load(out).wheels if w.name == "six").version == "1.16.0"
    assert main(["lock", str(spec), "-o", str(out), "-q", "--upgrade-package", "six"]) == 0
    assert next(w for w in lockmod.load(out).wheels if w.name == "six").version == six.version


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_lock_leaves_the_old_lockfile_intact(tmp_path, sig):
    out = tmp_path / "smoke.lock"
    out.write_text("# the old lock\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for delay in (0.2, 0.5, 0.9):
        p = subprocess.Popen(
            [sys.executable, "-m", "envspec", "lock", str(SMOKE), "-o", str(out), "-q"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # not ignored as in `&` jobs
        time.sleep(delay)
        p.send_signal(sig)
        p.wait(timeout=60)
        text = out.read_text()
        assert text == "# the old lock\n" or (
            text.startswith("# envspec lockfile") and lockmod.loads(text)
        )
        left = [x.name for x in tmp_path.iterdir() if x.name != "smoke.lock"]
        if (
            sig == signal.SIGKILL
        ):  # nothing can clean up after SIGKILL: a stray temp file, never a torn lock
            left = [n for n in left if not (n.startswith(".smoke.lock.") and n.endswith(".tmp"))]
        assert not left, "no temp files left"
        if text != "# the old lock\n":
            out.write_text("# the old lock\n")


def test_cli_lock_json(tmp_path):
    out = tmp_path / "smoke.lock"
    r = run_cli("lock", str(SMOKE), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    import json

    data = json.loads(r.stdout)
    assert data["ok"] and data["wheels"] == 2 and data["content_hash"].startswith("sha256:")


def test_the_vllm_stack_locks_vllm_newest_first_on_the_real_index(tmp_path):
    """Torch and vllm chosen together against PyPI (resolve.with_packages): whatever today's releases
    are, the locked vllm is the newest that installs beside the locked torch, and every newer torch
    that fits the hardware is named as passed over, with the package that does not accept it."""
    import json

    from packaging.version import Version

    from envspec.compat import load_db
    from envspec.resolve import choose, fitting_releases
    from envspec.resolve.uv import _uv
    from envspec.spec import load_spec

    spec_path = tmp_path / "vllm.toml"
    spec_path.write_text(
        (ROOT / "bench" / "specs" / "vllm-l40s.toml").read_text()
    )  # Debian's base: manylinux_2_36
    out = tmp_path / "vllm.lock"
    cp = run_cli("lock", str(spec_path), "-o", str(out), "--json")
    assert cp.returncode == 0, cp.stderr
    said = json.loads(cp.stdout)["torch"][0]
    lk = lockmod.load(out)
    pins = {w.name: w.version for w in lk.wheels}
    assert said["version"] == pins["torch"] == lk.torch.version
    spec = load_spec(spec_path)
    fitting = fitting_releases(spec, load_db(), choose(spec, load_db()).gpus)
    newer = [v for v in fitting if Version(v) > Version(lk.torch.version)]
    older = [v for v in fitting if Version(v) < Version(lk.torch.version)][:2]
    assert sorted({h["torch"] for h in said["passed_over"]}) == sorted(newer)

    def newest_vllm_beside(torch: str) -> str | None:
        req = tmp_path / "r.in"
        req.write_text(f"vllm\ntorch=={torch}\n")
        proc = subprocess.run(
            [
                _uv(),
                "pip",
                "compile",
                str(req),
                "--no-header",
                "--quiet",
                "--only-binary",
                ":all:",
                "--python-version",
                "3.11",
                "--python-platform",
                "x86_64-manylinux_2_36",
                "--index-strategy",
                "unsafe-best-match",
                "-o",
                str(tmp_path / "r.txt"),
            ],
            capture_output=True,
            text=True,
            env=dict(os.environ, UV_NO_CONFIG="1"),
        )
        if proc.returncode != 0:
            return None
        return next(
            ln.split("==")[1]
            for ln in (tmp_path / "r.txt").read_text().splitlines()
            if ln.startswith("vllm==")
        )

    assert newest_vllm_beside(lk.torch.version) == pins["vllm"]
    for v in (
        newer
    ):  # each newer torch gets an older vllm, or none that installs: it was passed over for vllm
        other = newest_vllm_beside(v)
        assert other is None or Version(other) < Version(pins["vllm"]), (v, other)
    for v in older:  # and no older torch gets a newer vllm: the newest vllm decided (torch first would fail here)
        other = newest_vllm_beside(v)
        assert other is None or Version(other) <= Version(pins["vllm"]), (v, other)


def test_an_ancient_vllm_the_index_leaves_is_refused_not_locked(tmp_path):
    """Host-only (base "none": manylinux_2_28), newer vllm releases need wheels that exist only for a
    newer glibc, and the newest vllm that installs by its metadata can be 0.2.2 (torch>=2.1.0) beside
    torch 2.15.0, with which it does not import: the ABI check's companion table refuses that lock
    (issue 36) before anything is written. Whatever today's index gives, vllm 0.2.2 is never locked."""
    import json

    spec_path = tmp_path / "vllm.toml"
    spec_path.write_text(
        (ROOT / "bench" / "specs" / "vllm-l40s.toml").read_text() + '\n[system]\nbase = "none"\n'
    )
    out = tmp_path / "vllm.lock"
    cp = run_cli("lock", str(spec_path), "-o", str(out), "--json")
    if cp.returncode == 0:
        pins = {w.name: w.version for w in lockmod.load(out).wheels}
        assert pins["vllm"] != "0.2.2" or pins["torch"].startswith("2.1."), pins
    else:
        assert cp.returncode == 2 and not out.exists(), cp.stdout + cp.stderr
        err = json.loads(cp.stdout)["error"]
        assert err["reference"] == "abi-mismatch"
        assert [(m["package"], m["version"]) for m in err["mismatches"]] == [("vllm", "0.2.2")]
        assert err["mismatches"][0]["built_for"].startswith("2.1; companion table:")


def test_a_spec_written_by_init_locks_as_written(tmp_path, monkeypatch):
    """issue 42, 2: `envspec init` with every value given writes a spec that `envspec lock` takes.
    Issue 57: with pip configured (as many CI machines are) with a find-links folder holding
    torch 2.13.0+cpu, which PEP 440's torch==2.13.0 matches, the H100 spec locks PyPI's CUDA build:
    the folder is one this test makes, so what this machine's pip configuration holds plays no part."""
    from conftest import cpu_torch_links

    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    links = cpu_torch_links(tmp_path / "links")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "init",
                "--name",
                "fresh",
                "--gpu",
                "H100",
                "--driver",
                "580.65.06",
                "--torch",
                "2.13",
                "--python",
                "3.11",
                "--packages",
                "numpy>=2",
            ]
        )
        == 0
    )
    assert main(["lock", "specs/fresh.toml", "-q"]) == 0
    lk = lockmod.load(tmp_path / "lockfiles" / "fresh.lock")
    assert lk.torch is not None and (lk.torch.version, lk.torch.variant) == ("2.13.0", "cu130")
    torch = next(w for w in lk.wheels if w.name == "torch")
    assert (torch.version, torch.index) == ("2.13.0", "https://pypi.org/simple"), torch
    assert any(w.group == "cuda" for w in lk.wheels)  # NVIDIA's libraries, as PyPI's build needs
    assert "numpy" in {w.name for w in lk.wheels} and lk.meta.spec == "specs/fresh.toml"


TEAM = """name = "{name}"
[target]
gpus = ["H100"]
driver = "580.65.06"
[python]
version = "{python}"
packages = {packages}
held_back = "{held}"
[torch]
version = "2.*"
"""


def _team_lock(tmp_path, name, packages, *, python="3.11", held="warn"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / f"{name}.toml"
    spec.write_text(TEAM.format(name=name, python=python, packages=packages, held=held))
    out = tmp_path / f"{name}.lock"
    cp = run_cli("lock", str(spec), "-o", str(out), "--json")
    return cp, out


def test_a_conflict_over_torch_names_every_side_and_no_impossible_hint(tmp_path):
    """issue 57, 4: every vllm >= 0.17 pins torch 2.10.0, 2.11.0, 2.13.0 or 2.14.0, xformers
    0.0.33.post2 pins 2.9.1: both are named with the releases each installs beside, and the hint
    proposes no [torch].version (none installs both), where it said "2.9.*" naming xformers alone."""
    cp, out = _team_lock(tmp_path, "xf", '["vllm>=0.17", "xformers==0.0.33.post2"]')
    assert cp.returncode == 2 and not out.exists(), cp.stderr[-2000:]
    err = json.loads(cp.stdout)["error"]
    assert err["reference"] == "torch-conflict"
    assert "vllm>=0.17: torch 2.14.0, 2.13.0, 2.11.0, 2.10.0" in err["message"]
    assert "xformers==0.0.33.post2: torch 2.9.1" in err["message"]
    assert "[torch].version =" not in err["hint"] and "vllm>=0.17" in err["hint"]


def test_the_python_that_rules_a_package_out_is_named(tmp_path):
    """issue 57, 4: isaaclab on Python 3.13 (its releases have no cp313 wheels, or need
    omniverseclient, which has none): the Python is named, with one it installs on."""
    cp, out = _team_lock(tmp_path, "isaac", '["isaaclab"]', python="3.13")
    assert cp.returncode == 2 and not out.exists(), cp.stderr[-2000:]
    err = json.loads(cp.stdout)["error"]
    assert err["reference"] == "python-rules-out-package"
    assert "Python 3.13" in err["message"] and '[python].version = "3.12"' in err["hint"]


def test_a_metadata_build_that_imports_torch_gets_the_locks_torch(tmp_path):
    """issue 58, point 1: torch-scatter's setup.py imports torch to say its metadata and declares
    nothing (issue 57, 5 said so and stopped): its metadata build is retried with the lock's
    torch, and its wheel's build gets it too, named as undeclared. Without a [torch] table there
    is no torch to give: sdist-metadata-failed, with the hint to add one."""
    cp, out = _team_lock(tmp_path, "tg", '["torch-geometric", "torch-scatter"]')
    assert cp.returncode == 0, cp.stderr[-2000:]
    lock = lockmod.load(out)
    ts = next(w for w in lock.wheels if w.name == "torch-scatter")
    assert ts.filename.endswith(".tar.gz") and ts.source is not None
    assert ts.source.undeclared == ["torch"]
    torch = next(w for w in lock.wheels if w.name == "torch")
    assert (torch.name, torch.version) in {(b.name, b.version) for b in ts.source.build}
    assert "torch-scatter" in [f["name"] for f in json.loads(cp.stdout)["from_source"]]
    spec = tmp_path / "no-torch.toml"  # no GPUs either: a spec with GPUs needs a [torch] table
    spec.write_text('name = "nt"\n[python]\nversion = "3.11"\npackages = ["torch-scatter"]\n')
    cp = run_cli("lock", str(spec), "-o", str(tmp_path / "nt.lock"), "--json")
    assert cp.returncode == 2 and not (tmp_path / "nt.lock").exists(), cp.stderr[-2000:]
    err = json.loads(cp.stdout)["error"]
    assert err["reference"] == "sdist-metadata-failed"
    assert err["message"].startswith("torch-scatter ") and "imports torch" in err["message"]
    assert "[torch] table" in err["hint"] and "No module named 'torch'" in cp.stderr


def test_an_extra_whose_package_has_no_wheel_takes_its_sdist_not_a_placeholder(tmp_path):
    """issue 58, point 4: transformer-engine[pytorch] locked transformer-engine 0.0.0, a name kept
    on PyPI with no such extra (issue 57, 6 warned of it): wheels only, uv backtracked past every
    release whose transformer-engine-torch is an sdist only. Now the lock finds that dependency and
    builds it: the newest release, its torch extension from its sdist, its CUDA 13 core as a wheel;
    nothing held back, so held_back = "error" locks too."""
    cp, out = _team_lock(tmp_path, "te", '["transformer-engine[pytorch]"]', held="error")
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert json.loads(cp.stdout)["held_back"] == []
    pins = {w.name: w for w in lockmod.load(out).wheels}
    te = pins["transformer-engine"]
    assert te.version != "0.0.0" and not te.built
    assert pins["transformer-engine-torch"].built
    assert pins["transformer-engine-torch"].version == te.version
    assert pins["transformer-engine-cu13"].version == te.version  # the core its build's torch names
