"""plan.make_plan: layer order, content keys, errors (pure; no I/O besides reading fixtures)."""

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import lock as lockmod  # noqa: E402
from envspec.errors import LockError, PlanError  # noqa: E402
from envspec.plan import LAYER_ORDER, make_plan  # noqa: E402


def keys(plan):
    return {lay.group: lay.key for lay in plan.layers}


def test_layers_in_stability_order_with_their_pins():
    plan = make_plan(helpers.load())
    assert [lay.group for lay in plan.layers] == [
        g for g in LAYER_ORDER if g != "source"
    ]  # no sdist in this lock
    assert [w.name for w in plan.layer("deps").wheels] == ["idna", "iniconfig"]
    assert [w.name for w in plan.layer("team").wheels] == ["six"]
    assert plan.layer("envspec").cacheable is False
    assert plan.tag == "localhost/envspec/build-small:" + plan.lock.meta.content_hash[7:19]


def test_empty_groups_make_no_layer():
    lock = helpers.data()
    lock["wheels"] = [w for w in lock["wheels"] if w["group"] in ("deps", "team")]
    plan = make_plan(helpers.rehash(lock))
    assert [lay.group for lay in plan.layers] == ["base", "deps", "team", "envspec"]


def test_the_plan_carries_the_lock_its_pins_and_its_canonical_text():
    text = (helpers.HERE / "small-debian.lock").read_text()
    model = lockmod.loads(text)
    a = make_plan(model)
    assert a.lock is model and keys(a) == keys(make_plan(helpers.load("small-debian.lock")))
    assert a.lock_text == text  # the model is rendered by the lock stage's canonical writer
    assert len(a.layer("base").debs) == len(model.debian.packages)
    assert set(a.layer("base").debs) == set(
        model.debian.packages
    )  # the lock's own pins, not copies of another type
    assert set(a.wheels) == set(model.wheels)


def test_keys_are_stable_and_depend_on_content_only():
    a = make_plan(helpers.load())
    b = make_plan(copy.deepcopy(helpers.load()))
    assert keys(a) == keys(b)
    renamed = helpers.data()
    renamed["meta"]["name"] = "other"
    renamed["runtime"]["env"] = {"X": "1"}
    c = make_plan(helpers.rehash(renamed))
    # the image's name and runtime env are config, not layer content
    assert {g: k for g, k in keys(c).items() if g != "envspec"} == {
        g: k for g, k in keys(a).items() if g != "envspec"
    }


def test_a_team_change_changes_only_team_and_above():
    a = make_plan(helpers.load())
    b = make_plan(
        helpers.with_wheel(
            helpers.load(),
            "six",
            version="1.16.0",
            filename="six-1.16.0-py2.py3-none-any.whl",
            sha256="8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254",
        )
    )
    changed = [g for g in LAYER_ORDER if g in keys(a) and keys(a)[g] != keys(b)[g]]
    assert changed == ["team", "envspec"]


def test_two_locks_sharing_torch_and_cuda_share_those_keys():
    a = helpers.load()
    other = helpers.data()
    other["meta"]["name"] = "other"
    b = helpers.with_wheel(
        other,
        "idna",
        version="3.7",
        filename="idna-3.7-py3-none-any.whl",
        sha256="82fee1fc78add43492d3a1898bfa6d8a904cc97d8427f683ed8e798d07761aa0",
    )
    ka, kb = keys(make_plan(a)), keys(make_plan(b))
    assert [g for g in LAYER_ORDER if g in ka and ka[g] == kb[g]] == [
        "base",
        "cuda",
        "torch",
        "team",
    ]


def test_venv_and_python_are_part_of_every_wheel_key():
    a = helpers.data()
    b = copy.deepcopy(a)
    b["platform"]["venv"] = "/opt/other"
    ka, kb = keys(make_plan(helpers.rehash(a))), keys(make_plan(helpers.rehash(b)))
    assert all(ka[g] != kb[g] for g in LAYER_ORDER if g in ka)


def test_every_problem_is_reported_at_once():
    lock = helpers.data()
    lock["platform"]["base"] = "none"
    lock["wheels"][0]["sha256"] = ""
    lock["wheels"][1]["group"] = "misc"
    lock["wheels"][2]["filename"] = "x-1.0.tar.gz"
    with pytest.raises(PlanError) as e:
        make_plan(helpers.rehash(lock))
    msg = e.value.message
    assert (
        "host-only" in msg
        and "wheels[0].sha256" in msg
        and "wheels[1].group" in msg
        and "wheels[2].filename" in msg
    )


def test_a_lock_without_platform_is_refused_when_read():
    text = (helpers.HERE / "small.lock").read_text()
    start = text.index("[platform]")
    without = text[:start] + text[text.index("\n[", start + 1) + 1 :]
    with pytest.raises(LockError, match="platform"):
        lockmod.loads(without, "small.lock")


