"""A wheel built from a real sdist with pinned inputs (src/envspec/wheels/sdist.py), by uv's build
in an isolated environment holding exactly the pinned build requirements, offline.

markupsafe 3.0.2's sdist (a C extension, setuptools>=70.1) built twice, the second time from a
process whose environment carries what a user's shell or CI may set (another umask and time zone,
CFLAGS, an index URL, a HOME), gives the same wheel bytes, and its extension loads. What had to be
fixed for that: the source is unpacked at a fixed path (the compiler writes it into the extension's
debug information: from another folder only the .so and RECORD differ), SOURCE_DATE_EPOCH (the zip
entries' times), and an environment made from the derivation alone (docs/build.md).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from envspec import sources
from envspec.errors import EXIT_BUILD, SourceBuildError
from envspec.resolve.uv import _uv
from envspec.wheels import sdist as sd

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.network,
    pytest.mark.skipif(
        not sources.reachable("https://pypi.org/simple") and not os.environ.get("CI"),
        reason="PyPI unreachable",
    ),
]


def _download(dest: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), *args],
        check=True,
        capture_output=True,
        timeout=600,
    )


def _pin(path: Path) -> sd.Pin:
    name, version = path.name.split("-")[:2]
    return sd.Pin(
        name.lower(),
        version.removesuffix(".tar.gz"),
        path.name,
        hashlib.sha256(path.read_bytes()).hexdigest(),
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdist")
    _download(tmp, "--no-deps", "--no-binary", ":all:", "markupsafe==3.0.2")
    sdist = tmp / "markupsafe-3.0.2.tar.gz"
    requires, backend, _ = sd.build_system(sdist)
    assert (requires, backend) == (["setuptools>=70.1"], "setuptools.build_meta")
    wheels = tmp / "build-wheels"
    _download(wheels, "--only-binary", ":all:", *requires)
    files = sorted(wheels.glob("*.whl"))
    d = sd.Derivation(_pin(sdist), tuple(_pin(f) for f in files), "3.11", "manylinux_2_36_x86_64")
    return tmp, sdist, {p.sha256: f for p, f in zip(d.build_requires, files)}, d


def _build(d, sdist, files, out: Path, env: dict | None = None) -> Path:
    """The build in a child process (its own environment and umask, as another machine's shell)."""
    code = (
        "import sys; from pathlib import Path; from envspec.wheels import sdist as sd; import pickle\n"
        "d, sdist, files, out, uv = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
        "b = sd.Builder(uv=uv, python=sys.executable)\n"
        "print(sd.build_wheel(d, sdist, files, out, builder=b, log=out / 'build.log'))\n"
    )
    import pickle

    arg = pickle.dumps((d, sdist, files, out, _uv())).hex()
    full = dict(
        os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"), **(env or {})
    )
    cp = subprocess.run(
        [sys.executable, "-c", code, arg], capture_output=True, text=True, env=full, timeout=900
    )
    assert cp.returncode == 0, cp.stdout + cp.stderr
    return Path(cp.stdout.strip().splitlines()[-1])


def test_the_same_inputs_give_the_same_wheel_bytes_whatever_the_caller_environment(inputs):
    tmp, sdist, files, d = inputs
    first = _build(d, sdist, files, tmp / "out-1")
    noisy = {
        "CFLAGS": "-O0 -g3",
        "TZ": "Asia/Tokyo",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "UV_INDEX_URL": "http://127.0.0.1:9/simple",
        "HOME": str(tmp),
        "SOURCE_DATE_EPOCH": "1700000000",
        "LC_ALL": "C",
    }
    second = _build(d, sdist, files, tmp / "out-2", env=noisy)
    assert first.name == second.name == "markupsafe-3.0.2-cp311-cp311-linux_x86_64.whl"
    assert (
        hashlib.sha256(first.read_bytes()).hexdigest()
        == hashlib.sha256(second.read_bytes()).hexdigest()
    )
    assert (tmp / "out-1" / "build.log").read_text().count(
        d.key
    ) == 1  # the log is kept, named for its inputs
    # the wheel is whole: its extension loads
    site = tmp / "site"
    zipfile.ZipFile(first).extractall(site)
    cp = subprocess.run(
        [sys.executable, "-c", "import markupsafe._speedups as s; print(s.__file__)"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(site)),
    )
    assert cp.returncode == 0 and str(site) in cp.stdout, cp.stderr


def test_a_failing_build_says_where_its_log_is(inputs, tmp_path):
    _, _, files, d = inputs
    broken = tmp_path / "broken-1.0.tar.gz"
    with tarfile.open(broken, "w:gz") as t:
        for name, text in {
            "broken-1.0/pyproject.toml": '[build-system]\nrequires = ["setuptools>=70.1"]\n'
            'build-backend = "setuptools.build_meta"\n',
            "broken-1.0/setup.py": "raise SystemExit('this package cannot be built here')\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            import io

            t.addfile(info, io.BytesIO(data))
    bd = sd.Derivation(_pin(broken), d.build_requires, "3.11", d.platform)
    log = tmp_path / "logs" / "broken.log"
    with pytest.raises(SourceBuildError) as e:
        sd.build_wheel(
            bd,
            broken,
            files,
            tmp_path / "out",
            log=log,
            builder=sd.Builder(uv=_uv(), python=sys.executable),
        )
    assert e.value.exit_code == EXIT_BUILD == 4 and e.value.reference == "source-build-failed"
    assert "this package cannot be built here" in e.value.message  # the log's tail
    assert str(log) in e.value.hint and "this package cannot be built here" in log.read_text()
    assert not (tmp_path / "out").exists()


def test_a_legacy_sdist_is_built_with_setuptools_legacy_backend(tmp_path):
    _download(tmp_path, "--no-deps", "--no-binary", ":all:", "deepspeed==0.19.8")
    assert sd.build_system(tmp_path / "deepspeed-0.19.8.tar.gz") == (
        ["setuptools>=40.8.0"],
        "setuptools.build_meta:__legacy__",
        (),
    )


def test_the_build_inputs_are_resolved_pinned_fetched_and_built_from(inputs, tmp_path):
    """resolve.build_inputs pins the sdist's build requirements as wheels for the image's platform and
    Python (with their sha256), the fetcher takes them by hash, and the build uses exactly those."""
    from envspec.cache.store import Cache
    from envspec.compat import load_db
    from envspec.lock import Wheel
    from envspec.resolve import build_inputs, choose
    from envspec.spec import load_spec
    from envspec.wheels.fetch import WheelFetcher

    _, sdist, _, _ = inputs
    spec = load_spec(Path(__file__).resolve().parents[2] / "specs" / "cpu.toml")
    choice = choose(spec, load_db())
    requires = sd.build_system(sdist).requires
    found = build_inputs(
        requires, choice, sources.discover(spec.sources), workdir=tmp_path / "uv", name="markupsafe"
    )
    assert [w.name for w in found] == ["setuptools"] and all(len(w.sha256) == 64 for w in found)
    assert found[0].index == "https://pypi.org/simple" and found[0].group == "build"
    pins = [
        Wheel(
            name=w.name,
            version=w.version,
            filename=w.filename,
            index=w.index,
            sha256=w.sha256,
            size=w.size,
            group=w.group,
        )
        for w in found
    ]
    paths = WheelFetcher(
        Cache(tmp_path / "cache"), sources.discover(spec.sources).mirrors
    ).fetch_all(pins)
    d = sd.Derivation(
        _pin(sdist),
        tuple(sd.Pin(w.name, w.version, w.filename, w.sha256) for w in found),
        choice.python,
        choice.platform_tag,
    )
    wheel = sd.build_wheel(
        d,
        sdist,
        paths,
        tmp_path / "out",
        log=tmp_path / "build.log",
        builder=sd.Builder(uv=_uv(), python=sys.executable),
    )
    assert wheel.name == "markupsafe-3.0.2-cp311-cp311-linux_x86_64.whl"
    assert f"derivation {d.key}" in (tmp_path / "build.log").read_text()


def test_a_built_wheel_is_kept_by_its_inputs_hash_and_checked_when_taken(inputs, tmp_path):
    _, sdist, files, d = inputs
    cache = tmp_path / "cache"
    wheel, built = sd.cached_build(
        d, sdist, files, cache, builder=sd.Builder(uv=_uv(), python=sys.executable)
    )
    assert built and wheel.parent == cache / "built" / d.key.split(":", 1)[1]
    assert (wheel.parent / "build.log").is_file()
    again, built = sd.cached_build(
        d, sdist, files, cache, builder=sd.Builder(uv=_uv(), python=sys.executable)
    )
    assert (again, built) == (wheel, False)  # taken from the cache, not built
    data = bytearray(wheel.read_bytes())
    data[100] ^= 1
    wheel.write_bytes(bytes(data))  # a damaged entry is built again
    healed, built = sd.cached_build(
        d, sdist, files, cache, builder=sd.Builder(uv=_uv(), python=sys.executable)
    )
    assert built and healed == wheel
    import json

    assert (
        hashlib.sha256(healed.read_bytes()).hexdigest()
        == json.loads((wheel.parent / "wheel.json").read_text())["sha256"]
    )
