"""envspec diff: golden files on two committed locks, and the pieces it is made of.

Regenerate the golden outputs (then review them like code):
    ENVSPEC_REGEN_GOLDEN=1 python -m pytest tests/unit/test_diff.py
"""

from __future__ import annotations

import json
import os
import sys
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
    assert layers == {"base": "changed", "cuda": "changed", "torch": "changed", "deps": "changed",
                      "team": "same", "envspec": "changed"}
    assert d.layers_from == "plan"
    text = "\n".join(diff_lines(d))
    assert "raised" in text and "team     unchanged" in text


def test_identical():
    lock = load(GOLDEN / "old.lock")
    d = diff_locks(lock, lock)
    assert d.identical
    assert diff_lines(d)[-1].startswith("the locks are identical")
    assert all(lay.change == "same" for lay in d.layers)


def test_dicts_work_like_models():
    import tomllib

    a = tomllib.loads((GOLDEN / "old.lock").read_text())
    b = tomllib.loads((GOLDEN / "new.lock").read_text())
    assert diff_locks(a, b).to_json() == diff_files(GOLDEN / "old.lock", GOLDEN / "new.lock").to_json()


def test_fallback_to_groups_without_plan(monkeypatch):
    monkeypatch.setitem(sys.modules, "envspec.plan", None)  # import fails
    d = diff_files(GOLDEN / "old.lock", GOLDEN / "new.lock")
    assert d.layers_from == "groups"
    assert any("not available" in n for n in d.notes)
    layers = {lay.group: lay.change for lay in d.layers}
    assert layers["team"] == "same" and layers["cuda"] == "changed" and layers["base"] == "changed"
    assert "wheel groups, estimated" in "\n".join(diff_lines(d))


def test_fallback_when_the_lock_cannot_be_planned():
    import tomllib

    a = tomllib.loads((GOLDEN / "old.lock").read_text())
    b = tomllib.loads((GOLDEN / "new.lock").read_text())
    b["platform"]["base"] = "none"
    d = diff_locks(a, b)
    assert d.layers_from == "groups" and "no build plan" in d.notes[0]
    assert d.field("platform.base").new == "none"


@pytest.mark.parametrize("a,b,want", [
    ("2.36-9+deb12u13", "2.36-9+deb12u14", -1),
    ("1.0~rc1-1", "1.0-1", -1),
    ("1:0.9-1", "2.0-1", 1),
    ("2025b-0+deb12u1", "2025b-0+deb12u1", 0),
    ("1.2.10-1", "1.2.9-1", 1),
    ("1.0", "1.0-1", -1),
    ("1.0a", "1.0+", -1),
])
def test_deb_version_cmp(a, b, want):
    assert deb_version_cmp(a, b) == want
    assert deb_version_cmp(b, a) == -want


def test_json_shape():
    d = diff_files(GOLDEN / "old.lock", GOLDEN / "new.lock")
    j = d.to_json()
    assert j["wheels"]["counts"] == {"added": 4, "removed": 3, "upgraded": 2, "downgraded": 1, "rebuilt": 1}
    assert isinstance(d, LockDiff) and diffmod.diff_lines is diff_lines
    json.dumps(j)
