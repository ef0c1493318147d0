"""envspec.debian.models: the pin, suites, the base set."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from envspec.debian import (
    DebPin,
    base_packages,
    glibc_version,
    python_full_version,
    sorted_pins,
    suite_for_python,
)

SHA = "a" * 64


def pin(name="libc6", version="2.36-9+deb12u14", **kw) -> DebPin:
    return DebPin(
        name=name,
        version=version,
        architecture=kw.pop("architecture", "amd64"),
        filename=kw.pop("filename", f"pool/main/x/{name}/{name}_{version}_amd64.deb"),
        size=kw.pop("size", 10),
        sha256=kw.pop("sha256", SHA),
        suite=kw.pop("suite", "bookworm"),
    )


def test_pin_is_frozen_and_strict():
    p = pin()
    with pytest.raises(ValidationError):
        p.name = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        DebPin(**p.model_dump(), extra=1)


@pytest.mark.parametrize(
    "field,value",
    [
        ("name", "Libc6"),
        ("name", "a"),
        ("filename", "/etc/passwd"),
        ("filename", "pool/../x.deb"),
        ("filename", "pool/main/x.tar"),
        ("sha256", "A" * 64),
        ("sha256", "ab"),
        ("size", 0),
    ],
)
def test_pin_rejects_bad_fields(field, value):
    data = pin().model_dump()
    data[field] = value
    with pytest.raises(ValidationError):
        DebPin(**data)


def test_sorted_by_name_then_version():
    pins = [pin("zlib1g", "1"), pin("bash", "2"), pin("bash", "1")]
    assert [(p.name, p.version) for p in sorted_pins(pins)] == [
        ("bash", "1"),
        ("bash", "2"),
        ("zlib1g", "1"),
    ]


def test_security_flag_and_label():
    assert pin(suite="bookworm-security").is_security
    assert not pin(suite="bookworm-updates").is_security
    assert pin().label() == "libc6 2.36-9+deb12u14 (amd64)"


@pytest.mark.parametrize(
    "version,suite",
    [
        ("3.11", "bookworm"),
        ("3.11.2", "bookworm"),
        ("3.13", "trixie"),
        ("3.12", None),
        ("3.10", None),
    ],
)
def test_suite_for_python(version, suite):
    assert suite_for_python(version) == suite


def test_base_set_minimal():
    base = base_packages("bookworm", gpu=False)
    assert base == sorted(base)
    for name in (
        "base-files",
        "bash",
        "dash",
        "coreutils",
        "libc-bin",
        "ca-certificates",
        "netbase",
        "python3",
        "python3-venv",
        "tini",
        "tzdata",
    ):
        assert name in base
    assert "gcc" not in base and "openssh-server" not in base


def test_base_set_gpu_has_triton_toolchain():
    base = base_packages("bookworm", gpu=True)
    assert {"gcc", "libc6-dev", "libpython3-dev"} <= set(base)


def test_base_set_services():
    assert "openssh-server" in base_packages("trixie", gpu=False, services={"ssh"})
    # pyzmq (Jupyter's kernel transport) links libstdc++; a CPU image has no gcc to bring it
    assert set(base_packages("bookworm", gpu=False, services={"jupyter"})) - set(
        base_packages("bookworm", gpu=False)
    ) == {"libstdc++6"}
    with pytest.raises(ValueError, match="unknown service"):
        base_packages("bookworm", gpu=False, services={"ftp"})
    with pytest.raises(ValueError, match="unknown Debian suite"):
        base_packages("buster", gpu=False)


def test_versions_from_the_closure():
    pins = [pin("libc6", "2.36-9+deb12u14"), pin("python3.11-minimal", "3.11.2-6+deb12u9")]
    assert glibc_version(pins) == "2.36"
    assert python_full_version(pins, "bookworm") == "3.11.2"
    assert python_full_version(pins, "trixie") == ""
    assert glibc_version([]) == ""
