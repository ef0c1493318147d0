"""A torch the packages built from their sdists compile against (issue 58, point 3): chosen from
compat/data/torch_builds.toml's [[source]] rows, or the lock refused before any build."""

from __future__ import annotations

from pathlib import Path

import pytest

from envspec.compat import load_db
from envspec.compat.source_builds import refusing, source_build_rows
from envspec.errors import ResolutionImpossible
from envspec.resolve import WheelCandidate, choose
from envspec.resolve.sdists import torch_for_sources
from envspec.spec import load_spec

SPEC = """name = "fa"
[target]
gpus = ["H100"]
driver = "580.65.06"
[python]
version = "3.11"
packages = ["flash-attn"]
[torch]
version = "{torch}"
[system]
base = "none"
"""


def _flash_attn(version: str) -> WheelCandidate:
    return WheelCandidate(
        name="flash-attn",
        version=version,
        filename=f"flash_attn-{version}.tar.gz",
        index="https://pypi.org/simple",
        sha256="0" * 64,
        size=1,
        group="team",
        direct=True,
    )


def _choice(tmp_path: Path, torch: str):
    p = tmp_path / "fa.toml"
    p.write_text(SPEC.replace("{torch}", torch))
    return choose(load_spec(p), load_db())


def test_every_row_has_its_source_and_a_reason():
    rows = source_build_rows()
    assert rows and all(r.source.strip() and r.reason.strip() for r in rows)
    assert refusing(rows, "flash_attn", "2.8.3.post2") is not None
    assert refusing(rows, "flash-attn", "2.9.0") is None


def test_a_torch_the_sdist_does_not_compile_against_is_passed_over(tmp_path):
    first = _choice(tmp_path, "*")
    assert first.torch is not None and first.torch.release.version >= "2.14"
    moved = torch_for_sources(first, load_db(), [_flash_attn("2.8.3.post2")])
    assert moved is not None and moved.torch is not None
    assert moved.torch.release.version == "2.13.0"
    assert {h.torch for h in moved.passed_over} >= {"2.14.0", first.torch.release.version}
    assert all(
        h.package == "flash-attn" and h.requires.startswith("torch<2.14 to build from its sdist")
        for h in moved.passed_over
    )
    # a release the table does not name, or a torch it builds with: nothing moves
    assert torch_for_sources(first, load_db(), [_flash_attn("2.9.0")]) is None
    assert torch_for_sources(moved, load_db(), [_flash_attn("2.8.3.post2")]) is None


def test_no_torch_in_the_range_builds_it_before_any_build(tmp_path):
    first = _choice(tmp_path, "2.15")
    with pytest.raises(ResolutionImpossible) as e:
        torch_for_sources(first, load_db(), [_flash_attn("2.8.3.post2")])
    assert e.value.reference == "source-build-torch"
    assert "std=c++17" in " ".join(c.text for c in e.value.causes)
    assert e.value.hint.startswith('set [torch].version = "<2.14"')
