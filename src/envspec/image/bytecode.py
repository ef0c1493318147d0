"""Byte-compiled Python for the layers: reproducible PEP 552 ``.pyc`` files (the wheels', the
Debian Python modules' in the base layer, the verifier's: ``layers.add_pyc``).

Each wheel's ``.py`` files under site-packages get ``__pycache__/NAME.cpython-3XY.pyc`` beside
them in the layer tar: each source is sent to the compiler as it is written (it is in memory:
nothing is read twice), and the wheel's .pyc follow its other files. Rules (docs/build.md, "Byte-compiled Python"):

- **unchecked-hash** invalidation (flags ``0b01``): the header carries the source's hash, no
  mtime, and the image's Python loads the file without reading or hashing the source. The image
  is immutable (the venv belongs to root); a source changed afterwards is caught by the
  verifier's RECORD check (the ``.py`` and the ``.pyc`` are both listed), not by Python.
- **The image's own interpreter compiles.** The bytes of a ``.pyc`` depend on the compiler's
  exact version (CPython 3.11.2 and 3.11.7 differ on 18 of torch's 2370 modules), so a compiler
  whose ``major.minor.micro`` equals the lock's ``[platform].python_full`` is used: the builder's
  own python when it is that version, else ``pythonX.Y`` on PATH or in /usr/bin and
  /usr/local/bin that reports it (a Debian builder has the image's python3.11 as its own). It
  runs as children of each layer worker (``python -I -S``, fixed hash seed, two where there are
  two cores), fed sources over pipes while the worker goes on inflating; a wheel's .pyc follow
  its other files in the tar. No such interpreter: no ``.pyc`` (a warning event) and other layer keys (``plan``).
- **Canonical bytes.** ``marshal`` output depends on the compiling process's state: whether a
  one-character string is interned, whether equal constant tuples/frozensets are one object.
  The compiler interns every one-character (Latin-1) string and the empty string first, and
  rebuilds every code object with equal constants and name tuples merged across the module
  before marshalling, so the same source gives the same bytes whatever the process compiled
  before (tests/unit/test_build_bytecode.py compiles after a "polluting" module to check).
- ``co_filename`` is the in-image path; optimisation level 0; a source that does not compile
  (a template, Python 2 code) gets no ``.pyc``, as with pip.
"""

from __future__ import annotations

import os
import queue
import shutil
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from envspec.lock import Platform

INVALIDATION = "unchecked-hash"
RECIPE = "pyc-1"  # bump when the bytes made for the same source and compiler change

