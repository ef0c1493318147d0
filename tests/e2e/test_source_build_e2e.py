"""Packages with no wheel, end to end (issue 37): deepspeed 0.19.8 is published as an sdist only;
torch-scatter 2.1.2 too, and it is a torch extension whose setup.py imports torch undeclared
(issue 58, point 5: its build gets the lock's torch, and compiles its C++ against it).

- `envspec lock` of specs/cpu.toml plus `deepspeed` (PyPI, real) locks deepspeed 0.19.8 by its
  sdist with its build inputs, not 0.3.1.dev5 (its one release with a wheel, of 2020);
- machine A's `envspec build --cache-to` builds its wheel in a sandbox of the lock's Debian base
  (ops not prebuilt, deepspeed's own default without torch at build time), puts it in the source
  layer, pushes the layers to a registry (tests/e2e/tlsregistry.py), and the image imports it;
- the wheel built a second time (its cache entry and layer gone) has the same bytes, and the
  image the same digest;
- machine B, with an empty cache, builds from the registry cache (`--cache-from`): the source
  layer comes from the registry and nothing is built from source there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tlsregistry  # noqa: E402

from envspec import lock as lockmod  # noqa: E402
from envspec import sources  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    *tlsregistry.pytest_marks(),
    pytest.mark.skipif(
        shutil.which("bwrap") is None, reason="bubblewrap is not installed (scripts/dev.sh setup)"
    ),
    pytest.mark.skipif(
        not sources.reachable("https://pypi.org/simple") and not os.environ.get("CI"),
        reason="PyPI unreachable",
    ),
]


def machine(base: Path, name: str) -> dict[str, str]:
    """A machine's environment: its own envspec cache (the .debs shared, to fetch them once)."""
    cache = base / f"cache-{name}"
    if not cache.exists():
        cache.mkdir()
        (cache / "debs").symlink_to(base / "debs")
    return {
        **os.environ,
        "ENVSPEC_CACHE": str(cache),
        "PYTHONPATH": str(ROOT / "src"),
        "XDG_RUNTIME_DIR": str(base / f"runtime-{name}"),
    }


def envspec(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=1200,
    )


