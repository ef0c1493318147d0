"""envspec diff: golden files on two committed locks, and the pieces it is made of.

Regenerate the golden outputs (then review them like code):
    ENVSPEC_REGEN_GOLDEN=1 python -m pytest tests/unit/test_diff.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envspec import diff as diffmod
from envspec.diff import LockDiff, deb_version_cmp, diff_files, diff_lines, diff_locks
from envspec.lock import load

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "diff"
REGEN = os.environ.get("ENVSPEC_REGEN_GOLDEN") == "1"


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.write_text(text)
    assert path.is_file(), f"{path} is missing; run with ENVSPEC_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file; regenerate if intended"


def test_golden_text_and_json():
    d = diff_files(GOLDEN / "old.lock", GOLDEN / "new.lock")
    _check_golden("expected.txt", "\n".join(diff_lines(d)) + "\n")
    _check_golden("expected.json", json.dumps(d.to_json(), indent=2, sort_keys=True) + "\n")


def test_golden_locks_are_valid_and_hashed():
    for name in ("old.lock", "new.lock"):
        lock = load(GOLDEN / name)
        assert lock.meta.content_hash == lock.compute_hash(), f"{name}: rerun make_locks.py"


def test_reviewer_facts():
    d = diff_files(GOLDEN / "old.lock", GOLDEN / "new.lock")
    assert (d.field("torch.version").old, d.field("torch.version").new) == ("2.13.0", "2.14.1")
    assert d.field("torch.variant").new == "cu130"
    assert d.field("hardware.driver_floor").new == "580.65.06"
    assert d.archs_added == ("compute_120",) and d.archs_removed == ("sm_75",)
    by = {c.name: c for c in d.wheels}
    assert by["torch"].change == "upgraded"
    assert by["numpy"].change == "downgraded"
    assert by["pyyaml"].change == "added"
    assert by["nvidia-cudnn-cu12"].change == "removed"
    assert by["tqdm"].change == "rebuilt"
    assert "safetensors" not in by and "einops" not in by
    debs = {c.name: c for c in d.debs}
    assert debs["libc6"].change == "upgraded" and debs["libyaml-0-2"].change == "added"
    assert "tini" not in debs
    layers = {lay.group: lay.change for lay in d.layers}
    assert layers == {
        "base": "changed",
        "cuda": "changed",
        "torch": "changed",
        "deps": "changed",
        "team": "same",
        "envspec": "changed",
    }
    assert d.layers_from == "plan"
    text = "\n".join(diff_lines(d))
    assert "raised" in text and "team     unchanged" in text


def test_identical():
    lock = load(GOLDEN / "old.lock")
    d = diff_locks(lock, lock)
    assert d.identical
    assert diff_lines(d)[-1].startswith("the locks are identical")
    assert all(lay.change == "same" for lay in d.layers)


def test_every_compared_path_is_a_field_of_the_lock():
    """The scalar fields are named by lockfile path: each must exist in the model, or the diff
    would silently see "(absent)" on both sides."""
    from envspec.lock import Lockfile, PlatformPart

    for path in diffmod._FIELDS:
        table, _, key = path.partition(".")
        model = (Lockfile.model_fields.get(table) or PlatformPart.model_fields[table]).annotation
        model = next(a for a in getattr(model, "__args__", (model,)) if a is not type(None))
        assert key in model.model_fields, path


def test_layers_estimated_from_the_wheel_groups():
    a, b = load(GOLDEN / "old.lock"), load(GOLDEN / "new.lock")
    d = diff_locks(a, b)
    layers = {lay.group: lay.change for lay in diffmod._layers_from_groups(a, b, d.wheels, d.debs)}
    assert layers["team"] == "same" and layers["cuda"] == "changed" and layers["base"] == "changed"


def test_fallback_when_the_lock_cannot_be_planned():
    from envspec.lock import Lockfile, text_data

    a = load(GOLDEN / "old.lock")
    data = text_data(load(GOLDEN / "new.lock"))
    data["platform"]["base"] = "none"
    d = diff_locks(a, Lockfile.model_validate(data).with_hash())
    assert d.layers_from == "groups" and "no build plan" in d.notes[0]
    assert d.field("platform.base").new == "none"
    assert "wheel groups, estimated" in "\n".join(diff_lines(d))


@pytest.mark.parametrize(
    "a,b,want",
    [
        ("2.36-9+deb12u13", "2.36-9+deb12u14", -1),
        ("1.0~rc1-1", "1.0-1", -1),
        ("1:0.9-1", "2.0-1", 1),
        ("2025b-0+deb12u1", "2025b-0+deb12u1", 0),
        ("1.2.10-1", "1.2.9-1", 1),
        ("1.0", "1.0-1", -1),
        ("1.0a", "1.0+", -1),
    ],
)
def test_deb_version_cmp(a, b, want):
    assert deb_version_cmp(a, b) == want
    assert deb_version_cmp(b, a) == -want


def test_json_shape():
    d = diff_files(GOLDEN / "old.lock", GOLDEN / "new.lock")
    j = d.to_json()
    assert j["wheels"]["counts"] == {
        "added": 4,
        "removed": 3,
        "upgraded": 2,
        "downgraded": 1,
        "rebuilt": 1,
    }
    assert isinstance(d, LockDiff) and diffmod.diff_lines is diff_lines
    json.dumps(j)


# ---- multi-platform locks: a block per platform ------------------------------------------------


def _multi_with_arm_idna(version: str):
    from envspec import lock as lockmod

    m = load(Path(__file__).parents[2] / "lockfiles" / "smoke-multi.lock")
    arm = m.parts[1]
    wheels = [
        w.model_copy(
            update={
                "version": version,
                "sha256": "d" * 64,
                "filename": f"idna-{version}-py3-none-any.whl",
            }
        )
        if w.name == "idna"
        else w
        for w in arm.wheels
    ]
    return m, lockmod.Lockfile.model_validate(
        m.model_copy(
            update={"parts": [m.parts[0], arm.model_copy(update={"wheels": wheels})]}
        ).model_dump()
    ).with_hash()


def test_a_wheel_changed_only_on_aarch64_shows_under_that_platform(tmp_path, capsys):
    import json

    from envspec import lock as lockmod
    from envspec.cli import main

    old, new = _multi_with_arm_idna("3.6")
    d = diff_locks(old, new)
    assert (
        d.per_platform
        and not d.identical
        and [n for n, _ in d.platforms] == ["linux-x86_64", "linux-aarch64"]
    )
    subs = dict(d.platforms)
    assert subs["linux-x86_64"].identical and subs["linux-aarch64"].wheels[0].name == "idna"
    lines = diff_lines(d)
    arm_at = lines.index("== linux-aarch64 ==")
    assert lines.index("== linux-x86_64 ==") < arm_at
    assert "    v idna 3.7 -> 3.6  [team]" in lines[arm_at:]
    assert not any("idna" in line for line in lines[:arm_at])
    a, b = tmp_path / "a.lock", tmp_path / "b.lock"
    a.write_text(lockmod.dumps(old))
    b.write_text(lockmod.dumps(new))
    assert main(["diff", str(a), str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["platforms"]["linux-x86_64"]["identical"] is True
    assert out["platforms"]["linux-aarch64"]["wheels"]["changes"][0]["name"] == "idna"
    team = {
        lay["group"]: lay["change"] for lay in out["platforms"]["linux-aarch64"]["layers"]["layers"]
    }
    assert team["team"] == "changed" and team["base"] == "same"


def test_a_platform_added_to_a_lock_is_named():
    old = load(Path(__file__).parents[2] / "lockfiles" / "smoke.lock")
    new = load(Path(__file__).parents[2] / "lockfiles" / "smoke-multi.lock")
    d = diff_locks(old, new)
    assert d.platforms_added == ("linux-aarch64",) and [n for n, _ in d.platforms] == [
        "linux-x86_64"
    ]
    assert "platform added: linux-aarch64 (a new image in the index)" in diff_lines(d)
    again = diff_locks(new, new)
    assert (
        again.identical
        and diff_lines(again)[-1] == "the locks are identical: same images, nothing to rebuild"
    )


def test_a_package_built_from_its_sdist_is_shown_so():
    """[wheels.source]: a wheel that becomes an sdist built from source, and an sdist whose build
    inputs change (same sdist, other key), are named; an added one says it is built from source."""
    from envspec.lock import BuildInput, Lockfile, SourceBuild, Wheel

    old = load(GOLDEN / "old.lock")
    tqdm = next(w for w in old.wheels if w.name == "tqdm")
    src = SourceBuild(
        backend="setuptools.build_meta",
        requires=["setuptools"],
        python="3.11.2",
        key="sha256:" + "1" * 64,
        build=[
            BuildInput(
                name="setuptools",
                version="80.9.0",
                filename="setuptools-80.9.0-py3-none-any.whl",
                index="https://pypi.org/simple",
                sha256="2" * 64,
            )
        ],
    )
    sdist = tqdm.model_copy(
        update={"filename": f"tqdm-{tqdm.version}.tar.gz", "sha256": "3" * 64, "source": src}
    )
    extra = Wheel(
        name="deepspeed",
        version="0.19.8",
        filename="deepspeed-0.19.8.tar.gz",
        index="https://pypi.org/simple",
        sha256="4" * 64,
        group="team",
        source=src,
    )

    def with_wheels(wheels):
        part = old.parts[0].model_copy(update={"wheels": wheels})
        return Lockfile.model_validate(
            old.model_copy(update={"parts": [part]}).model_dump()
        ).with_hash()

    a = old
    b = with_wheels([sdist if w.name == "tqdm" else w for w in old.wheels] + [extra])
    by = {c.name: c for c in diff_locks(a, b).wheels}
    assert (by["tqdm"].change, by["tqdm"].source) == ("rebuilt", "now built from its sdist")
    assert (by["deepspeed"].change, by["deepspeed"].source) == ("added", "built from source")
    text = "\n".join(diff_lines(diff_locks(a, b)))
    assert (
        f"~ tqdm {tqdm.version} (now built from its sdist)" in text
        and "+ deepspeed 0.19.8 (built from source)" in text
    )
    c = with_wheels(
        [
            sdist.model_copy(
                update={"source": src.model_copy(update={"key": "sha256:" + "5" * 64})}
            )
            if w.name == "tqdm"
            else w
            for w in old.wheels
        ]
        + [extra]
    )
    by = {ch.name: ch for ch in diff_locks(b, c).wheels}
    assert (by["tqdm"].change, by["tqdm"].source) == (
        "rebuilt",
        "same sdist, other build inputs",
    ) and "deepspeed" not in by
    assert {ch.name: ch.source for ch in diff_locks(b, a).wheels}[
        "tqdm"
    ] == "now a wheel, was built from its sdist"


def test_an_x86_64_lock_against_an_aarch64_one_says_the_platform_first():
    """issue 43, 13: `platform.arch` came under "Other fields" after 190 lines of package pairs;
    what changes the platform comes first, and a Debian package at the same version for the other
    architecture is one line for all of them."""
    root = Path(__file__).resolve().parents[2] / "lockfiles"
    lines = diff_lines(diff_files(root / "cpu.lock", root / "cpu-arm64.lock"))
    assert lines[2:5] == [
        "GPU stack and platform:",
        "  CPU architecture:     x86_64 -> aarch64",
        "  wheel platform:       manylinux_2_36_x86_64 -> manylinux_2_36_aarch64",
    ]
    swaps = [x for x in lines if x.startswith("  = ")]
    assert (
        len(swaps) == 1
        and "packages at the same versions, built for arm64 instead of amd64" in swaps[0]
    )
    assert not any(x.startswith("  - bash ") or x.startswith("  + bash ") for x in lines)
    assert "  + binutils-aarch64-linux-gnu 2.40-2  [arm64]" in lines  # one architecture only: shown
    assert len(lines) < 40 and not any("platform.arch" in x for x in lines)
