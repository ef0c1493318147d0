"""The sides of a conflict over torch (src/envspec/sides.py, issue 57 point 4), against a fake
resolver: each package's releases, as PyPI has vllm's and xformers' pins."""

from __future__ import annotations

from envspec import explain, sides
from envspec.causes import TorchSide

FITTING = ["2.14.0", "2.13.0", "2.11.0", "2.10.0", "2.9.1", "2.9.0"]  # newest first
# what each requirement's releases pin torch to (a release installs beside that torch only)
PINS = {
    "vllm>=0.17": ["2.14.0", "2.13.0", "2.11.0", "2.10.0"],
    "vllm": ["2.14.0", "2.13.0", "2.11.0", "2.10.0", "2.9.1", "2.9.0"],
    "xformers==0.0.33.post2": ["2.9.1"],
    "isaaclab": [],
}
ON_PYTHON = {"isaaclab": {"3.12", "3.10"}}


def fake(asked: list[tuple[str, tuple[str, ...], str]]):
    def ask(requirement, releases, python):
        asked.append((requirement, tuple(releases), python))
        if python:
            return "2.11.0" if python in ON_PYTHON.get(requirement, set()) else None
        return next((t for t in PINS[requirement] if t in releases), None)

    return ask


def test_a_side_is_the_releases_its_package_installs_beside_newest_first():
    asked: list = []
    s = sides.side("xformers==0.0.33.post2", FITTING, fake(asked))
    assert s == TorchSide(requirement="xformers==0.0.33.post2", releases=("2.9.1",))
    assert len(asked) == 2  # 2.9.1, then none without it
    wide = sides.side("vllm", FITTING, fake([]))
    assert wide.releases == ("2.14.0", "2.13.0", "2.11.0", "2.10.0") and wide.more


def test_two_sides_without_a_common_release_are_the_conflict_named_with_both():
    found = sides.find(["vllm>=0.17", "xformers==0.0.33.post2"], FITTING, fake([]))
    assert found.decided and found.common == ()
    said = [explain.cause_sentence(c) for c in found.sides]
    assert said == [
        "vllm>=0.17 installs beside torch 2.14.0, 2.13.0, 2.11.0, 2.10.0 (older releases not asked)",
        "xformers==0.0.33.post2 installs beside torch 2.9.1 only of the releases that fit",
    ]


def test_a_common_release_past_the_shown_ones_is_asked_where_it_decides():
    asked: list = []
    found = sides.find(["vllm", "xformers==0.0.33.post2"], FITTING, fake(asked))
    assert found.common == ("2.9.1",)  # vllm's side was shown to 2.10.0; 2.9.1 asked alone
    assert ("vllm", ("2.9.1",), "") in asked


def test_the_python_that_rules_a_package_out_is_found_nearest_first():
    asked: list = []
    assert sides.find(["isaaclab"], FITTING, fake(asked)).sides[0].releases == ()
    assert asked == []  # one package: the failed question was its side
    got = sides.python_for("isaaclab", FITTING, ["3.12", "3.14", "3.11"], fake(asked))
    assert got == "3.12" and [a[2] for a in asked] == ["3.12"]
    c = TorchSide(requirement="isaaclab", releases=(), python="3.13", pythons=("3.12",))
    assert explain.cause_sentence(c) == (
        "isaaclab installs beside no torch release that fits, with Python 3.13; it does with "
        "Python 3.12"
    )
