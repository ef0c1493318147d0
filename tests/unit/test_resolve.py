"""Choosing the torch build (offline): the arch rule, driver policy, Python wheels, preference, explain JSON."""

from __future__ import annotations

import json

import pytest

from envspec.causes import Suggestion
from envspec.cli import main
from envspec.compat import load_db
from envspec.errors import ResolutionImpossible, SpecError
from envspec.resolve import choose
from envspec.spec import parse_spec


def spec(body: str):
    return parse_spec('name = "t"\n' + body, "t.toml")


@pytest.fixture(scope="module")
def db():
    return load_db()


def test_h100_gets_pypis_cuda13_build(db):
    c = choose(spec('[target]\ngpus = ["H100"]\n[torch]\nversion = "2.14.*"\n'), db)
    assert (c.torch.release.version, c.torch.variant.name) == ("2.14.1", "cu130")
    assert c.torch.min_driver == db.cuda_toolkit("13.0").driver_compat
    assert "sm_90" in c.torch.variant.arch_list
    names = [x.variant for x in c.torch.candidates]
    assert names == sorted(set(names), key=names.index) and "cu130" in names
    assert [x.variant for x in c.torch.candidates if x.preferred] == ["cu130"]


def test_old_driver_moves_to_an_older_cuda_under_compat(db):
    c = choose(
        spec('[target]\ngpus = ["H100"]\ndriver = "535.230.02"\n[torch]\nversion = "2.14.*"\n'), db
    )
    assert c.torch.variant.cuda.startswith("12.")
    from envspec.explain import candidate_reason

    rejected = {x.variant: candidate_reason(x) for x in c.torch.candidates if not x.ok}
    assert "cu130" in rejected and "535.230.02 <" in rejected["cu130"]


def test_strict_policy_uses_the_toolkit_floor(db):
    body = '[target]\ngpus = ["H100"]\ndriver = "535.230.02"\ndriver_policy = "strict"\n[torch]\nversion = "2.14.*"\n'
    with pytest.raises(ResolutionImpossible) as ei:
        choose(spec(body), db)
    assert ei.value.reference == "driver-too-old"
    assert any(
        isinstance(c, Suggestion) and "driver 535.230.02 runs up to CUDA" in c.text
        for c in ei.value.causes
    )


def test_b200_with_old_torch_says_what_would_fit(db):
    with pytest.raises(ResolutionImpossible) as ei:
        choose(spec('[target]\ngpus = ["B200"]\n[torch]\nversion = "==2.5.*"\n'), db)
    assert ei.value.reference == "no-kernels-for-gpu"
    assert "B200 needs sm_100: torch >= 2.7" in ei.value.hint
    assert all(not c.ok for c in ei.value.candidates)


def test_cuda_version_pins_the_variant(db):
    c = choose(spec('[torch]\nversion = "2.14.*"\ncuda = "12.6"\n'), db)
    assert c.torch.variant.name == "cu126" and c.torch.variant.local == "cu126"
    assert c.torch.variant.index.endswith("/cu126")


def test_python_without_wheels_is_rejected(db):
    with pytest.raises(ResolutionImpossible) as ei:
        choose(spec('[python]\nversion = "3.13"\n[torch]\nversion = "==2.4.*"\n'), db)
    assert ei.value.reference == "python-unsupported"


def test_unknown_gpu_is_a_spec_error_with_did_you_mean(db):
    with pytest.raises(SpecError) as ei:
        choose(spec('[target]\ngpus = ["H100", "H1000"]\n[torch]\nversion = "2.14.*"\n'), db)
    p = ei.value.problems()[0]
    assert p.path == "[target].gpus[1]" and p.line == 3 and "H100" in p.hint


def test_a_gpu_outside_the_arch_list_rejects_that_variant(db):
    # V100 (7.0): CUDA 13 builds dropped pre-Turing SASS and carry no PTX old enough
    c = choose(spec('[target]\ngpus = ["V100"]\n[torch]\nversion = "2.14.*"\n'), db)
    assert c.torch.variant.cuda.startswith("12.")
    assert not next(x for x in c.torch.candidates if x.variant == "cu130").ok


