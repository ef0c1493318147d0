"""Small, real-format .deb files for the unit tests of envspec.debian (no network, no dpkg).

    make_deb(dir, "hello", "1.0-1", files=[Entry("./bin/hello", b"...", mode=0o755)])

returns the path of an ar archive with debian-binary, control.tar.xz and data.tar.<comp>,
laid out as dpkg-deb builds them (./-prefixed names, directories before their contents).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Entry:
    name: str  # "./usr/bin/x", "./etc/" (trailing slash: directory)
    data: bytes = b""
    mode: int = 0o644
    link: str = ""  # symlink target
    hardlink: str = ""  # hardlink target (a member name)
    uid: int = 0
    gid: int = 0


@dataclass
class Pkg:
    name: str
    version: str
    arch: str = "amd64"
    files: list[Entry] = field(default_factory=list)
    conffiles: list[str] = field(default_factory=list)
    extra_control: dict[str, str] = field(default_factory=dict)


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]], comp: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:" + comp, format=tarfile.GNU_FORMAT) as tf:
        for ti, data in entries:
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _ti(
    name: str, *, kind: bytes, mode: int, size: int = 0, link: str = "", uid: int = 0, gid: int = 0
):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.linkname = kind, mode, size, link
    ti.uid, ti.gid, ti.uname, ti.gname, ti.mtime = uid, gid, "root", "root", 1700000000
    return ti


def _data_entries(files: list[Entry]) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_ti("./", kind=tarfile.DIRTYPE, mode=0o755), None)
    ]
    seen = {"./"}
    for e in files:
        parts = e.name.rstrip("/").split("/")
        for i in range(2, len(parts)):
            d = "/".join(parts[:i]) + "/"
            if d not in seen:
                seen.add(d)
                out.append((_ti(d, kind=tarfile.DIRTYPE, mode=0o755), None))
        if e.name.endswith("/"):
            if e.name not in seen:
                seen.add(e.name)
                out.append(
                    (_ti(e.name, kind=tarfile.DIRTYPE, mode=e.mode, uid=e.uid, gid=e.gid), None)
                )
        elif e.link:
            out.append((_ti(e.name, kind=tarfile.SYMTYPE, mode=0o777, link=e.link), None))
        elif e.hardlink:
            out.append((_ti(e.name, kind=tarfile.LNKTYPE, mode=e.mode, link=e.hardlink), None))
        else:
            out.append(
                (
                    _ti(
                        e.name,
                        kind=tarfile.REGTYPE,
                        mode=e.mode,
                        size=len(e.data),
                        uid=e.uid,
                        gid=e.gid,
                    ),
                    e.data,
                )
            )
    return out


def control_text(p: Pkg) -> str:
    fields = {
        "Package": p.name,
        "Version": p.version,
        "Architecture": p.arch,
        "Maintainer": "envspec tests <tests@invalid>",
        "Installed-Size": "1",
        **p.extra_control,
        "Description": f"{p.name} for tests\n envspec's unit tests build this package.",
    }
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def make_deb(directory: Path, pkg: Pkg, *, comp: str = "xz") -> Path:
    md5 = "".join(
        f"{hashlib.md5(e.data).hexdigest()}  {e.name[2:]}\n"
        for e in pkg.files
        if not e.name.endswith("/")
        and not e.link
        and not e.hardlink
        and e.name[1:] not in pkg.conffiles
    )
    ctrl_files = {"./control": control_text(pkg).encode(), "./md5sums": md5.encode()}
    if pkg.conffiles:
        ctrl_files["./conffiles"] = "".join(c + "\n" for c in pkg.conffiles).encode()
    ctrl = [(_ti("./", kind=tarfile.DIRTYPE, mode=0o755), None)] + [
        (_ti(n, kind=tarfile.REGTYPE, mode=0o644, size=len(d)), d) for n, d in ctrl_files.items()
    ]
    members = [
        ("debian-binary", b"2.0\n"),
        ("control.tar.xz", _tar(ctrl, "xz")),
        (f"data.tar.{comp}" if comp else "data.tar", _tar(_data_entries(pkg.files), comp)),
    ]
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        head = f"{name:<16}{1700000000:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        assert len(head) == 60
        out += head + data + (b"\n" if len(data) % 2 else b"")
    path = Path(directory) / f"{pkg.name}_{pkg.version}_{pkg.arch}.deb"
    path.write_bytes(bytes(out))
    return path
