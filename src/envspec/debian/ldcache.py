"""/etc/ld.so.cache for a root filesystem of another CPU architecture, written without running
any of its binaries.

For a tree of the builder's own architecture the image's static ldconfig makes the cache
(rootfs.py). An arm64 tree built on amd64 cannot run its ldconfig without emulation, and the
builder's ldconfig rejects foreign ELF files ("is for unknown machine 183"), so this module lays
the cache down itself, in glibc's "new" format (glibc >= 2.32 writes and reads only this one;
layout: glibc elf/dl-cache.h, ``struct cache_file_new`` / ``struct file_entry_new``):

    header  "glibc-ld.so.cache" "1.1", nlibs, len_strings, flags (2: little endian),
            3 padding bytes, extension_offset (0: none), 3 unused words   (48 bytes)
    entries flags, key, value, osversion (0), hwcap (0)                    (24 bytes each)
    strings NUL-terminated; key and value are offsets from the file's start

What goes in follows ldconfig: the directories of /etc/ld.so.conf (its ``include`` globs in
sorted order) and then the system directories (/lib/<triplet>, /usr/lib/<triplet>, /lib,
/usr/lib), each directory once (one seen through a merged-/usr link is the same directory);
in each, every ELF shared object of the tree's architecture whose name starts with ``lib`` or
``ld-`` and holds ``.so``, under its DT_SONAME (a file whose name is not its soname is a
development link or an older copy and is skipped, as ldconfig does when the soname link exists);
entries sorted by glibc's ``_dl_cache_libcmp`` in descending order (ld.so's binary search relies
on it), then by directory order. tests/unit/test_debian_ldcache.py checks the result against the
builder's own ldconfig on an amd64 tree, entry for entry.
"""

from __future__ import annotations

import functools
import glob
import mmap
import os
import posixpath
import stat
import struct
from pathlib import Path

# ELF e_machine -> (the cache entry's flags: FLAG_ELF_LIBC6 | the architecture's flag, triplet).
# glibc elf/dl-cache.h / sysdeps/generic/ldconfig.h: FLAG_ELF_LIBC6 = 0x0003,
# FLAG_X8664_LIB64 = 0x0300, FLAG_AARCH64_LIB64 = 0x0a00.
MACHINES = {62: (0x0303, "x86_64-linux-gnu"), 183: (0x0A03, "aarch64-linux-gnu")}
MACHINE_OF_ARCH = {"amd64": 62, "x86_64": 62, "arm64": 183, "aarch64": 183}
MAGIC = b"glibc-ld.so.cache1.1"
_DT_SONAME, _DT_STRTAB, _PT_DYNAMIC, _ET_DYN = 14, 5, 2, 3


def libcmp(a: str, b: str) -> int:
    """glibc's ``_dl_cache_libcmp``: digit runs compare as numbers, other bytes as bytes."""
    p1, p2 = a.encode(), b.encode()
    i = j = 0
    while i < len(p1):
        c1, c2 = p1[i], p2[j] if j < len(p2) else 0
        if 48 <= c1 <= 57:
            if not 48 <= c2 <= 57:
                return 1
            i0, j0 = i, j
            while i < len(p1) and 48 <= p1[i] <= 57:
                i += 1
            while j < len(p2) and 48 <= p2[j] <= 57:
                j += 1
            v1, v2 = int(p1[i0:i]), int(p2[j0:j])
            if v1 != v2:
                return v1 - v2
        elif 48 <= c2 <= 57:
            return -1
        elif c1 != c2:
            return c1 - c2
        else:
            i += 1
            j += 1
    return -(p2[j] if j < len(p2) else 0)


def elf_soname(data: bytes, machine: int) -> str | None:
    """The DT_SONAME of a 64-bit little-endian ELF shared object for ``machine``; "" when it has
    none; None when it is no such object."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_type != _ET_DYN or e_machine != machine:
        return None
    (e_phoff,) = struct.unpack_from("<Q", data, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz) of PT_LOAD segments
    dyn = None
    for k in range(e_phnum):
        off = e_phoff + k * e_phentsize
        if off + 56 > len(data):
            return None
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, off
        )
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dyn = (p_offset, p_filesz)
    if dyn is None:
        return ""
    strtab = soname = None
    for off in range(dyn[0], min(dyn[0] + dyn[1], len(data) - 15), 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == _DT_STRTAB:
            strtab = val
        elif tag == _DT_SONAME:
            soname = val
    if soname is None or strtab is None:
        return ""
    for vaddr, offset, filesz in loads:  # DT_STRTAB is an address: map it to a file offset
        if vaddr <= strtab < vaddr + filesz:
            start = strtab - vaddr + offset + soname
            end = data.find(b"\0", start)
            return data[start:end].decode("utf-8", "replace") if end > start else ""
    return ""


def _soname_of(path: Path, machine: int) -> str | None:
    with open(path, "rb") as fh:
        if fh.read(4) != b"\x7fELF":
            return None
        fh.seek(0)
        try:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return elf_soname(m, machine)  # type: ignore[arg-type]
        except ValueError:  # an empty file
            return None


class _Root:
    """Paths inside the tree, resolved as the image would (absolute links stay inside it)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def real(self, path: str, depth: int = 0) -> str | None:
        """The in-image path with every link resolved, or None when it does not exist."""
        parts = [p for p in path.split("/") if p and p != "."]
        out = "/"
        for n, part in enumerate(parts):
            if part == "..":
                out = posixpath.dirname(out.rstrip("/")) or "/"
                continue
            cand = posixpath.join(out, part)
            full = self.root / cand.lstrip("/")
            try:
                st = os.lstat(full)
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                if depth > 40:
                    return None
                target = os.readlink(full)
                base = target if target.startswith("/") else posixpath.join(out, target)
                rest = "/".join(parts[n + 1 :])
                return self.real(posixpath.join(base, rest) if rest else base, depth + 1)
            out = cand
        return out

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")


