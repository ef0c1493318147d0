"""OpenSSL's subject-name hash of a certificate, in pure Python.

`openssl rehash` (run by update-ca-certificates) names a link to each trusted certificate
``<hash>.<n>`` so that OpenSSL's directory lookup (CApath, /etc/ssl/certs) finds it. The hash is
the first four bytes, little-endian, of the SHA-1 of the subject's *canonical* encoding: every
RDN's SET re-encoded after each string value is converted to UTF-8, stripped of leading and
trailing ASCII whitespace, its inner whitespace runs folded to one space, its ASCII letters
lowered, and typed UTF8String (OpenSSL crypto/x509/x_name.c, x509_name_canon and
asn1_string_canon). Doing it here keeps the links independent of the host's openssl.
"""

from __future__ import annotations

import base64
import hashlib
import re

_PEM_RE = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)
# ASN.1 universal tags of the string types OpenSSL canonicalises (ASN1_MASK_CANON), with the
# codec that turns their content into text.
_CANON = {
    0x0C: "utf-8",
    0x13: "latin-1",
    0x14: "latin-1",
    0x16: "latin-1",
    0x1A: "latin-1",
    0x1E: "utf-16-be",
    0x1C: "utf-32-be",
}
_SPACE = b" \t\n\v\f\r"


def _tlv(buf: bytes, pos: int) -> tuple[int, int, int, int]:
    """(tag, start of content, end of content, end of element) of the DER element at pos."""
    if pos + 2 > len(buf):
        raise ValueError("truncated DER")
    tag = buf[pos]
    if tag & 0x1F == 0x1F:
        raise ValueError("high tag numbers are not expected in a certificate name")
    n = buf[pos + 1]
    pos += 2
    if n & 0x80:
        k = n & 0x7F
        if k == 0 or k > 4 or pos + k > len(buf):
            raise ValueError("bad DER length")
        n = int.from_bytes(buf[pos : pos + k], "big")
        pos += k
    if pos + n > len(buf):
        raise ValueError("truncated DER")
    return tag, pos, pos + n, pos + n


def _children(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    out = []
    pos = start
    while pos < end:
        t = _tlv(buf, pos)
        out.append((t[0], pos, t[1], t[2]))
        pos = t[3]
    return out


def _length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _canon_string(raw: bytes) -> bytes:
    raw = raw.strip(_SPACE)
    out = bytearray()
    i = 0
    while i < len(raw):
        b = raw[i]
        if b >= 0x80:
            out.append(b)
            i += 1
        elif b in _SPACE:
            out.append(0x20)
            while i < len(raw) and raw[i] in _SPACE:
                i += 1
        else:
            out.append(b + 32 if 0x41 <= b <= 0x5A else b)
            i += 1
    return bytes(out)


def canonical_name(der: bytes, start: int, end: int) -> bytes:
    """The canonical encoding of the Name whose content spans der[start:end]."""
    out = bytearray()
    for tag, _, cs, ce in _children(der, start, end):
        if tag != 0x31:
            raise ValueError("a Name holds SETs")
        atvs = []
        for atag, astart, acs, ace in _children(der, cs, ce):
            if atag != 0x30:
                raise ValueError("an RDN holds SEQUENCEs")
            parts = _children(der, acs, ace)
            if len(parts) != 2:
                raise ValueError("an attribute is a type and a value")
            (_, ostart, _, oend), (vtag, vstart, vcs, vend) = parts
            oid = der[ostart:oend]
            if vtag in _CANON:
                text = der[vcs:vend].decode(_CANON[vtag], errors="strict")
                value = _canon_string(text.encode("utf-8"))
                venc = bytes([0x0C]) + _length(len(value)) + value
            else:
                venc = der[vstart:vend]
            body = oid + venc
            atvs.append(bytes([0x30]) + _length(len(body)) + body)
        body = b"".join(sorted(atvs))  # DER orders a SET OF by encoding
        out += bytes([0x31]) + _length(len(body)) + body
    return bytes(out)


def subject_hash(pem: bytes) -> str:
    """`openssl x509 -subject_hash` of the first certificate in ``pem``, as 8 hex digits."""
    m = _PEM_RE.search(pem)
    if not m:
        raise ValueError("no PEM certificate")
    der = base64.b64decode(b"".join(m.group(1).split()))
    tag, cs, ce, _ = _tlv(der, 0)
    (ttag, _, tcs, tce), *_ = _children(der, cs, ce)
    fields = _children(der, tcs, tce)
    if fields and fields[0][0] == 0xA0:  # [0] EXPLICIT version
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    stag, _, scs, sce = fields[4]
    if tag != 0x30 or ttag != 0x30 or stag != 0x30:
        raise ValueError("not an X.509 certificate")
    digest = hashlib.sha1(canonical_name(der, scs, sce), usedforsecurity=False).digest()
    return f"{int.from_bytes(digest[:4], 'little'):08x}"
