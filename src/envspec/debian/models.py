"""The Debian side's shared vocabulary: the pin, the suites envspec knows, the base set.

Nothing here touches the network or the disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, field_validator

from envspec.debian.suites import SUITES

CANONICAL_MIRROR = "http://deb.debian.org/debian"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.\-]+$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class DebPin(BaseModel):
    """One .deb of the closure, exactly as the archive's Packages index describes it."""

    # defer_build: the validator is built on first use, not at import (a command that reads a lock
    # but makes no pin does not pay for it)
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    version: str
    architecture: str  # "amd64", "all", ...
    filename: str  # path in the archive, e.g. pool/main/g/glibc/libc6_2.36-9+deb12u14_amd64.deb
    size: int
    sha256: str
    suite: str  # the pocket whose index listed it: bookworm, bookworm-updates, bookworm-security

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"not a Debian package name: {v!r}")
        return v

    @field_validator("filename")
    @classmethod
    def _filename(cls, v: str) -> str:
        parts = v.split("/")
        if not v.startswith("pool/") or not v.endswith(".deb") or ".." in parts or "" in parts:
            raise ValueError(f"not an archive path of a .deb: {v!r}")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, v: str) -> str:
        if not _SHA256_RE.match(v):
            raise ValueError(f"not a lowercase hex sha256: {v!r}")
        return v

    @field_validator("size")
    @classmethod
    def _size(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("size must be positive")
        return v

    @property
    def is_security(self) -> bool:
        return self.suite.endswith("-security")

    def sort_key(self) -> tuple[str, str, str]:
        return (self.name, self.version, self.filename)

    def label(self) -> str:
        return f"{self.name} {self.version} ({self.architecture})"


def sorted_pins(pins: Iterable[DebPin]) -> list[DebPin]:
    return sorted(pins, key=DebPin.sort_key)


def suite_for_python(version: str) -> str | None:
    """The Debian suite whose `python3` is this Python ("3.11" or "3.11.2"), or None."""
    mm = ".".join(str(version).strip().split(".")[:2])
    for suite, facts in SUITES.items():
        if facts["python"] == mm:
            return suite
    return None


# The base set, decided here and documented in docs/debian.md. Every name is a real package of
# both suites; the closure of these is what apt adds. No maintainer scripts run, so the set
# lists what must be *present* at run time, not what dpkg would need to configure it.
_RUNTIME = (
    "base-files",  # /etc/os-release (SBOM scanners read it), /etc/profile, FHS dirs
    "base-passwd",  # /usr/share/base-passwd/{passwd,group}.master: Debian's fixed ids
    "bash",  # the non-root user's shell
    "ca-certificates",  # Mozilla roots -> /etc/ssl/certs/ca-certificates.crt (made by make_rootfs)
    "coreutils",
    "dash",  # /bin/sh
    "libc-bin",  # ldconfig (the NVIDIA container hook and Triton call `ldconfig -p`), getent
    "netbase",  # /etc/services, /etc/protocols: socket.getservbyname, NCCL's socket setup
    "python3",  # the suite's Python (3.11 on bookworm)
    "python3-venv",  # ensurepip for the venv at /opt/venv
    "tini",  # PID 1: reaps zombies of dataloader workers, forwards signals
    "tzdata",  # zoneinfo for Python's zoneinfo and pandas
)
# Triton compiles a small C launcher at run time (torch.compile): it needs a C compiler, the
# C library headers (gcc only Recommends libc6-dev, and recommends are off) and Python.h.
_GPU = ("gcc", "libc6-dev", "libpython3-dev")
_SERVICES = {
    "jupyter": (
        "libstdc++6",
    ),  # Python wheels, but pyzmq's extension links libstdc++ (GPU images get it via gcc)
    "ssh": ("openssh-server",),
}


def base_packages(
    suite: str | None, *, gpu: bool, services: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """The sorted Debian packages envspec always asks for, before the spec's [system] packages.
    ValueError for a suite envspec does not know, or none (no Debian base)."""
    if suite not in SUITES:
        raise ValueError(f"unknown Debian suite {suite!r}; known: {', '.join(sorted(SUITES))}")
    unknown = set(services) - set(_SERVICES)
    if unknown:
        raise ValueError(f"unknown service(s): {', '.join(sorted(unknown))}")
    names = set(_RUNTIME)
    if gpu:
        names.update(_GPU)
    for s in services:
        names.update(_SERVICES[s])
    return sorted(names)


def python_full_version(pins: list[DebPin], suite: str) -> str:
    """The full upstream Python version the closure ships ("3.11.2"), "" when none."""
    mm = SUITES.get(suite, {}).get("python", "")
    for p in pins:
        if p.name == f"python{mm}-minimal" or p.name == f"python{mm}":
            return re.split(r"[-+~]", p.version.split(":")[-1])[0]
    return ""


def glibc_version(pins: list[DebPin]) -> str:
    """The glibc of the closure ("2.36"), from libc6's version; "" when libc6 is absent."""
    for p in pins:
        if p.name == "libc6":
            m = re.match(r"^(?:\d+:)?(\d+\.\d+)", p.version)
            return m.group(1) if m else ""
    return ""
