"""image/bytecode.py: the wheel layers' .pyc (PEP 552 unchecked-hash, made by the image's CPython)."""

import csv
import importlib.util
import io
import marshal
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec.image import Reporter, layers  # noqa: E402
from envspec.image.bytecode import Compiler, find_compiler, pyc_path  # noqa: E402
from envspec.plan import make_plan  # noqa: E402

SITE = "opt/venv/lib/python3.11/site-packages/"
LOCK = helpers.load()
CHOICE = find_compiler(LOCK.platform)
needs_compiler = pytest.mark.skipif(not CHOICE.python, reason=f"no compiler: {CHOICE.reason}")

# Constants whose object identity the compiler decides by what the process interned before (torch's
# optimizer.py, _dynamo/source.py): a frozenset in several functions, keyword-name tuples,
# one-character strings.
TRICKY = b"""
def a(d):
    return d.type in {"cuda", "xpu"} and "{" + repr(d).replace("{", "{{") + "}"
def b(d):
    return d.type in {"cuda", "xpu"} or f(stacklevel=2)
def c(d):
    return g(stacklevel=2, x=("p q", "r-s")) or d in frozenset(("p q",)) or "p q"
"""
POLLUTE = (
    b'x = "{" + "}"\ny = obj.cuda.xpu.stacklevel\nz = ("p q", "r-s")\nimport sys; sys.intern("{")\n'
)


def _wheel(tmp_path):
    files = {
        "bcpkg/__init__.py": b"from .mod import VALUE\n",
        "bcpkg/mod.py": b"VALUE = 'from source'\n",
        "bcpkg/sub/__init__.py": b"",
        "bcpkg/sub/tricky.py": TRICKY,
        "bcpkg/templates/broken.py": b"{% if x %}def (:\n",  # shipped, never imported: no .pyc
        "bcpkg/data.txt": b"not a module\n",
    }
    (tmp_path / "w").mkdir(exist_ok=True)
    return helpers.make_wheel(tmp_path / "w", "bcpkg", "1.0", files=files)


def _make(tmp_path, out, compiler=(CHOICE.python, CHOICE.cache_tag)):
    path, _ = _wheel(tmp_path)
    return layers.make_wheel_layer(
        [(path.name, str(path), None)], LOCK.platform, out, compiler=compiler
    )


def _record(tf):
    text = tf.extractfile(SITE + "bcpkg-1.0.dist-info/RECORD").read().decode()
    return {row[0]: row for row in csv.reader(io.StringIO(text)) if row}


@needs_compiler
def test_every_module_gets_its_pyc_right_after_it_listed_in_record(tmp_path):
    res = _make(tmp_path, tmp_path / "l.tar")
    assert res.pyc.files == 4 and res.pyc.bytes > 0
    with tarfile.open(tmp_path / "l.tar") as tf:
        names = tf.getnames()
        record = _record(tf)
        for mod in (
            "bcpkg/__init__.py",
            "bcpkg/mod.py",
            "bcpkg/sub/__init__.py",
            "bcpkg/sub/tricky.py",
        ):
            pyc = pyc_path(mod, "cpython-311")
            assert names.index(SITE + pyc) > names.index(
                SITE + "bcpkg/data.txt"
            )  # after the wheel's files
            assert names.index(SITE + pyc) < names.index(SITE + "bcpkg-1.0.dist-info/RECORD")
            data = tf.extractfile(SITE + pyc).read()
            source = tf.extractfile(SITE + mod).read()
            assert record[pyc][1] == helpers._rec(data) and int(record[pyc][2]) == len(data)
            assert data[4:8] == b"\x01\0\0\0"  # hash-based, unchecked: no mtime
            assert data[8:16] == importlib.util.source_hash(source)
            assert marshal.loads(data[16:]).co_filename == "/" + SITE + mod  # the in-image path
        assert not [n for n in names if "broken" in n and n.endswith(".pyc")]
        assert SITE + "bcpkg/__pycache__/__init__.cpython-311.pyc" in names


