import pytest

from envspec.verify.archrule import parse_arch, runnable_by


@pytest.mark.parametrize(
    "arch_list, cc, kind, usable",
    [
        (["sm_80", "sm_90"], "9.0", "sass", ["sm_90"]),
        (["sm_80"], "9.0", "none", []),  # A100-only kernels on an H100/H200: nothing runs
        (["sm_80", "sm_86"], "8.9", "sass", ["sm_80", "sm_86"]),  # an L4 runs sm_86 SASS
        (["sm_100"], "10.3", "sass", ["sm_100"]),  # a B300 runs sm_100 SASS
        (["sm_90"], "10.0", "none", []),  # a B200 cannot run sm_90 SASS (other major)...
        (["sm_90", "compute_90"], "10.0", "ptx", ["compute_90"]),  # ...but JITs compute_90 PTX
        (["sm_90a"], "9.0", "sass", ["sm_90a"]),
        (["sm_90a", "compute_90a"], "10.0", "none", []),  # 'a' runs only on exactly 9.0
        (["sm_100f"], "10.3", "sass", ["sm_100f"]),  # family: same major, minor <=
        (["sm_100f"], "12.0", "none", []),
        (["compute_120"], "9.0", "none", []),  # PTX never runs backwards
        ([], "9.0", "none", []),
    ],
)
def test_runnable_by(arch_list, cc, kind, usable):
    assert runnable_by(arch_list, cc) == (usable, kind)


def test_parse_arch_rejects_garbage():
    with pytest.raises(ValueError):
        parse_arch("sm90")
    assert parse_arch("compute_120").major == 12
