"""envspec.debian.certs: OpenSSL's subject hash without openssl."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envspec.debian.certs import _canon_string, subject_hash

CERTS = Path(__file__).resolve().parents[1] / "data" / "debian" / "certs"
# `openssl x509 -noout -subject_hash -in FILE` (OpenSSL 3.0.x)
EXPECTED = {
    "ISRG_Root_X1.crt": "4042bcee",
    "DigiCert_Global_Root_G2.crt": "607986c7",
    "Certigna.crt": "e113c810",
}


@pytest.mark.parametrize("name,expected", sorted(EXPECTED.items()))
def test_recorded_roots(name, expected):
    assert subject_hash((CERTS / name).read_bytes()) == expected


def test_canonical_string():
    assert _canon_string(b"  Hello \t  World\n ") == b"hello world"
    assert (
        _canon_string("\u00c9COLE  Ab".encode()) == "\u00c9cole ab".encode()
    )  # non-ASCII bytes kept


def test_not_a_certificate():
    with pytest.raises(ValueError):
        subject_hash(b"nothing here")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
@pytest.mark.parametrize(
    "subject",
    [
        "/CN=  Mixed   CASE name /O=Example Corp/C=DE",
        "/CN=\u00c9cole   Sup\u00e9rieure/OU=  Lab  /O=\u00c9cole",
        "/DC=org/DC=Example/CN=multi",
    ],
)
def test_matches_openssl_on_generated_certificates(tmp_path, subject):
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(crt),
            "-days",
            "1",
            "-utf8",
            "-subj",
            subject,
        ],
        check=True,
        capture_output=True,
    )
    want = subprocess.run(
        ["openssl", "x509", "-noout", "-subject_hash", "-in", str(crt)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert subject_hash(crt.read_bytes()) == want


@pytest.mark.skipif(
    not Path("/usr/share/ca-certificates/mozilla").is_dir() or shutil.which("openssl") is None,
    reason="host has no ca-certificates or openssl",
)
def test_matches_openssl_on_the_hosts_roots():
    certs = sorted(Path("/usr/share/ca-certificates/mozilla").glob("*.crt"))
    for c in certs:
        want = subprocess.run(
            ["openssl", "x509", "-noout", "-subject_hash", "-in", str(c)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert subject_hash(c.read_bytes()) == want, c.name