# The compiler child: reads (in-image path, source) frames from stdin, answers each with the
# .pyc bytes (an empty frame when the source does not compile). Standard library only; runs under
# ``-I -S`` so its state is the interpreter's alone.
_SERVER = r'''
import importlib.util, marshal, struct, sys
for _i in range(256):
    sys.intern(chr(_i))
sys.intern("")
_code = type(compile("", "", "exec"))

def _canonical(code):
    """Equal constants and name tuples (tuples, frozensets, str, bytes, numbers) as one object
    each, module-wide."""
    memo, seen = {}, {}
    _str, _bytes, _tuple, _frozenset, _float, _complex, _int = str, bytes, tuple, frozenset, float, complex, int
    # Each object's key (equal keys: one object) is made once, from its items' keys. A str or bytes is
    # its own key (neither equals the other, nor any key tuple); other keys are (type, ...), so that
    # 1, 1.0 and True stay apart.
    def walk(o):
        t = type(o)
        if t is _str:
            return (o if len(o) < 2 else seen.setdefault(o, o)), o
        if t is _bytes:
            return seen.setdefault(o, o), o
        got = memo.get(id(o))
        if got is not None:
            return got
        if t is _code:  # always rebuilt, so every code object's tuples come the same way
            new = o.replace(co_consts=_tuple([walk(c)[0] for c in o.co_consts]), co_names=walk(o.co_names)[0],
                            co_varnames=walk(o.co_varnames)[0], co_freevars=walk(o.co_freevars)[0],
                            co_cellvars=walk(o.co_cellvars)[0])
            got = (new, (t, new))
        elif t is _tuple or t is _frozenset:
            pairs = [walk(i) for i in o]
            new = o
            for p, i in zip(pairs, o):
                if p[0] is not i:
                    new = t([p[0] for p in pairs])
                    break
            k = (t, _tuple([p[1] for p in pairs]) if t is _tuple else _frozenset([p[1] for p in pairs]))
            got = (seen.setdefault(k, new), k)
        elif t is _float or t is _complex:
            k = (t, repr(o), struct.pack("<d", o.real), struct.pack("<d", o.imag))
            got = (seen.setdefault(k, o), k)
        elif t is _int:
            k = (t, o)
            got = (seen.setdefault(k, o), k)
        else:
            got = (o, (t, o))
        memo[id(o)] = (got[0], got[1], o)
        return got
    out = walk(code)[0]
    memo.clear(); seen.clear()
    return out

def _read(n):
    b = sys.stdin.buffer.read(n)
    if len(b) != n:
        raise SystemExit(0)
    return b

out = sys.stdout.buffer
while True:
    (n,) = struct.unpack(">I", _read(4))
    path = _read(n).decode("utf-8", "surrogateescape")
    (n,) = struct.unpack(">I", _read(4))
    source = _read(n)
    try:
        code = _canonical(compile(source, path, "exec", dont_inherit=True, optimize=0))
        data = (importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
                + importlib.util.source_hash(source) + marshal.dumps(code))
    except (SyntaxError, ValueError, UnicodeDecodeError, OverflowError, RecursionError, MemoryError):
        data = b""
    out.write(struct.pack(">I", len(data)))
    out.write(data)
    out.flush()
'''

_VERSION_PROBE = "import sys;print(sys.implementation.name, '%d.%d.%d' % sys.version_info[:3], sys.implementation.cache_tag)"


@dataclass(frozen=True)
class CompilerChoice:
    """The interpreter that compiles the image's .pyc (``python`` ""), or why there is none."""

    python: str
    version: str = ""
    cache_tag: str = ""  # "cpython-311"
    reason: str = ""  # when python is ""


