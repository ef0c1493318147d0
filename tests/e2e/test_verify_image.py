"""The verifier inside a built image (CI: the image of lockfiles/cpu.lock under podman).

The module builds that image with envspec into a private storage root and cache. To test an
image built elsewhere instead, set ENVSPEC_VERIFY_IMAGE (and, for a private storage root,
ENVSPEC_PODMAN_ARGS such as "--root /x --runroot /y" and ENVSPEC_PODMAN_RUN_ARGS such as
"--runtime runc"). Skips only where podman or buildah is absent.
"""

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "tests" / "data" / "verify" / "wheels"
for _tool in ("podman", "buildah", "skopeo"):
    if not shutil.which(_tool):
        pytest.skip(f"{_tool} is not installed (apt-get install -y {_tool})", allow_module_level=True)

_IMAGE: dict = {}


@pytest.fixture(scope="module", autouse=True)
def cpu_image(tmp_path_factory):
    """The image of lockfiles/cpu.lock, built by envspec (or the one ENVSPEC_VERIFY_IMAGE names)."""
    if os.environ.get("ENVSPEC_VERIFY_IMAGE"):
        _IMAGE.update(image=os.environ["ENVSPEC_VERIFY_IMAGE"],
                      podman=shlex.split(os.environ.get("ENVSPEC_PODMAN_ARGS", "")),
                      run=shlex.split(os.environ.get("ENVSPEC_PODMAN_RUN_ARGS", "")))
        yield
        return
    from conftest import private_storage

    from envspec import sources
    from envspec.build import BuildahEngine, build
    from envspec.build.fetch import Cache
    from envspec.lock import load
    from envspec.plan import make_plan
    from envspec.run import podman_args

    base = tmp_path_factory.mktemp("verify-image")
    with private_storage(base / "storage") as host:
        built = build(make_plan(load(ROOT / "lockfiles" / "cpu.lock")), BuildahEngine(host), Cache(base / "cache"),
                      sources.discover().mirrors)
        glob, run = podman_args(host)
        _IMAGE.update(image=built.image, podman=glob, run=run)
        yield


def podman_run(script: str) -> subprocess.CompletedProcess:
    cmd = ["podman", *_IMAGE["podman"], "run", "--rm", *_IMAGE["run"], "--user", "0",
           "-e", "ENVSPEC_VERIFY=off", "-v", f"{WHEELS}:/w:ro,Z", "--shm-size", "2g", _IMAGE["image"],
           "sh", "-c", script]
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


def test_torch_comes_from_the_built_pyc_and_a_changed_pyc_fails_naming_it():
    """torch runs from the layer's .pyc (unchecked-hash: a source changed inside the container is
    not what runs) and an import writes no .pyc; one changed byte of a .pyc fails the integrity check."""
    script = ("python - <<'EOF'\n"
              "import pathlib, sysconfig\n"
              "site = pathlib.Path(sysconfig.get_paths()['purelib'])\n"
              "p = site / 'torch' / 'version.py'\n"
              "p.write_text(p.read_text() + '\\nraise SystemExit(\"the source ran\")\\n')\n"
              "pathlib.Path('/tmp/before').write_text(str(len(list(site.rglob('*')))))\n"
              "EOF\n"
              "python -c 'import torch, torch.version; print(torch.version.__cached__)' 2>/dev/null | tail -1\n"
              "python - <<'EOF'\n"
              "import pathlib, sysconfig\n"
              "site = pathlib.Path(sysconfig.get_paths()['purelib'])\n"
              "print(len(list(site.rglob('*'))) == int(pathlib.Path('/tmp/before').read_text()))\n"
              "p = sorted((site / 'torch' / 'utils').rglob('*.cpython-311.pyc'))[-1]\n"
              "b = bytearray(p.read_bytes()); b[-1] ^= 1; p.write_bytes(bytes(b)); print(p)\n"
              "EOF\n"
              "envspec verify --json --skip torch.compile")  # the probe is not what is tested here
    p = podman_run(script)
    lines = p.stdout.splitlines()
    assert len(lines) > 3, p.stdout + p.stderr
    assert lines[:2] == ["/opt/venv/lib/python3.11/site-packages/torch/__pycache__/version.cpython-311.pyc", "True"]
    changed = lines[2]
    r = report(p)
    assert p.returncode == 1, p.stdout + p.stderr
    f = {x["check"]: x for x in r["findings"]}["integrity.files"]
    assert f["status"] == "fail" and changed in f["data"]["files"]


def test_extra_package_fails_naming_it():
    install = ("(python -m pip install --no-deps --no-index /w/example-21.12-py3-none-any.whl || "
               "python -c \"import sysconfig, zipfile; zipfile.ZipFile('/w/example-21.12-py3-none-any.whl')"
               ".extractall(sysconfig.get_paths()['purelib'])\") >/dev/null 2>&1; ")
    p = podman_run(install + "envspec verify --json")
    r = report(p)
    assert p.returncode == 1
    f = {x["check"]: x for x in r["findings"]}["integrity.extra"]
    assert f["status"] == "fail" and "example 21.12" in f["observed"]
