"""Reading a .deb without dpkg: an ar archive holding debian-binary, control.tar.* and data.tar.*.

Python reads the gz, xz and bz2 members itself (Debian's default is xz); zstd members, which
Python 3.11 cannot decompress, go through `dpkg-deb` when it is installed. Members are
decompressed whole into memory: the largest data.tar of a GPU base set is about 100 MB.
"""

from __future__ import annotations

import bz2
import io
import lzma
import subprocess
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from envspec.errors import BuildError

AR_MAGIC = b"!<arch>\n"
_DECOMPRESS = {
    "": bytes,
    ".gz": lambda b: zlib.decompress(b, wbits=47),  # gzip or zlib header
    ".xz": lzma.decompress,
    ".bz2": bz2.decompress,
}


@dataclass(frozen=True)
class ArMember:
    name: str
    offset: int
    size: int


class DebFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.members = self._read_index()
        self._control_cache: dict[str, bytes] | None = None

    def _read_index(self) -> dict[str, ArMember]:
        members: dict[str, ArMember] = {}
        with open(self.path, "rb") as fh:
            if fh.read(8) != AR_MAGIC:
                raise BuildError(
                    f"{self.path} is not a Debian package (no ar header)", step="unpack"
                )
            while True:
                head = fh.read(60)
                if not head:
                    break
                if len(head) != 60 or head[58:60] != b"`\n":
                    raise BuildError(f"{self.path}: corrupt ar member header", step="unpack")
                name = head[0:16].decode("ascii", "replace").strip().rstrip("/")
                size = int(head[48:58].decode("ascii").strip())
                members[name] = ArMember(name, fh.tell(), size)
                fh.seek(size + (size & 1), io.SEEK_CUR)
        return members

    def _member(self, prefix: str) -> ArMember:
        for name, m in self.members.items():
            if name.startswith(prefix):
                return m
        raise BuildError(f"{self.path} has no {prefix}* member", step="unpack")

    def _tar_bytes(self, prefix: str, dpkg_flag: str) -> bytes:
        """The uncompressed tar of a member. lzma, zlib and bz2 drop the GIL while they work, so
        several packages decompress in parallel on threads."""
        m = self._member(prefix)
        suffix = m.name[len(prefix) :]
        if suffix in _DECOMPRESS:
            with open(self.path, "rb") as fh:
                fh.seek(m.offset)
                raw = fh.read(m.size)
            try:
                return _DECOMPRESS[suffix](raw)
            except (lzma.LZMAError, zlib.error, OSError, EOFError) as e:
                raise BuildError(
                    f"{self.path}: cannot decompress {m.name}: {e}", step="unpack"
                ) from None
        # zstd (Ubuntu's default) and anything else: let dpkg-deb decompress.
        argv = ["dpkg-deb", dpkg_flag, str(self.path)]
        try:
            proc = subprocess.run(argv, capture_output=True, check=False)
        except FileNotFoundError:
            raise BuildError(
                f"{self.path}: {m.name} needs dpkg-deb, which is not installed",
                step="unpack",
                argv=argv,
            ) from None
        if proc.returncode != 0:
            raise BuildError(
                f"cannot read {self.path}",
                step="unpack",
                argv=argv,
                returncode=proc.returncode,
                stderr_tail=proc.stderr.decode("utf-8", "replace"),
            )
        return proc.stdout

    def data_tar_bytes(self) -> bytes:
        return self._tar_bytes("data.tar", "--fsys-tarfile")

    @staticmethod
    def open_tar(data: bytes) -> tarfile.TarFile:
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:")

    def control_files(self) -> dict[str, bytes]:
        """The files of control.tar.* by name ("control", "md5sums", "conffiles", ...)."""
        if self._control_cache is None:
            out: dict[str, bytes] = {}
            with self.open_tar(self._tar_bytes("control.tar", "--ctrl-tarfile")) as tf:
                for ti in tf:
                    if ti.isfile():
                        name = ti.name.lstrip("./")
                        f = tf.extractfile(ti)
                        assert f is not None  # a regular file has its bytes
                        out[name] = f.read()
            self._control_cache = out
        return self._control_cache

    def control(self) -> list[tuple[str, str]]:
        """The control stanza as ordered (field, value) pairs; continuation lines kept in value."""
        return parse_stanza(self.control_files()["control"].decode("utf-8", "replace"))


def parse_stanza(text: str) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        if line[0] in " \t" and fields:
            k, v = fields[-1]
            fields[-1] = (k, v + "\n" + line)
            continue
        k, _, v = line.partition(":")
        fields.append((k.strip(), v.strip()))
    return fields
