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


def test_lock_and_explain_packages_end_with_the_same_torch(tmp_path, monkeypatch):
    """``resolve.closure``: the closure, then the torch an sdist in it compiles against, resolved
    again; `explain --packages` ends with it as `lock` does (it named torch 2.15.0 where the lock
    took 2.13.0 for flash-attn 2.8.3.post2, 2026-12-07)."""
    from envspec.cli import lock as cli_lock
    from envspec.resolve import stage

    first = _choice(tmp_path, "*")
    seen: list[str] = []

    def resolve_python(choice, sources, *, workdir, keep=None, upgrade=None):
        seen.append(choice.torch.release.version)
        return [_flash_attn("2.8.3.post2")]

    monkeypatch.setattr(stage, "resolve_python", resolve_python)
    moved, wheels = stage.closure(first, None, load_db(), workdir=tmp_path)
    assert moved.torch.release.version == "2.13.0" and [w.name for w in wheels] == ["flash-attn"]
    assert seen == [first.torch.release.version, "2.13.0"]  # resolved again on the torch moved to
    assert stage.closure(first, None, None, workdir=tmp_path)[0] is first  # no DB: no move

    monkeypatch.setattr("envspec.resolve.with_packages", lambda c, db, s, workdir: c)
    monkeypatch.setattr("envspec.resolve.source_only", lambda c, s, w: {"flash-attn"})
    monkeypatch.setattr("envspec.sources.discover", lambda settings: None)
    said = cli_lock._with_packages(first, load_db())
    assert said.torch.release.version == "2.13.0" and said.from_source == ("flash-attn",)
    assert {h.torch for h in said.passed_over} >= {"2.14.0", first.torch.release.version}
