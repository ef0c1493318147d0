"""A file is what the canonical index serves, or it is not in the lock (issue 57, point 1): a mirror
(pip's find-links, extra-index-url, [sources].mirrors, ENVSPEC_MIRRORS) joins a resolution only
where a canonical index cannot be read, and a file it served is credited to a canonical index only
where that index lists it with the same sha256. Each test makes its own folders: what this
machine's pip configuration holds plays no part (``use_pip_config`` off, sources built here)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from envspec.compat import load_db
from envspec.errors import SourceError
from envspec.resolve import choose, resolve_python
from envspec.resolve.uv import _index_args
from envspec.sources import Mirror, ResolvedSources, credit, listed_hashes
from envspec.spec import load_spec
from tests.unit.test_resolve_packages import make_wheel

H100 = """name = "t"
[target]
gpus = ["H100"]
driver = "580.65.06"
[python]
version = "3.11"
[torch]
version = "2.13"
[system]
base = "none"
"""


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A canonical wheelhouse with PyPI's torch 2.13.0 (no local label) and a find-links folder, as
    pip's configuration names one, with torch 2.13.0+cpu: PEP 440's torch==2.13.0 matches both, and
    the +cpu build sorts first."""
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")  # file:// answers, no network address does
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    canon, links = tmp_path / "canon", tmp_path / "links"
    canon.mkdir()
    links.mkdir()
    make_wheel(canon, "torch", "2.13.0", [])
    make_wheel(links, "torch", "2.13.0+cpu", [])
    spec = tmp_path / "t.toml"
    spec.write_text(H100)
    return canon, links, load_spec(spec)


def _torch(wheels):
    return next(w for w in wheels if w.name == "torch")


def test_a_mirror_never_joins_a_resolution_whose_indexes_answer(world, tmp_path):
    canon, links, spec = world
    pip = Mirror(links.as_uri(), "links", "pip")
    sources = ResolvedSources(index=canon.as_uri(), mirrors=(pip,))
    choice = choose(spec, load_db())
    assert choice.torch is not None and choice.torch.variant.local == ""  # PyPI's CUDA build
    args, notes = _index_args(sources, choice)
    assert links.as_uri() not in args and notes == []
    t = _torch(resolve_python(choice, sources, workdir=tmp_path / "w"))
    assert (t.version, t.filename, t.index) == (
        "2.13.0",
        "torch-2.13.0-py3-none-any.whl",
        canon.as_uri(),
    )


def test_a_file_only_a_mirror_has_is_never_credited_to_an_unreachable_index(world, tmp_path):
    canon, links, spec = world
    pip = Mirror(links.as_uri(), "links", "pip")
    sources = ResolvedSources(index="https://pypi.invalid/simple", mirrors=(pip,))
    choice = choose(spec, load_db())
    args, notes = _index_args(sources, choice)
    assert links.as_uri() in args and notes  # the mirror stands in for the index it cannot read
    with pytest.raises(SourceError) as e:
        resolve_python(choice, sources, workdir=tmp_path / "w")
    assert e.value.reference == "unconfirmed-file" and e.value.exit_code == 3
    assert "torch-2.13.0+cpu-py3-none-any.whl came from " in e.value.message
    assert "(pip's configuration)" in e.value.message
    assert "https://pypi.invalid/simple cannot be read here" in e.value.message


def test_the_lock_being_relocked_is_the_record_where_the_index_cannot_be_read(world, tmp_path):
    canon, links, spec = world
    f = links / "torch-2.13.0+cpu-py3-none-any.whl"
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    pypi = "https://pypi.invalid/simple"
    sources = ResolvedSources(
        index=pypi,
        mirrors=(Mirror(links.as_uri(), "links", "spec"),),
        confirmed=((f.name, sha, pypi),),
    )
    assert credit(f.as_uri(), f.name, sha, "torch", [pypi], sources) == pypi
    with pytest.raises(SourceError, match="unconfirmed-file|cannot be read here"):
        credit(f.as_uri(), f.name, "0" * 64, "torch", [pypi], sources)  # another file


def _simple(root: Path, project: str, files: dict[str, str]) -> str:
    """A PEP 503 simple index at ``root`` listing ``files`` (name -> sha256) for ``project``."""
    page = root / project
    page.mkdir(parents=True)
    links = "".join(f'<a href="../../f/{n}#sha256={h}">{n}</a>\n' for n, h in files.items())
    (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    (root / "index.html").write_text(f'<a href="{project}/">{project}</a>\n')
    return root.as_uri()


def test_a_mirror_file_is_credited_where_the_index_lists_it_with_the_same_sha256(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    name, sha = "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl", "a" * 64
    index = _simple(tmp_path / "simple", "numpy", {name: sha})
    assert listed_hashes(index, "NumPy") == {name: sha}
    assert listed_hashes(index, "absent") == {}
    mirror = Mirror((tmp_path / "m").as_uri(), "links", "env")
    sources = ResolvedSources(index=index, mirrors=(mirror,))
    url = f"{mirror.url}/{name}"
    assert credit(url, name, sha, "numpy", [index], sources) == index
    with pytest.raises(SourceError) as e:
        credit(url, name, "b" * 64, "numpy", [index], sources)
    assert e.value.reference == "mirror-file-differs"
    assert f"serves that file with sha256 {sha}" in e.value.message
    assert "(ENVSPEC_MIRRORS)" in e.value.message
    other = "numpy-2.3.0+local-cp311-cp311-manylinux_2_28_x86_64.whl"
    with pytest.raises(SourceError) as e:
        credit(f"{mirror.url}/{other}", other, sha, "numpy", [index], sources)
    assert e.value.reference == "mirror-only-file"
    assert f"and {index} does not serve it" in e.value.message