def test_explain_json_shape(capsys):
    code = main(["explain", "specs/h100.toml", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in (
        "ok",
        "torch",
        "variant",
        "cuda",
        "cudnn",
        "nccl",
        "arch_list",
        "min_driver",
        "driver_policy",
        "python",
        "candidates",
    ):
        assert key in out
    assert out["ok"] is True and out["torch"] == "2.14.1" and out["nccl"] == "2.30.7"
    assert {"variant", "ok", "reason"} <= set(out["candidates"][0])


def test_explain_json_when_nothing_fits(capsys):
    code = main(["explain", "tests/data/bad_specs/18-b200-old-torch.toml", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["ok"] is False
    assert set(out["error"]) >= {"reference", "message", "causes"}
    assert any("torch >= 2.7" in c for c in out["error"]["causes"])
    assert out["candidates"]


# ---- [sources].torch_index: the base of the PyTorch-index variants ------------------------------

MIRROR = "https://mirror.example/whl"


def test_torch_index_is_the_base_of_the_chosen_variants_index(db):
    body = '[torch]\nversion = "2.14.*"\ncuda = "12.6"\n'
    default = choose(spec(body), db).torch.variant
    mirrored = choose(spec(body + f'[sources]\ntorch_index = "{MIRROR}/"\n'), db).torch.variant
    assert default.index == default.pytorch_index == "https://download.pytorch.org/whl/cu126"
    assert mirrored.index == mirrored.pytorch_index == f"{MIRROR}/cu126"
    assert mirrored.local == default.local == "cu126"
    # the default changes nothing: the choice carries the DB's own variant
    assert default == db.torch_release("2.14.1").variants["cu126"]


def test_torch_index_leaves_pypis_build_on_pypi(db):
    body = f'[target]\ngpus = ["H100"]\n[torch]\nversion = "2.14.*"\n[sources]\ntorch_index = "{MIRROR}"\n'
    v = choose(spec(body), db).torch.variant
    assert v.pypi and v.index == "https://pypi.org/simple" and v.local == ""
    assert v.pytorch_index == f"{MIRROR}/{v.name}"


def test_torch_index_reaches_the_lock_pin_and_the_wheels_index(db):
    from envspec import lock as lockmod
    from envspec.resolve import Resolution
    from envspec.resolve.candidates import _attribute_index
    from envspec.sources import ResolvedSources

    s = spec(f'[torch]\nversion = "2.14.*"\ncuda = "cpu"\n[sources]\ntorch_index = "{MIRROR}"\n')
    ch = choose(s, db)
    lk = lockmod.from_resolution(
        Resolution(choice=ch, wheels=[], debs=[], deb_requested=[]),
        spec_path="t.toml",
        db_version=db.version,
    )
    assert lk.torch is not None and lk.torch.index == f"{MIRROR}/cpu"
    src = ResolvedSources(torch_index=MIRROR)
    fn = "filelock-3.20.0-py3-none-any.whl"
    h = "0" * 64
    assert (
        _attribute_index(f"{MIRROR}/cpu/{fn}", "filelock", ch, src, fn, h) == f"{MIRROR}/cpu"
    )  # served by the torch index
    t = "torch-2.14.1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert _attribute_index(f"{MIRROR}/cpu/{t}", "torch", ch, src, t, h) == f"{MIRROR}/cpu"
    assert (
        _attribute_index(f"https://files.pythonhosted.org/x/{fn}", "filelock", ch, src, fn, h)
        == "https://pypi.org/simple"
    )


def test_torch_index_is_what_uv_is_given(db, tmp_path, monkeypatch):
    from envspec.resolve.uv import _index_args
    from envspec.sources import ResolvedSources

    monkeypatch.setenv(
        "ENVSPEC_OFFLINE", "1"
    )  # no socket: file:// indexes answer when their folder exists
    base = (tmp_path / "whl").as_uri()
    (tmp_path / "whl" / "cu126").mkdir(parents=True)
    (tmp_path / "whl" / "cu126" / "index.html").write_text("<html></html>\n")  # a simple index
    ch = choose(
        spec(f'[torch]\nversion = "2.14.*"\ncuda = "12.6"\n[sources]\ntorch_index = "{base}"\n'), db
    )
    args, _ = _index_args(ResolvedSources(torch_index=base), ch)
    assert args[:2] == ["--extra-index-url", f"{base}/cu126"]
    assert "https://download.pytorch.org/whl/cu126" not in args


def test_default_torch_index_relocks_every_committed_lock_byte_for_byte(db, monkeypatch):
    """The committed locks, re-made offline from the choice and their own pins, are their own bytes."""
    from pathlib import Path

    from envspec import lock as lockmod
    from envspec.resolve import Resolution, WheelCandidate, choose_all
    from envspec.spec import load_spec

    repo = Path(__file__).parents[2]
    roots = [repo, repo / "examples" / "team"]
    checked = 0
    for root in roots:
        monkeypatch.chdir(root)
        for spec_path in sorted(Path("specs").glob("*.toml")):
            s = load_spec(spec_path)
            path = lockmod.default_path(spec_path, s.name)
            old = lockmod.load(path)
            results = [
                Resolution(
                    choice=c,
                    wheels=[WheelCandidate(**w.model_dump()) for w in part.wheels],
                    debs=list(part.debian.packages) if part.debian else [],
                    deb_requested=list(part.debian.requested) if part.debian else [],
                )
                for c, part in zip(choose_all(s, db), old.parts, strict=True)
            ]
            new = lockmod.from_resolutions(
                results,
                spec_path=lockmod.spec_relative_to_lock(spec_path, path),
                db_version=old.meta.db_version,
            )
            assert lockmod.dumps(new) == path.read_text(encoding="utf-8"), root / path
            checked += 1
    assert checked >= 7


# ---- the glibc of a base: one source (debian.models.SUITES), capped at uv's newest manylinux ------


def test_suites_come_from_debian_models():
    from envspec.debian.models import SUITES as DEBIAN
    from envspec.resolve.model import SUITES

    assert {py: suite for py, (suite, _) in SUITES.items()} == {
        f["python"]: s for s, f in DEBIAN.items()
    }
    assert DEBIAN["trixie"]["glibc"] == "2.41"  # newer than uv's newest manylinux target


@pytest.mark.parametrize(
    "glibc, tag",
    [("2.28", "2_28"), ("2.36", "2_36"), ("2.40", "2_40"), ("2.41", "2_40"), ("3.0", "2_40")],
)
def test_manylinux_glibc_is_capped_at_uvs_newest_target(glibc, tag):
    from envspec.resolve.model import manylinux_glibc

    assert manylinux_glibc(glibc) == tag


@pytest.mark.parametrize(
    "body, tag",
    [
        ('[python]\nversion = "3.11"\n', "manylinux_2_36_x86_64"),
        ('[python]\nversion = "3.13"\n', "manylinux_2_40_x86_64"),
        (
            '[python]\nversion = "3.11"\n[system]\nbase = "debian:bookworm"\n',
            "manylinux_2_36_x86_64",
        ),
        ('[python]\nversion = "3.13"\n[system]\nbase = "debian:trixie"\n', "manylinux_2_40_x86_64"),
        ('[python]\nversion = "3.12"\n[system]\nbase = "none"\n', "manylinux_2_28_x86_64"),
    ],
)
def test_platform_tags_per_base(db, body, tag):
    assert choose(spec(body), db).platform_tag == tag


def test_uv_knows_the_newest_manylinux_target():
    import subprocess

    from envspec.errors import SourceError
    from envspec.resolve.model import UV_MAX_MANYLINUX
    from envspec.resolve.uv import _uv

    try:
        uv = _uv()
    except SourceError:
        pytest.skip("uv is not installed")
    target = "x86_64-manylinux_{}_{}".format(*UV_MAX_MANYLINUX)
    help_text = subprocess.run(
        [uv, "pip", "compile", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert target in help_text


def test_a_build_whose_driver_floor_passes_a_gpus_last_branch_is_not_chosen(db):
    """Without [target].driver the hosts are assumed to run the build's floor: a build whose floor
    is newer than a GPU's last driver branch cannot run there. (No GPU of the DB is in that case
    with a build that has its kernels, so an H100 is given R550 as its last branch here.)"""
    h100 = db.find_gpu("H100").model_copy(update={"max_driver": "550", "max_driver_source": "test"})
    from envspec.compat.model import CompatDB

    test_db = CompatDB(
        version=db.version,
        date=db.date,
        format=db.format,
        torch_releases=db.torch_releases,
        cuda_toolkits=db.cuda_toolkits,
        gpus=[h100 if g.name == h100.name else g for g in db.gpus],
        sources=db.sources,
    )
    c = choose(spec('[target]\ngpus = ["H100"]\n[torch]\nversion = "2.14.*"\n'), test_db)
    assert c.torch.variant.cuda.startswith("12.") and int(c.torch.min_driver.split(".")[0]) <= 550
    from envspec.explain import candidate_reason

    rejected = {x.variant: candidate_reason(x) for x in c.torch.candidates if not x.ok}
    assert "R550, the last driver branch for H100" in rejected["cu130"]
    with pytest.raises(ResolutionImpossible) as ei:
        choose(
            spec('[target]\ngpus = ["H100"]\n[torch]\nversion = "2.14.*"\ncuda = "13.0"\n'), test_db
        )
    assert ei.value.reference == "driver-too-new-for-gpu"


def test_no_name_or_alias_of_an_nvidia_gpu_is_taken_for_another_vendors(db):
    from envspec.resolve.torch import not_nvidia

    for g in db.gpus:
        for label in (g.name, *g.aliases, g.sm):
            assert not_nvidia(label) is None, (g.name, label)
    for name, vendor in (
        ("MI300X", "AMD"),
        ("Instinct MI250X", "AMD"),
        ("Radeon Pro W7900", "AMD"),
        ("Gaudi2", "Intel"),
        ("Data Center GPU Max 1550", "Intel"),
        ("M3 Max", "Apple"),
        ("TPU v5p", "Google"),
        ("Trainium2", "AWS"),
    ):
        assert not_nvidia(name) == vendor, name
    assert (
        not_nvidia("Tesla M4") is None and not_nvidia("M40") is None
    )  # NVIDIA's Maxwell, not Apple's M4
