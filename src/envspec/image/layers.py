"""Layer makers: pins (and their fetched files) -> one deterministic layer tar each.

Wheels are installed by pypa/installer into a destination that writes straight into the layer
tar instead of a staging directory: the wheel is decompressed once (ISA-L), written once and
hashed while written (the floor set by unzip); RECORD hashes come from the wheel's RECORD.
Order inside a layer: wheels by (name, version, filename); inside a wheel, installer's order
with the archive's members sorted by name; every parent directory before its children. A path
that a second wheel of the same layer also ships (namespace ``__init__.py`` files of the
nvidia-* wheels) is kept from the first wheel and noted.

Each ``.py`` under site-packages gets its ``__pycache__/NAME.cpython-3XY.pyc`` (PEP 552,
unchecked-hash, made by the image's exact CPython: ``envspec.image.bytecode``), compiled from
the bytes in memory while the wheel's other members are written and added after them; each ``.pyc`` is listed in its wheel's RECORD with its sha256
and size, as pip lists the files it compiles. The venv belongs to root, so a running container
writes no .pyc of its own. The base layer's Debian Python modules (``rootfs_py_files``) and the
envspec layer's verifier get theirs the same way (``add_pyc``), after the layer's other files.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import types
import typing
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.records import Hash, RecordEntry, parse_record_file
from installer.scripts import Script
from installer.sources import WheelContentElement, WheelFile
from installer.utils import Scheme
from isal import isal_zlib  # ISA-L's inflate: 1.8x zlib's on the CUDA wheels (820 vs 453 MB/s here)

from envspec.cache.store import Identity, identity
from envspec.errors import HashMismatch
from envspec.image.bytecode import Compiler, pyc_path
from envspec.image.compress import Compression
from envspec.image.records import MadeBlob, MadeLayer, Pyc
from envspec.image.tarball import TarResult, TarWriter
from envspec.lock import Platform
from envspec.plan import LOCK_PATH_IN_IMAGE, SBOM_PATH_IN_IMAGE, BuildPlan
from envspec.services import ENVSPEC_LIB, authorized_keys_file

if TYPE_CHECKING:
    from installer.scripts import ScriptSection

INSTALLER_NAME = b"envspec\n"


# --- wheels ------------------------------------------------------------------------------------


def _open_member(zf: zipfile.ZipFile, item: zipfile.ZipInfo) -> IO[bytes]:
    """zipfile's reader of one member (its CRC-32 check, its handling of the stream's end), with
    ISA-L inflating where the member is deflated. zipfile makes its zlib decompressor when the
    member is opened and only calls decompress/unconsumed_tail/eof/flush on it, which isal's
    has too; nothing has been read yet, so the swap is whole. The CRC-32 is ISA-L's too
    (12.8 GB/s against binascii's 3.5 here: 1.3 CPU-s of a 6 GB image)."""
    stream = zf.open(item)
    if item.compress_type == zipfile.ZIP_DEFLATED and hasattr(stream, "_decompressor"):
        stream._decompressor = isal_zlib.decompressobj(-15)
    if hasattr(stream, "_update_crc") and hasattr(stream, "_running_crc"):
        stream._update_crc = types.MethodType(_isal_update_crc, stream)
    return stream


def _isal_update_crc(self: zipfile.ZipExtFile, newdata: bytes) -> None:
    """ZipExtFile._update_crc (CPython 3.11's rule, unchanged since 3.2) with ISA-L's CRC-32."""
    if self._expected_crc is None:  # type: ignore[attr-defined]
        return
    self._running_crc = isal_zlib.crc32(newdata, self._running_crc)  # type: ignore[attr-defined]
    if self._eof and self._running_crc != self._expected_crc:  # type: ignore[attr-defined]
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {self.name!r}")


class _SortedWheelFile(WheelFile):
    """installer's WheelFile, members in name order, each stream carrying its size and the
    hash the wheel's RECORD gives it."""

    def get_contents(self) -> Iterator[WheelContentElement]:
        import stat as _stat

        records = {r[0]: r for r in parse_record_file(self.read_dist_info("RECORD").splitlines())}
        for item in sorted(self._zipfile.infolist(), key=lambda i: i.filename):
            if item.filename.endswith("/"):
                continue
            record = records.pop(item.filename, (item.filename, "", ""))
            mode = item.external_attr >> 16
            is_exec = bool(mode and _stat.S_ISREG(mode) and mode & 0o111)
            with _open_member(self._zipfile, item) as stream:
                stream.envspec_size = item.file_size  # type: ignore[attr-defined]
                stream.envspec_record_hash = record[1]  # type: ignore[attr-defined]
                yield record, typing.cast(BinaryIO, stream), is_exec


def _stream_size(stream: BinaryIO) -> tuple[int, BinaryIO]:
    size = getattr(stream, "envspec_size", None)
    if size is not None:
        return size, stream
    if isinstance(stream, io.BytesIO):
        return len(stream.getbuffer()) - stream.tell(), stream
    data = stream.read()
    return len(data), io.BytesIO(data)


@dataclass
class TarDestination(SchemeDictionaryDestination):
    """A SchemeDictionaryDestination whose file system is the layer tar."""

    writer: TarWriter | None = None
    duplicates: list[str] = field(default_factory=list)
    compiler: Compiler | None = None
    compiled: list[tuple[Scheme, RecordEntry]] = field(default_factory=list)  # (scheme, .pyc entry)
    pending: list[tuple[Scheme, str, int]] = field(
        default_factory=list
    )  # (scheme, .py path, compile ticket)

    def write_to_fs(
        self, scheme: Scheme, path: str, stream: BinaryIO, is_executable: bool
    ) -> RecordEntry:
        assert self.writer is not None
        target = str(self._path_with_destdir(scheme, path))
        if (
            self.compiler is not None
            and scheme in ("purelib", "platlib")
            and path.endswith(".py")
            and not self.writer.has(target)
        ):
            return self._write_py(scheme, path, target, stream, is_executable)
        # A member written as the wheel has it keeps the hash its RECORD gives (as pip does; the
        # wheel's own sha256 is the lock's, and zipfile checks each member's CRC-32): hashing
        # every file again cost 1.7 s of the cuda layer's 12.4 s. A stream installer made
        # (a script with its shebang rewritten) has no such hash and is hashed.
        known = getattr(stream, "envspec_record_hash", "")
        algo, _, value = known.partition("=")
        h = None if (value and algo == self.hash_algorithm) else hashlib.new(self.hash_algorithm)
        size, stream = _stream_size(stream)
        if self.writer.has(target):
            self.duplicates.append(target)
            left = size
            while left:
                chunk = stream.read(min(1 << 20, left))
                if not chunk:
                    break
                if h is not None:
                    h.update(chunk)
                left -= len(chunk)
        else:
            self.writer.add_file(
                target, stream, size, mode=0o755 if is_executable else 0o644, hasher=h
            )
        if h is None:
            return RecordEntry(path, Hash(self.hash_algorithm, value), size)
        import base64

        digest = base64.urlsafe_b64encode(h.digest()).decode("ascii").rstrip("=")
        return RecordEntry(path, Hash(self.hash_algorithm, digest), size)

    def _write_py(
        self, scheme: Scheme, path: str, target: str, stream: BinaryIO, is_executable: bool
    ) -> RecordEntry:
        """A module, sent to the compiler from the bytes just written (its .pyc: ``finalize_installation``)."""
        assert self.writer is not None and self.compiler is not None
        size, stream = _stream_size(stream)
        source = stream.read(size)
        if len(source) != size or stream.read(1):
            raise ValueError(f"{path}: stream length differs from the declared {size} bytes")
        known = getattr(stream, "envspec_record_hash", "")
        algo, _, value = known.partition("=")
        if not (value and algo == self.hash_algorithm):
            value = _b64digest(self.hash_algorithm, source)
        self.writer.add_file(
            target, None, size, data=source, mode=0o755 if is_executable else 0o644
        )
        self.pending.append((scheme, path, self.compiler.submit(target, source)))
        return RecordEntry(path, Hash(self.hash_algorithm, value), size)

    def finalize_installation(
        self, scheme: Scheme, record_file_path: str, records: Iterable[tuple[Scheme, RecordEntry]]
    ) -> None:
        # The wheel's .pyc after the files installer wrote, in their sources' order (compiled
        # meanwhile by the compiler's children), listed after them as pip appends the files it
        # compiles; RECORD itself last, without a hash, as installer writes it.
        assert self.writer is not None
        for py_scheme, path, ticket in self.pending:
            pyc = self.compiler.result(ticket) if self.compiler is not None else None
            if pyc is None:
                continue
            rel = pyc_path(path, self.compiler.cache_tag)  # type: ignore[union-attr]
            if self.writer.has(
                str(self._path_with_destdir(py_scheme, rel))
            ):  # the wheel ships its own
                continue
            self.writer.add_file(
                str(self._path_with_destdir(py_scheme, rel)), None, len(pyc), data=pyc
            )
            self.compiled.append(
                (
                    py_scheme,
                    RecordEntry(
                        rel,
                        Hash(self.hash_algorithm, _b64digest(self.hash_algorithm, pyc)),
                        len(pyc),
                    ),
                )
            )
        self.pending.clear()
        super().finalize_installation(scheme, record_file_path, [*records, *self.compiled])

    def write_script(
        self, name: str, module: str, attr: str, section: ScriptSection
    ) -> RecordEntry:
        script_name, data = Script(name, module, attr, section).generate(
            self.interpreter, self.script_kind
        )
        return self.write_to_fs(Scheme("scripts"), script_name, io.BytesIO(data), True)


def _b64digest(algo: str, data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).decode("ascii").rstrip("=")


def venv_schemes(platform: Platform, distribution: str) -> dict[str, str]:
    v, py = platform.venv, platform.python
    return {
        "purelib": f"{v}/lib/python{py}/site-packages",
        "platlib": f"{v}/lib/python{py}/site-packages",
        "headers": f"{v}/include/site/python{py}/{distribution}",
        "scripts": f"{v}/bin",
        "data": v,
    }


def make_wheel_layer(
    wheel_files: list[tuple[str, str, Identity | None]],
    platform: Platform,
    out: str | Path,
    compression: Compression | None = None,
    compiler: tuple[str, str] | None = None,
    tree: str | Path | None = None,
    pipe: str | Path | None = None,
) -> MadeLayer:
    """Install wheels ``[(filename, path, identity), ...]`` (already in layer order; ``identity``:
    a local mirror's file read where it is, ``WheelFetcher.in_place``, else None) into a layer tar at
    ``out`` (and its compressed blob beside it, with ``compression``); ``compiler`` ``(python,
    cache tag)`` (``bytecode.find_compiler``) adds the .pyc; ``tree``: the files made there too,
    as an untar would (``TarWriter``); ``pipe``: the FIFO the store's stager reads the tar from.
    Runs in a worker process."""
    import contextlib

    with (
        TarWriter(out, compression=compression, tree=tree, pipe=pipe) as w,
        Compiler(*compiler) if compiler else contextlib.nullcontext() as comp,
    ):
        duplicates: list[str] = []
        pyc: list[tuple[Scheme, RecordEntry]] = []
        for filename, path, ident in wheel_files:
            # The cache names files by sha256; installer reads name and version off the filename.
            with open(path, "rb") as fh, zipfile.ZipFile(fh) as zf:
                if (
                    ident is not None
                ):  # hashed where it is when fetched: still that file, unchanged?
                    _unchanged(fh, path, ident)
                zf.filename = filename
                source = _SortedWheelFile(zf)
                dest = TarDestination(
                    scheme_dict=venv_schemes(platform, source.distribution),
                    interpreter=f"{platform.venv}/bin/python",
                    script_kind="posix",
                    writer=w,
                    compiler=comp,
                )
                install(source, dest, {"INSTALLER": INSTALLER_NAME})
                if ident is not None:  # ... and not written to while it was read
                    _unchanged(fh, path, ident)
                duplicates += dest.duplicates
                pyc += dest.compiled
        res = w.close()
    return _result(res, duplicates, Pyc(files=len(pyc), bytes=sum(e.size or 0 for _, e in pyc)))


def _unchanged(fh: IO[bytes], path: str, ident: Identity) -> None:
    """Raise HashMismatch where the open file ``fh`` is no longer the one hashed (``ident``)."""
    if identity(os.fstat(fh.fileno())) != tuple(ident):
        raise HashMismatch(
            f"{path} changed after its sha256 was checked (a local mirror's file, read where it is)",
            step="make layer",
            hint="something wrote to the mirror during the build; build again",
        )


def _result(res: TarResult, duplicates: list[str], pyc: Pyc) -> MadeLayer:
    blob = None
    if res.blob_path is not None:
        blob = MadeBlob(res.blob_digest, res.blob_size, str(res.blob_path))
    return MadeLayer(res.diff_id, res.size, res.entries, tuple(duplicates), blob, pyc)


# --- base --------------------------------------------------------------------------------------

_SKIP_CONTENTS = ("dev", "proc", "sys", "run", "tmp")  # kept as empty directories


def add_venv_skeleton(w: TarWriter, platform: Platform) -> None:
    v, py = platform.venv, platform.python
    w.add_dir(v)
    w.add_dir(f"{v}/bin")
    w.add_dir(f"{v}/include")
    w.add_dir(f"{v}/lib/python{py}/site-packages")
    w.add_symlink(f"{v}/lib64", "lib")
    cfg = (
        "home = /usr/bin\n"
        "include-system-site-packages = false\n"
        f"version = {platform.python_full or py}\n"
        f"executable = /usr/bin/python{py}\n"
    ).encode()
    w.add_file(f"{v}/pyvenv.cfg", None, len(cfg), data=cfg)
    w.add_symlink(f"{v}/bin/python{py}", f"/usr/bin/python{py}")
    w.add_symlink(f"{v}/bin/python3", f"python{py}")
    w.add_symlink(f"{v}/bin/python", f"python{py}")


def make_base_layer(
    plan: BuildPlan,
    rootfs: str | Path | None,
    out: str | Path,
    compression: Compression | None = None,
    compiler: tuple[str, str] | None = None,
    pipe: str | Path | None = None,
) -> MadeLayer:
    """The Debian rootfs (a directory made by envspec.debian.make_rootfs, or None for a lock
    without Debian packages), the venv skeleton, and /workspace owned by the non-root user.
    ``compiler`` ``(python, cache tag)`` adds the .pyc of the rootfs's Python modules
    (``rootfs_py_files``) after the rootfs's files; ``pipe``: as for ``make_wheel_layer``."""
    rt = plan.lock.runtime
    ws = "/" + rt.workdir.strip("/")
    pyc = Pyc()
    with (
        TarWriter(out, compression=compression, pipe=pipe) as w,
        (
            Compiler(*compiler) if compiler and rootfs is not None else contextlib.nullcontext()
        ) as comp,
    ):
        if rootfs is not None:
            root = Path(rootfs)
            # sent to the compiler's children first: they compile while the rootfs is written
            tickets: list[tuple[str, int]] = []
            if comp is not None:
                for img in rootfs_py_files(root, plan.platform.python):
                    tickets.append((img, comp.submit(img, (root / img.lstrip("/")).read_bytes())))
            for name in sorted(p.name for p in root.iterdir()):
                full = root / name
                if name in _SKIP_CONTENTS and full.is_dir() and not full.is_symlink():
                    st = full.lstat()
                    w.add_dir(name, mode=st.st_mode, uid=st.st_uid, gid=st.st_gid)
                    continue
                _add_one(w, full, "/" + name, owners={ws: (rt.uid, rt.uid)})
            if comp is not None:
                pyc = _add_compiled(w, comp, tickets)
        add_venv_skeleton(w, plan.platform)
        if not w.has(ws):
            w.add_dir(ws, mode=0o755, uid=rt.uid, gid=rt.uid)
        res = w.close()
    return _result(res, [], pyc)


# Directories whose modules get no .pyc in the base layer: test suites, never imported at start.
_NO_PYC_DIRS = frozenset({"test", "tests", "idle_test"})


def rootfs_py_files(root: Path, python: str) -> list[str]:
    """The in-image paths (sorted, bytes order) of the rootfs's Python modules that get a .pyc:
    every regular ``.py`` file (not a symlink) under ``usr/lib/python{python}/`` (the image's
    Python's; another version's directory is left alone: its .pyc would need its own compiler)
    and ``usr/lib/python3/dist-packages/``, outside directories named ``test``, ``tests`` and
    ``idle_test`` and outside ``site-packages``/``__pycache__``."""
    import os
    import stat

    lib = root / "usr" / "lib"
    tops = [f"usr/lib/python{python}", "usr/lib/python3/dist-packages"]
    if not lib.is_dir() or lib.is_symlink():
        return []
    out: list[str] = []

    def walk(rel: str) -> None:
        full = root / rel
        for name in sorted(os.listdir(full), key=os.fsencode):
            st = os.lstat(full / name)
            if stat.S_ISDIR(st.st_mode):
                if name not in _NO_PYC_DIRS and name not in ("__pycache__", "site-packages"):
                    walk(f"{rel}/{name}")
            elif stat.S_ISREG(st.st_mode) and name.endswith(".py"):
                out.append(f"/{rel}/{name}")

    for top in tops:
        full = root / top
        if full.is_dir() and not full.is_symlink():
            walk(top)
    return out


def add_pyc(w: TarWriter, sources: list[tuple[str, bytes]], compiler: tuple[str, str]) -> Pyc:
    """Compile ``sources`` ((in-image path, bytes), in the order given) with the image's CPython
    (``bytecode.Compiler``) and add each one's ``__pycache__`` .pyc (0644 root:root) unless the
    tar has it already; a source that does not compile gets none. Returns the count and bytes."""
    with Compiler(*compiler) as comp:
        return _add_compiled(w, comp, [(path, comp.submit(path, data)) for path, data in sources])


def _add_compiled(w: TarWriter, comp: Compiler, tickets: list[tuple[str, int]]) -> Pyc:
    files = size = 0
    for path, ticket in tickets:
        data = comp.result(ticket)
        target = pyc_path(path, comp.cache_tag)
        if data is None or w.has(target):
            continue
        w.add_file(target, None, len(data), data=data, mode=0o644)
        files += 1
        size += len(data)
    return Pyc(files=files, bytes=size)


def _add_one(w: TarWriter, full: Path, img: str, owners: dict[str, tuple[int, int]]) -> None:
    import os
    import stat

    st = os.lstat(full)
    uid, gid = owners.get(img, (st.st_uid, st.st_gid))
    if stat.S_ISDIR(st.st_mode):
        w.add_dir(img, mode=st.st_mode, uid=uid, gid=gid)
        w.add_tree(full, img, owners=owners)
    elif stat.S_ISLNK(st.st_mode):
        w.add_symlink(img, os.readlink(full), uid=uid, gid=gid)
    elif stat.S_ISREG(st.st_mode):
        with open(full, "rb") as fh:
            w.add_file(img, fh, st.st_size, mode=st.st_mode, uid=uid, gid=gid)
    else:
        w.add_special(img, st)


# --- envspec: verifier, lock, SBOM, entrypoint ---------------------------------------------------

LAUNCHER = """#!{venv}/bin/python
# envspec launcher inside the image: the verifier needs only the standard library and torch.
import runpy
import sys

sys.path.insert(0, "{lib}")
if len(sys.argv) > 1 and sys.argv[1] == "verify":
    del sys.argv[1]
sys.argv[0] = "envspec verify"
runpy.run_module("envspec.verify", run_name="__main__", alter_sys=True)
"""

INIT_PY = '''"""envspec, as shipped inside images: the verifier only (envspec.verify)."""\n'''


def verifier_files(verify_dir: Path) -> list[tuple[str, bytes]]:
    """(relative path under envspec/verify, bytes) of the verifier's sources, sorted."""
    out = []
    if verify_dir.is_dir():
        for p in sorted(verify_dir.rglob("*"), key=lambda x: x.as_posix()):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
                out.append((p.relative_to(verify_dir).as_posix(), p.read_bytes()))
    return out


def envspec_layer_inputs(plan: BuildPlan, spec_dir: Path | None, verify_dir: Path | None) -> str:
    """The digest of what the envspec layer is made of besides the lock (``plan.keyed_top``):
    the verifier's sources (``verify_dir``, default envspec's own), the sources of envspec itself
    (its modules and templates: what renders the services, the SBOM and the tar), and the bytes of
    the authorized-keys file the spec names. Equal digests, equal layers; so the layer can be
    cached and taken from a registry cache like the others, by a node of the same envspec."""
    h = hashlib.sha256(_own_sources(Path(__file__).resolve().parent.parent).encode())
    if verify_dir is not None:  # another verifier than envspec's own: read as it is now
        _hash_files(h, "verify", verifier_files(verify_dir))
    keys = authorized_keys_file(plan.lock, spec_dir)
    if keys is not None:
        h.update(b"authorized_keys\n" + (keys.read_bytes() if keys.is_file() else b"(none)"))
    return h.hexdigest()


def _hash_files(h: hashlib._Hash, prefix: str, files: Iterable[tuple[str, bytes]]) -> None:
    for rel, data in files:
        h.update(f"{prefix}/{rel} {len(data)}\n".encode())
        h.update(data)


@functools.cache
def _own_sources(package: Path) -> str:
    """The digest of envspec's own verifier files, modules and templates: read once a process
    (they do not change under it), however many images it builds."""
    h = hashlib.sha256()
    _hash_files(h, "verify", verifier_files(package / "verify"))
    sources = [
        p
        for p in sorted(package.rglob("*"), key=lambda x: x.as_posix())
        if p.suffix in (".py", ".j2") and p.is_file() and "__pycache__" not in p.parts
    ]
    _hash_files(
        h, "envspec", ((p.relative_to(package).as_posix(), p.read_bytes()) for p in sources)
    )
    return h.hexdigest()


def make_envspec_layer(
    plan: BuildPlan,
    sbom: bytes,
    out: str | Path,
    *,
    service_files: dict[str, tuple[str, int]],
    verify_dir: Path | None = None,
    compression: Compression | None = None,
    compiler: tuple[str, str] | None = None,
) -> MadeLayer:
    """The top layer: the lock, the SBOM, the verifier (``verify_dir``, default envspec's own) and
    its launcher, and ``service_files`` ({image path: (text, mode)}: the entrypoint and the
    services' files that ``envspec.services.render_service_files`` renders from the lock).
    ``compiler`` ``(python, cache tag)`` adds the .pyc of the verifier's modules (under
    ``ENVSPEC_LIB``, which belongs to root: Python could never write them at run time)."""
    if verify_dir is None:
        verify_dir = Path(__file__).resolve().parent.parent / "verify"
    v = plan.platform.venv
    files: list[tuple[str, bytes, int]] = [
        (LOCK_PATH_IN_IMAGE, plan.lock_text.encode(), 0o644),
        (SBOM_PATH_IN_IMAGE, sbom, 0o644),
        (f"{ENVSPEC_LIB}/envspec/__init__.py", INIT_PY.encode(), 0o644),
    ]
    files += [(path, text.encode(), mode) for path, (text, mode) in service_files.items()]
    vfiles = verifier_files(verify_dir)
    if not any(rel == "__init__.py" for rel, _ in vfiles):
        files.append((f"{ENVSPEC_LIB}/envspec/verify/__init__.py", b"", 0o644))
    files += [(f"{ENVSPEC_LIB}/envspec/verify/{rel}", data, 0o644) for rel, data in vfiles]
    files.append(
        (
            f"{v}/bin/envspec",
            LAUNCHER.replace("{venv}", v).replace("{lib}", ENVSPEC_LIB).encode(),
            0o755,
        )
    )
    files.sort(key=lambda t: t[0])
    with TarWriter(out, compression=compression) as w:
        for path, data, mode in files:
            w.add_file(path, None, len(data), data=data, mode=mode)
        pyc = Pyc()
        if compiler is not None:
            pyc = add_pyc(
                w,
                [
                    (path, data)
                    for path, data, _ in files
                    if path.startswith(f"{ENVSPEC_LIB}/") and path.endswith(".py")
                ],
                compiler,
            )
        res = w.close()
    return _result(res, [], pyc)


# What making a wheel layer costs, in CPU seconds of a 2-core VM of this project's CI kind: each
# layer of h100-train made alone (docs/build.md, "Which maker goes first"): the cuda layer's 3.4 GB
# in 582 members took 10.3 CPU-s, torch's 2.1 GB in 16,328 members 8.2 CPU-s plus 13.4 CPU-s
# compiling its 5,163 .py files.
COST_PER_BYTE = 3.0e-9  # inflate, hash and write a member's bytes
COST_PER_MEMBER = 1.0e-4  # a file's header, RECORD line and tree entry
COST_PER_PY = 2.6e-3  # compiling a module to .pyc


def estimated_cost(wheels: list[str | Path], *, bytecode: bool) -> float:
    """The CPU seconds a maker will spend on a layer of these wheel files (an estimate, to start
    the longest one first and give it the CPU: ``WheelMakers``), from each wheel's central
    directory: its members' bytes, their number, and with ``bytecode`` its .py files."""
    cost = 0.0
    for path in wheels:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                cost += COST_PER_MEMBER + COST_PER_BYTE * info.file_size
                if bytecode and info.filename.endswith(".py"):
                    cost += COST_PER_PY
    return cost


# a wheel layer's making, as a worker process gets it: (wheel files, the platform's JSON, the tar,
# the compression's name, the .pyc compiler, the tree, the pipe): ``make_wheel_layer``'s arguments
WheelJob = tuple[
    list[tuple[str, str, Identity | None]],
    str,
    str,
    str,
    tuple[str, str] | None,
    str | None,
    str | None,
]


def wheel_layer_job(args: WheelJob) -> MadeLayer:
    """Process-pool entry point (picklable)."""
    wheel_files, platform_json, out, comp, compiler, tree, pipe = args
    return make_wheel_layer(
        wheel_files,
        Platform.model_validate_json(platform_json),
        out,
        Compression(comp) if comp != "none" else None,
        compiler,
        tree,
        pipe,
    )