def _conf_dirs(r: _Root, conf: str, seen: set[str]) -> list[str]:
    """The directories an ld.so.conf names, includes expanded (sorted, as glob(3) gives them)."""
    real = r.real(conf)
    if real is None or real in seen:
        return []
    seen.add(real)
    try:
        text = r.host(real).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include ") or line.startswith("include\t"):
            pattern = line.split(None, 1)[1]
            if not pattern.startswith("/"):
                pattern = posixpath.join(posixpath.dirname(conf), pattern)
            hits = glob.glob(str(r.host(pattern)))
            for h in sorted(hits):
                out += _conf_dirs(r, "/" + os.path.relpath(h, r.root), seen)
        elif line.startswith("hwcap "):
            continue  # ignored by glibc >= 2.37, no directory of its own
        else:
            out.append(line.split("=", 1)[0].rstrip("/") or "/")
    return out


def cache_entries(root: Path, machine: int) -> list[tuple[int, str, str]]:
    """(flags, soname, in-image path) for every library ldconfig would list, in the cache's order."""
    flags, triplet = MACHINES[machine]
    r = _Root(root)
    dirs = _conf_dirs(r, "/etc/ld.so.conf", set())
    dirs += [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib"]
    seen_dirs: set[str] = set()
    found: list[tuple[str, str, int]] = []  # (soname, path, dir order)
    for order, d in enumerate(dirs):
        real = r.real(d)
        if real is None or real in seen_dirs or not r.host(real).is_dir():
            continue
        seen_dirs.add(real)
        names: dict[str, str] = {}
        for name in sorted(os.listdir(r.host(real))):
            if not (name.startswith("lib") or name.startswith("ld-")) or ".so" not in name:
                continue
            target = r.real(posixpath.join(real, name))
            if target is None or not stat.S_ISREG(os.stat(r.host(target)).st_mode):
                continue
            soname = _soname_of(r.host(target), machine)
            if soname is None:
                continue
            soname = soname or name
            if soname != name and soname in os.listdir(r.host(real)):
                continue  # a development link or an older copy: the soname's own file is listed
            prev = names.get(soname)
            if prev is None or libcmp(name, prev) > 0:
                names[soname] = name
        for soname in names:
            found.append((soname, f"{d.rstrip('/')}/{soname}", order))
    found.sort(key=lambda e: e[2])  # stable: the directory order breaks ties of equal names
    found.sort(key=functools.cmp_to_key(_descending))
    return [(flags, soname, path) for soname, path, _ in found]


def _descending(a: tuple[str, str, int], b: tuple[str, str, int]) -> int:
    return libcmp(b[0], a[0])


def render(entries: list[tuple[int, str, str]]) -> bytes:
    """The cache file's bytes (no extension section)."""
    header_size, entry_size = 48, 24
    strings = bytearray()
    offsets: dict[str, int] = {}
    base = header_size + entry_size * len(entries)

    def add(s: str) -> int:
        if s not in offsets:
            offsets[s] = base + len(strings)
            strings.extend(s.encode() + b"\0")
        return offsets[s]

    body = bytearray()
    for flags, key, value in entries:
        k, v = add(key), add(value)
        body += struct.pack("<iIIIQ", flags, k, v, 0, 0)
    head = (
        MAGIC
        + struct.pack("<II", len(entries), len(strings))
        + bytes([2, 0, 0, 0])
        + struct.pack("<IIII", 0, 0, 0, 0)
    )
    assert len(head) == header_size
    return bytes(head + body + strings)


def parse(data: bytes) -> list[tuple[int, str, str]]:
    """(flags, key, value) of a new-format cache (for tests and `envspec doctor`-style checks)."""
    if not data.startswith(MAGIC):
        raise ValueError("not a glibc-ld.so.cache1.1 file")
    nlibs, _len = struct.unpack_from("<II", data, 20)
    out = []
    for k in range(nlibs):
        flags, key, value, _os, _hw = struct.unpack_from("<iIIIQ", data, 48 + 24 * k)
        out.append(
            (
                flags,
                data[key : data.index(b"\0", key)].decode(),
                data[value : data.index(b"\0", value)].decode(),
            )
        )
    return out


def write_cache(root: Path, architecture: str) -> int:
    """Write ``root``/etc/ld.so.cache for the Debian ``architecture`` ("arm64"); returns the
    number of entries."""
    entries = cache_entries(root, MACHINE_OF_ARCH[architecture])
    out = root / "etc" / "ld.so.cache"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(".ld.so.cache.tmp")
    tmp.write_bytes(render(entries))
    os.replace(tmp, out)
    return len(entries)
