"""envspec.debian end to end against Debian's real mirror: apt's closure, the .debs, a root
filesystem that runs under chroot. Skips cleanly where the mirror, apt or root is missing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from envspec.debian import (
    DebianArchive,
    DebPin,
    RecordingReporter,
    base_packages,
    fetch_deb,
    fetch_debs,
    make_rootfs,
    mirror_list,
    resolve_closure,
)
from envspec.debian.fetch import SNAPSHOT_ENV, KeepAliveOpener
from envspec.errors import ResolutionImpossible, SourceError

pytestmark = [pytest.mark.e2e, pytest.mark.network]

MIRROR = os.environ.get("ENVSPEC_DEBIAN_MIRROR", "http://deb.debian.org/debian")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
AS_ROOT = os.geteuid() == 0


def _mirror_up() -> bool:
    try:
        with urllib.request.urlopen(f"{MIRROR}/dists/bookworm/InRelease", timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


if shutil.which("apt-get") is None:
    pytest.skip("apt-get is not installed", allow_module_level=True)
if not KEYRING.exists():
    pytest.skip(
        f"{KEYRING} is missing (apt-get install debian-archive-keyring)", allow_module_level=True
    )
if not _mirror_up():
    pytest.skip(f"the Debian mirror {MIRROR} is not reachable", allow_module_level=True)

CHROOT = shutil.which("chroot")
needs_root = pytest.mark.skipif(
    not AS_ROOT or CHROOT is None, reason="chroot and ldconfig -r need root"
)


@pytest.fixture(autouse=True)
def _no_snapshot(monkeypatch):
    monkeypatch.delenv(SNAPSHOT_ENV, raising=False)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("debian-cache")


@pytest.fixture(scope="module")
def small(cache):
    """The runtime base set (no GPU, no services) of bookworm, resolved once for the module."""
    rep = RecordingReporter()
    pins = resolve_closure(
        "bookworm",
        base_packages("bookworm", gpu=False),
        cache_dir=cache,
        reporter=rep,
        archive=DebianArchive(mirror=MIRROR),
    )
    return pins, rep


def chroot(root: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    return subprocess.run(
        [CHROOT, str(root), *argv], capture_output=True, text=True, env=env, timeout=120
    )


def test_closure_is_complete_and_exact(small):
    pins, rep = small
    names = {p.name for p in pins}
    assert set(base_packages("bookworm", gpu=False)) <= names
    assert {"libc6", "libpython3.11-minimal", "libssl3", "openssl"} <= names  # apt's closure
    assert [p.name for p in pins] == sorted(p.name for p in pins)
    assert all(len(p.sha256) == 64 and p.size > 0 and p.filename.startswith("pool/") for p in pins)
    assert {p.suite for p in pins} <= {"bookworm", "bookworm-updates", "bookworm-security"}
    assert "index_updated" in rep.names()


def test_warm_resolve_uses_the_cache(small, cache):
    pins, _ = small
    rep = RecordingReporter()
    again = resolve_closure(
        "bookworm",
        base_packages("bookworm", gpu=False),
        cache_dir=cache,
        reporter=rep,
        archive=DebianArchive(mirror=MIRROR),
    )
    assert again == pins
    assert "index_fresh" in rep.names() and "index_updating" not in rep.names()


def test_unreachable_mirror_uses_cached_indexes(small, cache, monkeypatch):
    pins, _ = small
    for var in ("http_proxy", "https_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # nothing listens there: apt cannot connect
    rep = RecordingReporter()
    again = resolve_closure(
        "bookworm",
        base_packages("bookworm", gpu=False),
        cache_dir=cache,
        max_index_age=0,
        reporter=rep,
        archive=DebianArchive(mirror=MIRROR),
    )
    assert again == pins
    warnings = [a[0] for n, a in rep.events if n == "warning"]
    assert warnings and "using the cached ones" in warnings[0]


def test_unknown_package_with_did_you_mean(small, cache):
    with pytest.raises(ResolutionImpossible) as ei:
        resolve_closure(
            "bookworm", ["pyton3", "bash"], cache_dir=cache, archive=DebianArchive(mirror=MIRROR)
        )
    assert ei.value.reference == "unknown-debian-package"
    assert "did you mean 'python3'" in ei.value.message
    # each cause in words, not a raw dict (issue 43, 15)
    from envspec.explain import cause_sentence

    said = cause_sentence(ei.value.causes[0])
    assert said.startswith("no package named 'pyton3' in Debian bookworm (bookworm")
    assert "did you mean 'python3'" in said and "{" not in said


def test_an_unknown_package_the_spec_names_is_shown_at_its_key_and_line(tmp_path, monkeypatch):
    """issue 43, 15: `envspec lock` printed each unknown Debian package as a raw Python dict."""
    from envspec.cli import main

    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    spec = tmp_path / "s.toml"
    spec.write_text(
        'name = "s"\n[python]\nversion = "3.11"\n[system]\npackages = ["nosuchpkg-xyz", "libgomp1"]\n'
    )
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["lock", str(spec), "-o", str(tmp_path / "s.lock"), "-q"]) == 2
    text = err.getvalue()
    assert (
        f"[system].packages[0] ({spec}:5): no package named 'nosuchpkg-xyz' in Debian bookworm"
        in text
    ), text
    assert "{'kind'" not in text


def test_unsatisfiable_request(small, cache):
    with pytest.raises(ResolutionImpossible) as ei:
        resolve_closure(
            "bookworm",
            ["exim4-daemon-light", "exim4-daemon-heavy"],
            cache_dir=cache,
            archive=DebianArchive(mirror=MIRROR),
        )
    assert ei.value.reference == "debian-unsatisfiable" and "Conflicts" in ei.value.message


@needs_root
def test_rootfs_runs_python_with_tls_roots(small, cache, tmp_path):
    pins, _ = small
    paths = fetch_debs(pins, mirrors=mirror_list(MIRROR, snapshot=""), cache_dir=cache)
    root = tmp_path / "rootfs"
    rep = RecordingReporter()
    make_rootfs(pins, paths, root, reporter=rep)
    assert not [a for n, a in rep.events if n == "warning"]
    r = chroot(
        root,
        "/usr/bin/python3",
        "-c",
        "import ssl, sqlite3, zoneinfo; ctx = ssl.create_default_context(); "
        "print(len(ctx.get_ca_certs()) > 100, sqlite3.sqlite_version_info >= (3,), "
        "zoneinfo.ZoneInfo('Europe/Paris').key)",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "Europe/Paris"]
    assert chroot(root, "/bin/sh", "-c", "true").returncode == 0
    r = chroot(
        root,
        "/bin/bash",
        "-c",
        "id envspec && stat -c '%a %U' /tmp /workspace && /usr/bin/tini --version",
    )
    assert r.returncode == 0, r.stderr
    assert "uid=1000(envspec)" in r.stdout and "1777 root" in r.stdout and "755 envspec" in r.stdout
    r = chroot(root, "/sbin/ldconfig", "-p")
    assert r.returncode == 0 and "libssl.so.3" in r.stdout
    if shutil.which("dpkg"):
        audit = subprocess.run(
            ["dpkg", f"--admindir={root}/var/lib/dpkg", "--audit"], capture_output=True, text=True
        )
        assert audit.returncode == 0 and audit.stdout == ""
        listed = subprocess.run(
            ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package}\n"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert sorted(listed) == sorted(p.name for p in pins)


def test_cache_reuse_does_not_touch_the_network(small, cache):
    pins, _ = small
    some = [p for p in pins if p.name in ("bash", "dash", "tini")]
    calls: list[str] = []
    real = KeepAliveOpener()

    def counting(url, timeout):
        calls.append(url)
        return real(url, timeout)

    fetch_debs(some, mirrors=[MIRROR], cache_dir=cache, opener=counting)
    first = len(calls)
    fetch_debs(some, mirrors=[MIRROR], cache_dir=cache, opener=counting)
    assert len(calls) == first  # the second fetch came from the cache


def test_a_tampered_cache_file_is_fetched_again(small, tmp_path):
    pins, _ = small
    pin = next(p for p in pins if p.name == "tini")
    path = fetch_deb(pin, mirrors=[MIRROR], cache_dir=tmp_path)
    assert path.stat().st_mode & 0o777 == 0o444
    good = path.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    rep = RecordingReporter()
    again = fetch_deb(pin, mirrors=[MIRROR], cache_dir=tmp_path, reporter=rep)
    assert again == path and path.read_bytes() == good
    assert [e for e in rep.events if e[0] == "fetched"][-1][1][
        2
    ] is False  # downloaded, not taken as cached
    warned = [e[1][0] for e in rep.events if e[0] == "warning"]
    assert len(warned) == 1 and hashlib.sha256(data).hexdigest() in warned[0]


def test_pinned_version_gone_from_the_mirror(small, tmp_path):
    pins, _ = small
    libc = next(p for p in pins if p.name == "libc6")
    fake_version = libc.version + "+gone1"
    gone = DebPin(
        **{
            **libc.model_dump(),
            "version": fake_version,
            "filename": libc.filename.replace(libc.version.split(":")[-1], fake_version),
        }
    )
    with pytest.raises(SourceError) as ei:
        fetch_deb(gone, mirrors=[MIRROR], cache_dir=tmp_path)
    e = ei.value
    assert e.reference == "deb-gone" and e.exit_code == 3
    assert f"libc6 {fake_version}" in e.message and "404" in e.message
    assert (
        "snapshot.debian.org/archive/debian/<timestamp>" in e.hint
        and "--upgrade-package libc6" in e.hint
    )


@pytest.mark.slow
@needs_root
def test_gpu_base_compiles_a_python_extension(cache, tmp_path):
    """What Triton does at run time for torch.compile: cc with Python.h, then import the module."""
    req = base_packages("bookworm", gpu=True, services={"ssh"})
    pins = resolve_closure("bookworm", req, cache_dir=cache, archive=DebianArchive(mirror=MIRROR))
    paths = fetch_debs(pins, mirrors=[MIRROR], cache_dir=cache)
    root = tmp_path / "rootfs"
    make_rootfs(pins, paths, root)
    (root / "tmp/m.c").write_text(
        "#include <Python.h>\n#include <stdlib.h>\n"
        "static PyObject* f(PyObject* s, PyObject* a) { return PyLong_FromLong(42); }\n"
        'static PyMethodDef M[] = {{"f", f, METH_NOARGS, ""}, {0}};\n'
        'static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "m", 0, -1, M};\n'
        "PyMODINIT_FUNC PyInit_m(void) { return PyModule_Create(&D); }\n"
    )
    r = chroot(
        root,
        "/bin/sh",
        "-c",
        "cd /tmp && cc -O1 -shared -fPIC -I/usr/include/python3.11 m.c -o m.so && "
        "python3 -c 'import sys; sys.path.insert(0, \"/tmp\"); import m; print(m.f())'",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "42"
    assert os.readlink(root / "usr/bin/cc") == "gcc"
    assert (root / "usr/sbin/sshd").is_file() and (root / "etc/ssh/sshd_config").is_file()
    assert "sshd:x:100:" in (root / "etc/passwd").read_text()


@needs_root
def test_trixie_rootfs_runs(cache, tmp_path):
    """trixie: Python 3.13, base-files shipping the merged-/usr links itself."""
    pins = resolve_closure(
        "trixie",
        base_packages("trixie", gpu=False),
        cache_dir=cache,
        archive=DebianArchive(mirror=MIRROR),
    )
    paths = fetch_debs(pins, mirrors=[MIRROR], cache_dir=cache)
    root = tmp_path / "rootfs"
    make_rootfs(pins, paths, root)
    r = chroot(
        root,
        "/usr/bin/python3",
        "-c",
        "import ssl, sys; print(sys.version_info[:2] == (3, 13), len(ssl.create_default_context().get_ca_certs()) > 100)",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]
    assert os.readlink(root / "bin") == "usr/bin"
