"""The verifier inside a built image (CI: the image of specs/cpu.toml under podman).

Set ENVSPEC_VERIFY_IMAGE to the image (e.g. the tag `envspec build lockfiles/cpu.lock` printed)
and, if the image lives in a private storage root, ENVSPEC_PODMAN_ARGS (e.g. "--root /x
--runroot /y") and ENVSPEC_PODMAN_RUN_ARGS (options of `podman run`, e.g. "--runtime runc").
Skips where podman or the image is absent; never passes silently.
"""

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

IMAGE = os.environ.get("ENVSPEC_VERIFY_IMAGE", "")
WHEELS = Path(__file__).resolve().parents[1] / "data" / "verify" / "wheels"
if not shutil.which("podman"):
    pytest.skip("podman is not installed", allow_module_level=True)
if not IMAGE:
    pytest.skip("ENVSPEC_VERIFY_IMAGE is not set (build lockfiles/cpu.lock first)", allow_module_level=True)


def podman_run(script: str) -> subprocess.CompletedProcess:
    cmd = ["podman", *shlex.split(os.environ.get("ENVSPEC_PODMAN_ARGS", "")), "run", "--rm",
           *shlex.split(os.environ.get("ENVSPEC_PODMAN_RUN_ARGS", "")), "--user", "0",
           "-e", "ENVSPEC_VERIFY=off", "-v", f"{WHEELS}:/w:ro,Z", "--shm-size", "2g", IMAGE, "sh", "-c", script]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def report(p: subprocess.CompletedProcess) -> dict:
    start = p.stdout.index("{")
    return json.loads(p.stdout[start:])


def test_clean_image_passes_with_gpu_checks_skipped():
    p = podman_run("envspec verify --json")
    r = report(p)
    assert p.returncode == 0, p.stdout + p.stderr
    assert r["ok"] and r["mode"] == "image"
    by = {f["check"]: f for f in r["findings"]}
    assert by["integrity.files"]["status"] == "pass"
    assert all(by[c]["status"] == "skip" for c in ("gpu", "libs", "numerics.gpu"))


def test_one_changed_byte_fails_naming_the_file():
    change = ("python - <<'EOF'\n"
              "import sysconfig, pathlib\n"
              "p = pathlib.Path(sysconfig.get_paths()['purelib']) / 'torch' / 'version.py'\n"
              "b = bytearray(p.read_bytes()); b[0] ^= 1; p.write_bytes(bytes(b)); print(p)\n"
              "EOF\n")
    p = podman_run(change + "envspec verify --json")
    changed = p.stdout.splitlines()[0]
    r = report(p)
    assert p.returncode == 1
    f = {x["check"]: x for x in r["findings"]}["integrity.files"]
    assert f["status"] == "fail" and changed in f["observed"]


def test_extra_package_fails_naming_it():
    install = ("(python -m pip install --no-deps --no-index /w/example-21.12-py3-none-any.whl || "
               "python -c \"import sysconfig, zipfile; zipfile.ZipFile('/w/example-21.12-py3-none-any.whl')"
               ".extractall(sysconfig.get_paths()['purelib'])\") >/dev/null 2>&1; ")
    p = podman_run(install + "envspec verify --json")
    r = report(p)
    assert p.returncode == 1
    f = {x["check"]: x for x in r["findings"]}["integrity.extra"]
    assert f["status"] == "fail" and "example 21.12" in f["observed"]
