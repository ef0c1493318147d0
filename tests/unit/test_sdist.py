"""The derivation of a source build (src/envspec/wheels/sdist.py), offline: what names the output,
and what an sdist's build system is."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from pathlib import Path

import pytest

from envspec.errors import SourceBuildError
from envspec.wheels import sdist as sd

BASE = sd.Derivation(sd.Pin("pkg", "1.0", "pkg-1.0.tar.gz", "a" * 64),
                     (sd.Pin("setuptools", "80.9.0", "setuptools-80.9.0-py3-none-any.whl", "b" * 64),
                      sd.Pin("wheel", "0.45.1", "wheel-0.45.1-py3-none-any.whl", "c" * 64)),
                     "3.11", "manylinux_2_36_x86_64", compiler="gcc 12.2.0")


def _tar(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_every_input_names_the_output_and_nothing_else_does():
    key = BASE.key
    assert key.startswith("sha256:") and len(key) == 71
    reordered = dataclasses.replace(BASE, build_requires=tuple(reversed(BASE.build_requires)))
    assert reordered.key == key  # the order requirements are listed in is not an input
    for change in ({"sdist": dataclasses.replace(BASE.sdist, sha256="d" * 64)},
                   {"build_requires": BASE.build_requires[:1]},
                   {"python": "3.12"}, {"platform": "manylinux_2_36_aarch64"}, {"compiler": "gcc 14.2.0"},
                   {"epoch": 1}, {"extra": (("torch", "e" * 64),)}):
        assert dataclasses.replace(BASE, **change).key != key, change


def test_the_build_system_comes_from_pyproject_or_is_setuptools_legacy(tmp_path):
    modern = _tar(tmp_path / "a-1.tar.gz", {"a-1/pyproject.toml": '[build-system]\nrequires = ["hatchling>=1.2"]\n'
                                                                  'build-backend = "hatchling.build"\n',
                                            "a-1/PKG-INFO": ""})
    assert sd.build_system(modern) == (["hatchling>=1.2"], "hatchling.build")
    legacy = _tar(tmp_path / "b-1.tar.gz", {"b-1/setup.py": "", "b-1/PKG-INFO": ""})
    assert sd.build_system(legacy) == (["setuptools>=40.8.0"], "setuptools.build_meta:__legacy__")
    no_table = _tar(tmp_path / "c-1.tar.gz", {"c-1/pyproject.toml": "[tool.black]\n", "c-1/setup.py": ""})
    assert sd.build_system(no_table)[1] == "setuptools.build_meta:__legacy__"
    two = _tar(tmp_path / "d-1.tar.gz", {"d-1/setup.py": "", "e-1/setup.py": ""})
    with pytest.raises(SourceBuildError, match="one top folder"):
        sd.build_system(two)