def ok(cp: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert cp.returncode == 0, (cp.stdout[-3000:], cp.stderr[-4000:])
    return cp


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from conftest import out_of_reach

    if (why := out_of_reach(ROOT / "lockfiles" / "cpu.lock")) is not None:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("source-build-e2e")
    (base / "debs").mkdir()
    spec = base / "ds.toml"
    spec.write_text(
        (ROOT / "specs" / "cpu.toml")
        .read_text()
        .replace('name = "cpu"', 'name = "cpu-deepspeed"')
        .replace('packages = ["numpy>=2"]', 'packages = ["numpy>=2", "deepspeed", "torch-scatter"]')
    )
    lock = base / "ds.lock"
    # re-locked from the committed CPU lock: its torch 2.13.0+cpu is PyTorch's (download.pytorch.org/
    # whl/cpu), which this machine cannot read to confirm a mirror's copy; the lock being re-locked
    # is the record of that file (issue 57: a file only a mirror has is never credited to an index)
    shutil.copy(ROOT / "lockfiles" / "cpu.lock", lock)
    said = json.loads(
        ok(envspec(machine(base, "a"), "lock", str(spec), "-o", str(lock), "--json")).stdout
    )
    with tlsregistry.start_tls_registry(base / "reg") as reg:
        yield base, spec, lock, said, reg


def _run(host, image: str, code: str) -> str:
    from envspec.run import podman_args

    cp = subprocess.run(
        [
            "podman",
            *host.storage.args(),
            "run",
            "--rm",
            *podman_args(host)[1],
            "--network=none",
            image,
            "python",
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    return cp.stdout


def test_sdists_are_locked_built_imported_reproduced_and_shared(world, tmp_path):
    from conftest import private_storage

    base, spec, lock_path, said, reg = world
    lock = lockmod.load(lock_path)
    ds = next(w for w in lock.wheels if w.name == "deepspeed")
    assert (ds.version, ds.filename, lock.revision) == ("0.19.8", "deepspeed-0.19.8.tar.gz", 4)
    assert ds.source is not None and ds.source.backend == "setuptools.build_meta:__legacy__"
    assert [b.name for b in ds.source.build] == ["setuptools"] and ds.source.python.startswith(
        "3.11."
    )
    assert ds.source.compiler.startswith("gcc-12 ")  # the compiler of the lock's Debian base
    assert [f["name"] for f in said["from_source"]] == ["deepspeed", "torch-scatter"]
    assert said["held_back"] == []
    # issue 58, point 6: its cost said before it is paid, from its sdist's sources
    assert said["from_source"][0]["estimate_s"] > 0
    assert "from its sdist's" in said["from_source"][0]["estimate"]
    torch = next(w for w in lock.wheels if w.name == "torch")
    assert torch.version == "2.13.0+cpu"
    # issue 58, point 1: its metadata and its wheel are built with the lock's own torch, which its
    # setup.py imports and does not declare; a CPU torch: its C++ alone, no CUDA toolkit
    ts = next(w for w in lock.wheels if w.name == "torch-scatter")
    assert (ts.version, ts.filename) == ("2.1.2", "torch_scatter-2.1.2.tar.gz")
    assert ts.source is not None and ts.source.undeclared == ["torch"] and ts.source.toolkit == []
    assert {(b.name, b.version, b.sha256) for b in ts.source.build} >= {
        (torch.name, torch.version, torch.sha256)
    }

    cache_ref = f"{reg.address}/team/envspec-source"
    regargs = ("--authfile", str(reg.authfile), "--cert-dir", str(reg.cert_dir))
    built_a = Path(machine(base, "a")["ENVSPEC_CACHE"]) / "built" / ds.source.key.split(":", 1)[1]
    built_ts = built_a.parent / ts.source.key.split(":", 1)[1]
    with private_storage(tmp_path / "storage-a") as host:
        env_a = machine(base, "a")  # in the block: with its ENVSPEC_STORAGE_ROOT
        dry = " ".join(ok(envspec(env_a, "build", str(lock_path), "--dry-run")).stdout.split())
        assert "deepspeed 0.19.8 (to build, about" in dry and "--cache-to REPO" in dry, dry
        cp = ok(
            envspec(
                env_a,
                "build",
                str(lock_path),
                "--tag",
                "localhost/envspec-ds:1",
                "--cache-to",
                cache_ref,
                *regargs,
            )
        )
        assert (
            "building deepspeed 0.19.8 from its sdist" in cp.stderr
            and "built deepspeed-0.19.8-py3-none-any.whl" in cp.stderr
        )
        assert "building torch-scatter 2.1.2 from its sdist" in cp.stderr
        first = json.loads((built_a / "wheel.json").read_text())
        first_ts = json.loads((built_ts / "wheel.json").read_text())
        assert first_ts["filename"].startswith("torch_scatter-2.1.2-cp311-cp311-linux_x86_64")
        assert (
            first["filename"] == "deepspeed-0.19.8-py3-none-any.whl"
            and (built_a / "build.log").is_file()
        )
        out = _run(
            host,
            "localhost/envspec-ds:1",
            "import deepspeed, torch; print(deepspeed.__version__, torch.__version__)",
        )
        assert out.split()[-2:] == ["0.19.8", "2.13.0+cpu"], out
        # one op of the extension, against plain torch
        out = _run(
            host,
            "localhost/envspec-ds:1",
            "import torch, torch_scatter; src = torch.arange(1.0, 9.0); i = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2]);"
            "got = torch_scatter.scatter(src, i, reduce='sum');"
            "want = torch.zeros(3).index_add_(0, i, src);"
            "print(torch.equal(got, want), got.tolist())",
        )
        assert out.split()[-4:] == ["True", "[10.0,", "7.0,", "19.0]"], out
        digest = subprocess.run(
            [
                "podman",
                *host.storage.args(),
                "image",
                "inspect",
                "--format",
                "{{.Digest}}",
                "localhost/envspec-ds:1",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip()

    # the wheel built again, from nothing cached (its entry and its layer gone): the same bytes
    from envspec.plan import make_plan

    source_layer = make_plan(lock).layer("source").key.split(":", 1)[1]
    shutil.rmtree(built_a)
    shutil.rmtree(built_ts)
    for p in (built_a.parents[1] / "layers").glob(source_layer + "*"):
        p.unlink()
    with private_storage(tmp_path / "storage-a2") as host:
        env_a = machine(base, "a")
        again = json.loads(
            ok(
                envspec(env_a, "build", str(lock_path), "--tag", "localhost/envspec-ds:2", "--json")
            ).stdout
        )
    second = json.loads((built_a / "wheel.json").read_text())
    assert second["sha256"] == first["sha256"], "the same inputs gave another wheel"
    again_ts = json.loads((built_ts / "wheel.json").read_text())
    assert again_ts["sha256"] == first_ts["sha256"], "torch-scatter: the same inputs, another wheel"
    layers = {lay["group"]: lay for lay in again["layers"]}
    assert layers["source"]["source"] == "made" and again["store_digest"] == digest

    # machine B: an empty cache, the layers from the registry; nothing is built from source there
    with private_storage(tmp_path / "storage-b") as host:
        env_b = machine(base, "b")
        b = json.loads(
            ok(
                envspec(
                    env_b,
                    "build",
                    str(lock_path),
                    "--tag",
                    "localhost/envspec-ds:3",
                    "--json",
                    "--cache-from",
                    cache_ref,
                    *regargs,
                )
            ).stdout
        )
        assert {lay["group"]: lay["source"] for lay in b["layers"]}["source"] == "registry"
        assert b["store_digest"] == digest
        assert not (Path(env_b["ENVSPEC_CACHE"]) / "built").exists()
        out = _run(host, "localhost/envspec-ds:3", "import deepspeed; print(deepspeed.__version__)")
        assert out.split()[-1] == "0.19.8"


def _sdist(dest: Path, name: str, setup: str) -> Path:
    """A legacy sdist ``name``-1.0.tar.gz whose setup.py is ``setup``."""
    from tests.unit.test_sdist import _tar

    return _tar(
        dest / f"{name}-1.0.tar.gz",
        {
            f"{name}-1.0/setup.py": setup,
            f"{name}-1.0/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        },
    )


PROBE = """
import json, os, socket, subprocess, sys
from setuptools import setup
try:
    socket.create_connection(("pypi.org", 443), timeout=5).close()
    net = "reached pypi.org"
except OSError as e:
    net = type(e).__name__
cc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
os.makedirs("probe", exist_ok=True)
with open("probe/__init__.py", "w") as f:
    f.write("SEEN = " + repr(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "net": net,
                                          "cc": cc, "env": sorted(os.environ)})) + "\\n")
setup(name="probe", version="1.0", packages=["probe"])
"""


def test_the_sandbox_is_the_locks_debian_base_without_network_and_a_failure_keeps_its_log(
    world, tmp_path
):
    """What a build from an sdist sees (wheels/sdist.py's sandbox): the lock's Python and gcc, no
    network, no host environment; a failing build says where its log is (source-build-failed)."""
    import zipfile

    from envspec import debian
    from envspec.errors import SourceBuildError
    from envspec.resolve.uv import _uv
    from envspec.wheels import sdist as sd

    base, _spec, lock_path, _said, _reg = world
    lock = lockmod.load(lock_path)
    setuptools = next(w for w in lock.wheels if w.name == "deepspeed").source.build[0]
    cache = Path(machine(base, "a")["ENVSPEC_CACHE"])
    files = {setuptools.sha256: cache / "blobs" / "sha256" / setuptools.sha256}
    if not files[setuptools.sha256].is_file():  # the first test fetched it; alone, fetch it here
        from envspec.cache.store import Cache
        from envspec.wheels.fetch import WheelFetcher

        files = WheelFetcher(Cache(cache), sources.discover(None).mirrors).fetch_all([setuptools])
    debs = list(lock.debian.packages)
    paths = debian.fetch_debs(
        debs, mirrors=debian.mirror_list(lock.debian.mirror), cache_dir=base / "debs"
    )
    debian.make_rootfs(debs, paths, tmp_path / "rootfs")
    box = sd.Sandbox(tmp_path / "rootfs", f"/usr/bin/python{lock.platform.python}")
    pin = sd.Pin(setuptools.name, setuptools.version, setuptools.filename, setuptools.sha256)

    def derivation(path: Path) -> sd.Derivation:
        import hashlib

        return sd.Derivation(
            sd.Pin(
                path.name.split("-")[0],
                "1.0",
                path.name,
                hashlib.sha256(path.read_bytes()).hexdigest(),
            ),
            (pin,),
            python=lock.platform.python_full,
            platform=lock.platform.platform_tag,
        )

    probe = _sdist(tmp_path, "probe", PROBE)
    os.environ["ENVSPEC_TEST_SECRET"] = "host"
    try:
        wheel = sd.build_wheel(
            derivation(probe),
            probe,
            files,
            tmp_path / "out",
            log=tmp_path / "probe.log",
            builder=sd.Builder(uv=_uv(), python="unused", sandbox=box, jobs=3),
        )
    finally:
        del os.environ["ENVSPEC_TEST_SECRET"]
    with zipfile.ZipFile(wheel) as z:
        seen = json.loads(z.read("probe/__init__.py").decode().split("=", 1)[1].strip().strip("'"))
    assert seen["python"] == lock.platform.python_full  # the image's Python, not the host's
    assert seen["executable"].startswith(
        "/tmp/envspec-sdist/"
    )  # uv's build venv of /usr/bin/python3.11
    compiler = next(w for w in lock.wheels if w.name == "deepspeed").source.compiler
    assert compiler.split()[1].split("-")[0] in seen["cc"] and "Debian" in seen["cc"], seen["cc"]
    assert seen["net"] != "reached pypi.org", seen["net"]
    assert (
        "ENVSPEC_TEST_SECRET" not in seen["env"]
        and "MAKEFLAGS" in seen["env"]
        and "SOURCE_DATE_EPOCH" in seen["env"]
    )

    broken = _sdist(tmp_path, "broken", "raise SystemExit('this package cannot be built here')\n")
    with pytest.raises(SourceBuildError) as e:
        sd.build_wheel(
            derivation(broken),
            broken,
            files,
            tmp_path / "out",
            log=tmp_path / "broken.log",
            builder=sd.Builder(uv=_uv(), python="unused", sandbox=box),
        )
    assert e.value.exit_code == 4 and e.value.reference == "source-build-failed"
    assert (
        "this package cannot be built here" in e.value.stderr_tail
        and (tmp_path / "broken.log").is_file()
    )
    assert str(tmp_path / "broken.log") in (e.value.hint or "")
