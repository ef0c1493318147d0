"""The architecture rule: SASS within a major, PTX forward through the JIT, a/f variants narrowly."""

import pytest

from envspec.compat import arch_runs, load_db, parse_arch, why_arch

TORCH_CU128 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # torch 2.7 cu128
TORCH_CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]  # torch 2.5 cu124


@pytest.mark.parametrize(
    "cc, arch, runs",
    [
        ("10.3", "sm_100", True),  # B300 runs B200 SASS: same major, 0 <= 3
        ("8.9", "sm_86", True),  # L4 runs sm_86 SASS
        ("8.9", "sm_80", True),
        ("8.6", "sm_89", False),  # SASS never runs on an older minor
        ("9.0", "sm_86", False),  # ... nor across majors
        ("10.0", "sm_90", False),
        ("12.0", "sm_100", False),  # RTX 5090 is not a 10.x part
        ("10.0", "sm_120", False),
        ("9.0", "compute_90", True),  # PTX: AB <= XY
        ("12.0", "compute_90", True),
        ("10.0", "compute_80", True),
        ("8.0", "compute_86", False),
        ("10.0", "compute_120", False),
        ("9.0", "sm_90a", True),  # architecture-specific: exactly 9.0
        ("10.0", "sm_90a", False),
        ("12.0", "compute_90a", False),
        ("10.3", "sm_100a", False),
        ("10.0", "sm_100f", True),  # family-specific: same major, minor >= 0
        ("10.3", "sm_100f", True),
        ("10.0", "sm_103f", False),
        ("12.1", "sm_120f", True),
        ("12.0", "sm_100f", False),
        ("3.7", "sm_37", True),
        ("6.1", "sm_60", True),
        ("8.7", "sm_86", True),  # Orin runs sm_86 SASS (same major)
    ],
)
def test_arch_runs(cc, arch, runs):
    assert arch_runs(cc, arch) is runs


def test_b200_cannot_use_a_list_without_sm100_or_ptx():
    ok, why = why_arch("10.0", TORCH_CU124)
    assert not ok
    assert "10.0" in why and "sm_100" in why and "sm_90" in why


def test_b200_can_use_ptx_up_to_100():
    ok, why = why_arch("10.0", TORCH_CU124 + ["compute_90"])
    assert ok and "compute_90 PTX" in why


def test_rtx5090_runs_a_list_up_to_sm90_through_ptx():
    ok, why = why_arch("12.0", ["sm_80", "sm_86", "sm_90", "compute_90"])
    assert ok
    assert why == "compute_90 PTX runs on 12.0 through the driver's JIT (90 <= 120)"


def test_reason_names_the_closest_sass():
    assert why_arch("8.9", TORCH_CU128) == (True, "sm_86 SASS runs on 8.9 (same major, 6 <= 9)")
    assert why_arch("10.3", TORCH_CU128) == (True, "sm_100 SASS runs on 10.3 (same major, 0 <= 3)")
    assert why_arch("9.0", TORCH_CU128) == (True, "sm_90 SASS runs on 9.0 (exact match)")
    # SASS is preferred over PTX when both run
    assert why_arch("12.0", ["compute_120", "sm_120"])[1].startswith("sm_120 SASS")


def test_a_and_f_reasons():
    assert (
        why_arch("9.0", ["sm_90a"])[1]
        == "sm_90a SASS runs on 9.0 (architecture-specific, exact match)"
    )
    assert "family-specific" in why_arch("10.3", ["sm_100f"])[1]
    ok, why = why_arch("10.0", ["sm_90a"])
    assert not ok


def test_empty_list_runs_nothing():
    ok, why = why_arch("9.0", [])
    assert not ok and "empty" in why


@pytest.mark.parametrize("bad", ["sm90", "sm_9", "compute_x", "sm_90b", "SM_90 "])
def test_bad_entries_raise(bad):
    with pytest.raises(ValueError):
        parse_arch(bad.strip() if bad != "SM_90 " else "SM_90")


@pytest.mark.parametrize("bad", ["9", "nine", "9.10", ""])
def test_bad_cc_raises(bad):
    with pytest.raises(ValueError):
        arch_runs(bad, "sm_90")


def test_parse_arch_numbers():
    a = parse_arch("sm_121f")
    assert (a.kind, a.major, a.minor, a.suffix) == ("sass", 12, 1, "f")
    p = parse_arch("compute_100")
    assert (p.kind, p.major, p.minor, p.suffix) == ("ptx", 10, 0, "")


def test_real_builds_on_real_gpus():
    db = load_db()
    cu130 = db.torch_release("2.14.1").variants["cu130"]
    for gpu in ("B300", "B200", "H100", "L4", "RTX 5090", "A100", "T4"):
        assert why_arch(db.find_gpu(gpu).cc, cu130.arch_list)[0], gpu
    # CUDA 13 builds dropped Volta and older
    for gpu in ("V100", "P100", "K80", "GTX 1080 Ti"):
        assert not why_arch(db.find_gpu(gpu).cc, cu130.arch_list)[0], gpu
    # torch 2.6 has no Blackwell SASS and no PTX: a B200 cannot use any of its builds
    b200 = db.find_gpu("B200")
    rel = db.torch_release("2.6.0")
    assert not any(why_arch(b200.cc, v.arch_list)[0] for v in rel.variants.values())
    # torch 2.7 cu128 can
    assert why_arch(b200.cc, db.torch_release("2.7.0").variants["cu128"].arch_list)[0]