def test_plan_json_is_golden():
    import json
    import os

    got = json.dumps(make_plan(helpers.load()).to_json(), indent=1, sort_keys=True) + "\n"
    golden = helpers.HERE / "small.plan.json"
    if os.environ.get("ENVSPEC_REGEN_GOLDEN"):  # review the diff like code
        golden.write_text(got)
    assert golden.exists(), (
        f"{golden} is missing: make it with ENVSPEC_REGEN_GOLDEN=1 and review it"
    )
    assert got == golden.read_text()


LOCKS = Path(__file__).resolve().parents[2] / "lockfiles"


@pytest.mark.skipif(
    not (LOCKS / "h100-train.lock").exists() or not (LOCKS / "a100-train.lock").exists(),
    reason="the committed h100/a100 locks are not there",
)
def test_committed_locks_of_one_torch_variant_share_every_layer_below_the_team():
    a = make_plan(lockmod.load(LOCKS / "h100-train.lock"))
    b = make_plan(lockmod.load(LOCKS / "a100-train.lock"))
    assert a.lock.torch == b.lock.torch
    below = [lay.group for lay in a.layers if lay.group not in ("team", "envspec")]
    assert below and all(keys(a)[g] == keys(b)[g] for g in below)


GOLDEN_PLANS = Path(__file__).resolve().parents[1] / "data" / "golden" / "plans"


def _lock_of_golden(name: str) -> lockmod.Lockfile:
    """A golden plan's lock: ``<lock>`` or, for a multi-platform lock, ``<lock>.<platform>`` (its view)."""
    stem, _, platform = name.partition(".")
    lock = lockmod.load(LOCKS / f"{stem}.lock")
    return lock.for_platform(platform) if platform else lock


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN_PLANS.glob("*.json")))
def test_committed_locks_keep_their_layer_keys(name):
    """The plan of every committed, buildable lock, as `envspec build --dry-run --json` printed it
    before the lock model was reworked (02c072f, 2026-12-01): image name, layers, content keys, pins. A
    changed key means other layer bytes: bump the maker version in MAKER_VERSIONS on purpose,
    then regenerate with ENVSPEC_REGEN_GOLDEN=1 and review."""
    import json
    import os

    got = json.dumps(make_plan(_lock_of_golden(name)).to_json(), indent=1, sort_keys=True) + "\n"
    golden = GOLDEN_PLANS / f"{name}.json"
    if os.environ.get("ENVSPEC_REGEN_GOLDEN"):
        golden.write_text(got)
    assert got == golden.read_text()


def test_every_buildable_committed_lock_has_a_golden_plan():
    buildable = {
        p.stem + (f".{v.platform_names[0]}" if v is not lk else "")
        for p in LOCKS.glob("*.lock")
        for lk in [lockmod.load(p)]
        for v in lk.views()
        if v.platform.base != "none"
    }
    assert buildable == {p.stem for p in GOLDEN_PLANS.glob("*.json")}


def _with_source(lock: dict, key: str = "1" * 64) -> dict:
    """``lock`` (data) with six locked by its sdist, built from source ([wheels.source])."""
    lock = copy.deepcopy(lock)
    for w in lock["wheels"]:
        if w["name"] == "six":
            w.update(
                filename=f"six-{w['version']}.tar.gz",
                sha256="9" * 64,
                source={
                    "backend": "setuptools.build_meta",
                    "requires": ["setuptools"],
                    "python": "3.11.2",
                    "key": "sha256:" + key,
                    "build": [
                        {
                            "name": "setuptools",
                            "version": "80.9.0",
                            "index": "https://pypi.org/simple",
                            "filename": "setuptools-80.9.0-py3-none-any.whl",
                            "sha256": "8" * 64,
                        }
                    ],
                },
            )
    return lock


def test_wheels_built_from_source_get_a_layer_named_by_their_derivations():
    from envspec.plan import cache_entries

    plain = make_plan(helpers.load())
    built = make_plan(helpers.rehash(_with_source(helpers.data())))
    assert [lay.group for lay in built.layers] == [
        g for g in LAYER_ORDER if g != "team"
    ]  # six was team's one pin
    assert [w.name for w in built.layer("source").wheels] == ["six"]
    assert keys(built)["deps"] == keys(plain)["deps"]  # the other layers are as they were
    other = make_plan(helpers.rehash(_with_source(helpers.data(), key="2" * 64)))
    assert keys(other)["source"] != keys(built)["source"]  # other build inputs: another layer
    entries = cache_entries(built.lock)
    assert (
        ("built", "1" * 64) in entries
        and ("wheel", "8" * 64) in entries
        and ("wheel", "9" * 64) in entries
    )
    lock = helpers.data()
    six = next(w for w in lock["wheels"] if w["name"] == "six")
    six["filename"] = "six-1.0.tar.gz"
    with pytest.raises(PlanError, match="is not a wheel, and the lock gives no build inputs"):
        make_plan(helpers.rehash(lock))
