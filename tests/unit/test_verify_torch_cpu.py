"""The verifier with a real (CPU) torch: host and image mode against a lock of this python."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from envspec.verify import cli, run_checks  # noqa: E402
from envspec.verify.torchprobe import CompileProbe  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "verify"))
from this_python import lock_text_for_this_python, with_content_hash  # noqa: E402


@pytest.fixture
def this_lock(tmp_path):
    p = tmp_path / "this.lock"
    p.write_text(lock_text_for_this_python(sys.prefix))
    return p


def test_cli_json_against_this_python_passes(this_lock, tmp_path, capsys):
    prom = tmp_path / "verify.prom"
    rc = cli.main(
        ["--lock", str(this_lock), "--json", "--skip", "torch.compile", "--prometheus", str(prom)]
    )
    d = json.loads(capsys.readouterr().out)
    by = {f["check"]: f for f in d["findings"]}
    assert rc == 0, json.dumps(d, indent=1)
    assert d["ok"] and d["mode"] == "image"
    assert by["torch.version"]["status"] == "pass"
    assert by["integrity.files"]["status"] == "pass"
    assert by["integrity.packages"]["status"] == "pass"
    if not torch.cuda.is_available():
        assert by["numerics.cpu"]["status"] == "pass"
        assert by["gpu"]["status"] == "skip"
    assert "envspec_verify_ok{" in prom.read_text()


def test_host_mode_relaxes_extra_packages(this_lock):
    from envspec.verify.lockfile import load_lock

    lock = load_lock(this_lock)
    lock["wheels"] = [w for w in lock["wheels"] if w["name"] == "torch"]
    r = run_checks(lock, level="quick", mode="host", skip=("torch.compile",))
    f = {x.check: x for x in r.findings}
    assert f["integrity.extra"].status == "warn"
    assert r.ok


def test_wrong_torch_version_fails(this_lock):
    from envspec.verify.lockfile import load_lock

    lock = load_lock(this_lock)
    lock["torch"]["version"] = "1.0.0"
    r = run_checks(lock, level="quick", skip=("torch.compile", "integrity"))
    f = {x.check: x for x in r.findings}
    assert f["torch.version"].status == "fail" and f["torch.version"].expected.startswith("1.0.0")
    assert r.exit_code == 1


def test_python_m_entry_point_and_exit_code(this_lock):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "envspec.verify",
            "--lock",
            str(this_lock),
            "--skip",
            "torch.compile,integrity.files",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK:" in p.stdout and "STATUS  CHECK" in p.stdout


def test_startup_hook_is_quiet_when_all_is_well(this_lock, capsys):
    # (its cost is measured in bench/, not asserted here)
    rc = cli.startup_check("strict", lock_path=str(this_lock))
    assert rc == 0
    assert "FAIL" not in capsys.readouterr().err


def test_startup_leaves_torch_to_verify(tmp_path, capsys):
    # the hook imports no torch (docs/verify.md): a wrong torch starts, and `envspec verify` fails it
    p = tmp_path / "wrong.lock"
    p.write_text(
        with_content_hash(
            lock_text_for_this_python(sys.prefix).replace(
                f'version = "{torch.__version__.split("+")[0]}"', 'version = "1.0.0"', 1
            )
        )
    )
    assert cli.startup_check("strict", lock_path=str(p)) == 0
    assert "torch" not in capsys.readouterr().err
    assert cli.main(["--lock", str(p), "--skip", "torch.compile,integrity"]) == 1
    assert "FAIL    torch.version" in capsys.readouterr().out


def test_torch_compile_child_runs():
    res = CompileProbe(timeout=240).result()
    assert res["ok"], res
