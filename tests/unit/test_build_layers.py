"""The wheel layer maker's reading of the wheel: ISA-L inflates and checks each member's CRC-32."""

import struct
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec.image import layers  # noqa: E402

LOCK = helpers.load()
FILES = {"crcpkg/__init__.py": b"VALUE = 1\n", "crcpkg/data.bin": bytes(range(256)) * 4000}


def _wheel(tmp_path: Path) -> Path:
    (tmp_path / "w").mkdir(exist_ok=True)
    path, _ = helpers.make_wheel(tmp_path / "w", "crcpkg", "1.0", files=dict(FILES))
    return path


def _set_central_crc(path: Path, member: str, crc: int) -> None:
    """Write ``crc`` as ``member``'s CRC-32 in the zip's central directory (what zipfile checks)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        pos = zf.start_dir
    while data[pos : pos + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, pos + 28)
        if data[pos + 46 : pos + 46 + name_len].decode() == member:
            struct.pack_into("<I", data, pos + 16, crc)
            path.write_bytes(bytes(data))
            return
        pos += 46 + name_len + extra_len + comment_len
    raise AssertionError(f"{member} not in {path}")


def test_a_wheel_member_is_written_as_inflated(tmp_path):
    path = _wheel(tmp_path)
    layers.make_wheel_layer([(path.name, str(path), None)], LOCK.platform, tmp_path / "l.tar")
    with tarfile.open(tmp_path / "l.tar") as tf:
        got = tf.extractfile("opt/venv/lib/python3.11/site-packages/crcpkg/data.bin").read()
    assert got == FILES["crcpkg/data.bin"]


def test_a_wheel_member_whose_crc_differs_stops_the_layer(tmp_path):
    """The wheel's bytes differ from what its zip directory says (a damaged cache file whose
    sha256 was not checked again): the maker stops at that member."""
    path = _wheel(tmp_path)
    with zipfile.ZipFile(path) as zf:
        crc = zf.getinfo("crcpkg/data.bin").CRC
    _set_central_crc(path, "crcpkg/data.bin", crc ^ 1)
    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32 for file 'crcpkg/data.bin'"):
        layers.make_wheel_layer([(path.name, str(path), None)], LOCK.platform, tmp_path / "l.tar")


def test_the_crc_is_isal_s_on_a_deflated_member(tmp_path, monkeypatch):
    """The members' CRC-32 goes through ISA-L (binascii's sees only the dist-info files installer reads)."""
    path = _wheel(tmp_path)
    calls = []
    real = layers.isal_zlib.crc32

    def counting(data, value=0):
        calls.append(len(data))
        return real(data, value)

    monkeypatch.setattr(layers.isal_zlib, "crc32", counting)
    real_zip, zip_calls = zipfile.crc32, []

    def binascii_counting(
        data, *value
    ):  # installer reads METADATA, WHEEL and RECORD with zipfile's own
        zip_calls.append(len(data))
        return real_zip(data, *value)

    monkeypatch.setattr(zipfile, "crc32", binascii_counting)
    layers.make_wheel_layer([(path.name, str(path), None)], LOCK.platform, tmp_path / "l.tar")
    assert sum(calls) >= len(FILES["crcpkg/data.bin"]) > sum(zip_calls)