def _probe(python: str) -> tuple[str, str, str] | None:
    if python == sys.executable:  # this interpreter: asked here, not in a process of its own
        return (
            sys.implementation.name,
            "%d.%d.%d" % sys.version_info[:3],
            sys.implementation.cache_tag or "",
        )
    try:
        res = subprocess.run(
            [python, "-I", "-S", "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    parts = res.stdout.split()
    return (parts[0], parts[1], parts[2]) if res.returncode == 0 and len(parts) == 3 else None


def find_compiler(platform: Platform) -> CompilerChoice:
    """A CPython whose version is the image's (``platform.python_full``): the builder's own, or
    ``python{X.Y}`` on PATH, in /usr/bin, in /usr/local/bin."""
    want = platform.python_full
    if not want:
        return CompilerChoice(
            "",
            reason="the lock's [platform].python_full is empty (the image's exact Python is unknown)",
        )
    candidates = [
        sys.executable,
        shutil.which(f"python{platform.python}") or "",
        f"/usr/bin/python{platform.python}",
        f"/usr/local/bin/python{platform.python}",
    ]
    usable = [c for c in dict.fromkeys(candidates) if c and os.access(c, os.X_OK)]
    # asked all at once, the first in this order taken: a pyenv shim alone takes 50 ms or more,
    # and on a node's pull every layer comes from the registry while this is asked (issue 59)
    with ThreadPoolExecutor(max_workers=max(1, len(usable))) as pool:
        answers = list(pool.map(_probe, usable))
    found: list[str] = []
    for c, got in zip(usable, answers):
        if got is None:
            continue
        found.append(f"{c} ({got[1]})")
        if got[0] == "cpython" and got[1] == want:
            return CompilerChoice(c, version=got[1], cache_tag=got[2])
    return CompilerChoice(
        "",
        reason=f"no CPython {want} (the image's) on this host to compile with"
        + (f"; found {', '.join(found)}" if found else ""),
    )


def pyc_path(py_path: str, cache_tag: str) -> str:
    """``a/b/mod.py`` -> ``a/b/__pycache__/mod.cpython-311.pyc`` (importlib's rule, opt level 0)."""
    head, _, name = py_path.rpartition("/")
    stem = name[:-3]
    return (
        f"{head}/__pycache__/{stem}.{cache_tag}.pyc"
        if head
        else f"__pycache__/{stem}.{cache_tag}.pyc"
    )


class Compiler:
    """The compiler children of one layer worker (a context). ``submit`` sends a source to the
    next child, round robin, and returns at once; ``result`` waits for that source's .pyc. So
    the worker keeps inflating while its children compile, on as many cores as are free. Each
    compile is independent of the others (canonical bytes), so which child made one does not
    show in its bytes."""

    def __init__(self, python: str, cache_tag: str, children: int = 0) -> None:
        self.python, self.cache_tag = python, cache_tag
        self.children = children or max(1, min(2, os.cpu_count() or 1))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.answers: list[queue.Queue[bytes | None]] = []
        self.readers: list[threading.Thread] = []
        self.sent = 0
        self.compiled = 0
        self.failed = 0

    def __enter__(self) -> Compiler:
        env = {
            "PYTHONHASHSEED": "0",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LC_ALL": "C.UTF-8",
        }
        for _ in range(self.children):
            proc = subprocess.Popen(
                [self.python, "-I", "-S", "-c", _SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            answers: queue.Queue[bytes | None] = queue.Queue()
            reader = threading.Thread(target=_read_answers, args=(proc, answers), daemon=True)
            reader.start()
            self.procs.append(proc)
            self.answers.append(answers)
            self.readers.append(reader)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc, reader in zip(self.procs, self.readers):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(timeout=30)
        self.procs, self.answers, self.readers = [], [], []

    def submit(self, in_image_path: str, source: bytes) -> int:
        """Send ``source`` (its code objects naming ``in_image_path``) to be compiled; a ticket."""
        ticket = self.sent
        proc = self.procs[ticket % len(self.procs)]
        assert proc.stdin is not None
        p = in_image_path.encode("utf-8", "surrogateescape")
        try:
            proc.stdin.write(struct.pack(">I", len(p)) + p + struct.pack(">I", len(source)))
            proc.stdin.write(source)
            proc.stdin.flush()
        except OSError as e:
            raise RuntimeError(f"the bytecode compiler ({self.python}) ended unexpectedly") from e
        self.sent += 1
        return ticket

    def result(self, ticket: int) -> bytes | None:
        """The .pyc of a submitted source, or None where it does not compile. Tickets are
        redeemed in the order they were given."""
        data = self.answers[ticket % len(self.answers)].get()
        if data is None:
            raise RuntimeError(f"the bytecode compiler ({self.python}) ended unexpectedly")
        if not data:
            self.failed += 1
            return None
        self.compiled += 1
        return data

    def compile(self, in_image_path: str, source: bytes) -> bytes | None:
        return self.result(self.submit(in_image_path, source))


def _read_answers(proc: subprocess.Popen[bytes], answers: queue.Queue[bytes | None]) -> None:
    out = proc.stdout
    assert out is not None
    while True:
        head = out.read(4)
        if len(head) != 4:
            answers.put(None)  # ended: a waiting ``result`` raises
            return
        (n,) = struct.unpack(">I", head)
        data = out.read(n) if n else b""
        if len(data) != n:
            answers.put(None)
            return
        answers.put(data)