@needs_compiler
def test_magic_number_is_the_compiling_interpreters(tmp_path):
    _make(tmp_path, tmp_path / "l.tar")
    magic = subprocess.run(
        [
            CHOICE.python,
            "-I",
            "-S",
            "-c",
            "import importlib.util,sys;sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER)",
        ],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(tmp_path / "l.tar") as tf:
        assert tf.extractfile(SITE + "bcpkg/__pycache__/mod.cpython-311.pyc").read()[:4] == magic


@needs_compiler
def test_two_layer_makes_are_byte_identical(tmp_path):
    a = _make(tmp_path, tmp_path / "a.tar")
    b = _make(tmp_path, tmp_path / "b.tar")
    assert a == b and (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


@needs_compiler
def test_pyc_bytes_do_not_depend_on_what_the_compiler_saw_before():
    path = "/opt/venv/lib/python3.11/site-packages/bcpkg/sub/tricky.py"
    with Compiler(CHOICE.python, CHOICE.cache_tag) as c:
        fresh = c.compile(path, TRICKY)
    with Compiler(CHOICE.python, CHOICE.cache_tag, children=1) as c:
        c.compile("/x/pollute.py", POLLUTE)
        after = c.compile(path, TRICKY)
        again = c.compile(path, TRICKY)
        assert c.compile("/x/bad.py", b"def (:\n") is None and c.failed == 1
    assert fresh is not None and fresh == after == again
    with Compiler(
        CHOICE.python, CHOICE.cache_tag, children=2
    ) as c:  # submitted ahead, two children
        tickets = [
            c.submit("/x/pollute.py", POLLUTE),
            c.submit(path, TRICKY),
            c.submit("/x/bad.py", b"def (:\n"),
            c.submit(path, TRICKY),
        ]
        got = [c.result(t) for t in tickets]
    assert got[1] == got[3] == fresh and got[2] is None and got[0] not in (None, fresh)


@needs_compiler
def test_the_images_python_imports_the_pyc_and_writes_none(tmp_path):
    """Unchecked-hash: the interpreter of the image's version runs the .pyc without reading the
    source; changing the source after the build does not change what is imported."""
    _make(tmp_path, tmp_path / "l.tar")
    root = tmp_path / "root"
    with tarfile.open(tmp_path / "l.tar") as tf:
        tf.extractall(root, filter="tar")
    site = root / SITE
    (site / "bcpkg" / "mod.py").write_bytes(b"VALUE = 'edited source'\n")
    before = sorted(p.relative_to(site).as_posix() for p in site.rglob("*"))
    code = "import bcpkg, bcpkg.mod, bcpkg.sub.tricky; print(bcpkg.VALUE, bcpkg.mod.__cached__)"
    out = subprocess.run(
        [CHOICE.python, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["from", "source", str(site / "bcpkg" / "__pycache__" / "mod.cpython-311.pyc")]
    assert (
        sorted(p.relative_to(site).as_posix() for p in site.rglob("*")) == before
    )  # nothing new written


@needs_compiler
def test_a_changed_pyc_fails_the_integrity_check(tmp_path):
    from envspec.verify import integrity

    _make(tmp_path, tmp_path / "l.tar")
    root = tmp_path / "root"
    with tarfile.open(tmp_path / "l.tar") as tf:
        tf.extractall(root, filter="tar")
    dists = list(integrity.find_dists([root / SITE]).values())
    fc = integrity.check_files(dists)  # full level: every file hashed
    assert fc.problems == [] and fc.hashed == len([e for d in dists for e in d.record if e.sha256])
    assert len([e for e in dists[0].record if e.rel.endswith(".pyc") and e.sha256 and e.size]) == 4
    pyc = root / SITE / "bcpkg" / "__pycache__" / "mod.cpython-311.pyc"
    data = bytearray(pyc.read_bytes())
    data[-1] ^= 1
    pyc.write_bytes(bytes(data))
    fc = integrity.check_files(dists)
    assert [(p.path, p.problem) for p in fc.problems] == [(os.path.realpath(pyc), "changed")]
    # the quick level checks a .pyc by size: a same-size change is the full level's to find
    assert integrity.check_files(dists, hash_all=False).problems == []


def test_without_a_compiler_of_the_images_version_no_pyc_a_warning_and_other_keys(tmp_path):
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.image import RecordingEngine, build

    lock, mirror = helpers.local_lock(tmp_path, [("teampkg", "1.0", "team")])
    d = helpers.data(lock)
    d["platform"]["python_full"] = "3.11.999"  # no such interpreter anywhere
    lock = helpers.rehash(d)

    class Warned(Reporter):
        messages: list[str] = []

        def warning(self, message):
            self.messages.append(message)

    rep = Warned()
    img = build(
        make_plan(lock),
        RecordingEngine(),
        Cache(tmp_path / "cache"),
        [sources.Mirror(mirror.as_uri(), "links", "t")],
        reporter=rep,
    )
    assert len(rep.messages) == 1 and "no .pyc" in rep.messages[0] and "3.11.999" in rep.messages[0]
    team = next(lay for lay in img.layers if lay.group == "team")
    assert (
        team.key
        == make_plan(lock, bytecode=False).layer("team").key
        != make_plan(lock).layer("team").key
    )
    with tarfile.open(Cache(tmp_path / "cache").layer_tar(team.key)) as tf:
        assert not [n for n in tf.getnames() if n.endswith(".pyc")]


def test_layer_keys_name_the_pyc_recipe():
    with_pyc, without = make_plan(LOCK), make_plan(LOCK, bytecode=False)
    assert not LOCK.debian  # no Debian packages: a base layer without Python modules, one key
    for a, b in zip(with_pyc.layers, without.layers):
        assert (a.key == b.key) == (a.group == "base"), a.group
    assert with_pyc.bytecode and not without.bytecode
    smoke = helpers.load(str(Path(__file__).resolve().parents[2] / "lockfiles" / "smoke.lock"))
    assert smoke.debian and smoke.debian.packages
    assert make_plan(smoke).layer("base").key != make_plan(smoke, bytecode=False).layer("base").key


STDLIB = {
    "usr/lib/python3.11/foo.py": b"import os\nFOO = 'from source'\n",
    "usr/lib/python3.11/pkg/__init__.py": b"",
    "usr/lib/python3.11/pkg/tricky.py": TRICKY,
    "usr/lib/python3.11/test/test_foo.py": b"X = 1\n",  # test suites: no .pyc
    "usr/lib/python3.11/lib2to3/tests/data/py2.py": b"print 'x'\n",
    "usr/lib/python3.11/bad.py": b"def (:\n",  # does not compile: no .pyc
    "usr/lib/python3/dist-packages/deb_mod.py": b"Y = 2\n",
    "usr/lib/python3.12/other.py": b"W = 4\n",  # another Python's: not the image's compiler's to make
    "usr/lib/python3.11/notes.txt": b"not a module\n",
    "usr/share/doc/x.py": b"Z = 3\n",  # outside the Python directories
}


def _rootfs(tmp_path):
    root = tmp_path / "rootfs"
    for rel, data in STDLIB.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "usr/lib/python3.11/link.py").symlink_to("foo.py")  # a symlink: its target's .pyc only
    return root


def _make_base(tmp_path, out):
    plan = make_plan(LOCK)
    return layers.make_base_layer(
        plan, _rootfs(tmp_path), out, compiler=(CHOICE.python, CHOICE.cache_tag)
    )


def test_rootfs_py_files_rule(tmp_path):
    assert layers.rootfs_py_files(_rootfs(tmp_path), LOCK.platform.python) == [
        "/usr/lib/python3.11/bad.py",
        "/usr/lib/python3.11/foo.py",
        "/usr/lib/python3.11/pkg/__init__.py",
        "/usr/lib/python3.11/pkg/tricky.py",
        "/usr/lib/python3/dist-packages/deb_mod.py",
    ]


@needs_compiler
def test_base_layer_carries_the_debian_python_modules_pyc(tmp_path):
    a = _make_base(tmp_path / "a", tmp_path / "a.tar")
    b = _make_base(tmp_path / "b", tmp_path / "b.tar")
    assert a == b and (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    assert a.pyc.files == 4 and a.pyc.bytes > 0
    with tarfile.open(tmp_path / "a.tar") as tf:
        pycs = sorted(n for n in tf.getnames() if n.endswith(".pyc"))
        assert pycs == [
            "usr/lib/python3.11/__pycache__/foo.cpython-311.pyc",
            "usr/lib/python3.11/pkg/__pycache__/__init__.cpython-311.pyc",
            "usr/lib/python3.11/pkg/__pycache__/tricky.cpython-311.pyc",
            "usr/lib/python3/dist-packages/__pycache__/deb_mod.cpython-311.pyc",
        ]
        m = tf.getmember("usr/lib/python3.11/__pycache__/foo.cpython-311.pyc")
        assert (m.mode, m.uid, m.gid) == (0o644, 0, 0)
        assert tf.getmember("usr/lib/python3.11/__pycache__").isdir()
        data = tf.extractfile(m).read()
    source = STDLIB["usr/lib/python3.11/foo.py"]
    assert data[4:8] == (0b01).to_bytes(4, "little")  # unchecked-hash
    hashed = subprocess.run(
        [
            CHOICE.python,
            "-I",
            "-S",
            "-c",
            "import importlib.util,sys;sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER"
            "+importlib.util.source_hash(sys.stdin.buffer.read()))",
        ],
        input=source,
        capture_output=True,
        check=True,
    ).stdout
    assert data[:4] == hashed[:4] and data[8:16] == hashed[4:]
    filename = (
        subprocess.run(
            [
                CHOICE.python,
                "-I",
                "-S",
                "-c",
                "import marshal,sys;print(marshal.loads(sys.stdin.buffer.read()[16:]).co_filename)",
            ],
            input=data,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    assert filename == "/usr/lib/python3.11/foo.py"


def test_base_layer_without_a_compiler_has_no_pyc(tmp_path):
    made = layers.make_base_layer(make_plan(LOCK), _rootfs(tmp_path), tmp_path / "l.tar")
    with tarfile.open(tmp_path / "l.tar") as tf:
        assert not [n for n in tf.getnames() if n.endswith(".pyc")] and made.pyc.files == 0


@needs_compiler
def test_envspec_layer_carries_the_verifiers_pyc(tmp_path):
    from envspec.services import ENVSPEC_LIB

    plan = make_plan(LOCK)
    made = layers.make_envspec_layer(
        plan,
        b"{}",
        tmp_path / "e.tar",
        service_files={},
        compiler=(CHOICE.python, CHOICE.cache_tag),
    )
    lib = ENVSPEC_LIB.strip("/")
    with tarfile.open(tmp_path / "e.tar") as tf:
        names = tf.getnames()
        sources = [n for n in names if n.startswith(lib + "/") and n.endswith(".py")]
        data = tf.extractfile(f"{lib}/envspec/verify/__pycache__/__init__.cpython-311.pyc").read()
    assert "envspec/verify/__main__.py" in "\n".join(sources)
    for src in sources:
        assert pyc_path(src, "cpython-311") in names, src
    assert made.pyc.files == len(sources)
    assert data[4:8] == (0b01).to_bytes(4, "little")


def test_pyc_path_follows_importlib():
    assert pyc_path("a/b/mod.py", "cpython-311") == "a/b/__pycache__/mod.cpython-311.pyc"
    assert pyc_path("top.py", "cpython-311") == "__pycache__/top.cpython-311.pyc"
    assert importlib.util.cache_from_source("/s/a/b/mod.py").endswith(
        "/s/a/b/__pycache__/mod.%s.pyc" % sys.implementation.cache_tag
    )
