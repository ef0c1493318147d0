"""[target].platforms and the platform's torch build: the spec key, the default from the GPUs,
and which build (and index) PyPI's wheel is on linux-aarch64 (compat/data/torch_platforms.toml)."""

from __future__ import annotations

import pytest

from envspec.causes import NoWheelForPlatform
from envspec.compat import load_db
from envspec.compat.platforms import pypi_build
from envspec.errors import SpecError
from envspec.resolve import choose, choose_all
from envspec.resolve.uv import requirements
from envspec.spec import parse_spec


def spec(body: str):
    return parse_spec('name = "t"\n' + body, "t.toml")


@pytest.fixture(scope="module")
def db():
    return load_db()


def test_no_gpus_default_to_linux_x86_64(db):
    c = choose(spec('[python]\nversion = "3.11"\n'), db)
    assert (c.arch, c.platform, c.debian_arch) == ("x86_64", "linux-x86_64", "amd64")


def test_grace_gpus_default_to_linux_aarch64(db):
    c = choose(spec('[target]\ngpus = ["GH200"]\ndriver = "580"\n[torch]\nversion = ">=2.9"\n'), db)
    assert (c.arch, c.platform, c.debian_arch, c.platform_tag) == (
        "aarch64",
        "linux-aarch64",
        "arm64",
        "manylinux_2_36_aarch64",
    )


def test_named_platform_wins_without_gpus(db):
    c = choose(spec('[target]\nplatforms = ["linux-aarch64"]\n'), db)
    assert (c.arch, c.debian_arch) == ("aarch64", "arm64")
    c = choose(spec('[target]\nplatforms = ["linux-x86_64"]\n'), db)
    assert c.arch == "x86_64"


def test_named_platform_with_a_gpu_of_both_kinds_of_hosts(db):
    # a T4 ships in x86 and in Arm servers (gpus.toml): the spec's word decides
    c = choose(
        spec(
            '[target]\nplatforms = ["linux-aarch64"]\ngpus = ["T4"]\n[torch]\nversion = "2.9.1"\n'
        ),
        db,
    )
    assert c.arch == "aarch64"


def test_a_grace_gpu_on_x86_is_a_spec_error_naming_the_gpu(db):
    with pytest.raises(SpecError) as e:
        choose(
            spec(
                '[target]\nplatforms = ["linux-x86_64"]\ngpus = ["H100", "GH200"]\n[torch]\nversion = "2.14.*"\n'
            ),
            db,
        )
    p = e.value.problems()[0]
    assert (p.reference, p.path, p.line) == ("gpu-not-on-platform", "[target].gpus[1]", 4)
    assert "GH200" in p.message and "linux-aarch64" in p.hint


def test_two_platforms_give_a_choice_each_in_the_spec_order(db):
    cs = choose_all(spec('[target]\nplatforms = ["linux-aarch64", "linux-x86_64"]\n'), db)
    assert [(c.platform, c.debian_arch) for c in cs] == [
        ("linux-aarch64", "arm64"),
        ("linux-x86_64", "amd64"),
    ]
    assert [c.platform for c in choose_all(spec('[python]\nversion = "3.11"\n'), db)] == [
        "linux-x86_64"
    ]


def test_a_mixed_fleet_targets_each_platforms_own_gpus(db):
    cs = choose_all(
        spec(
            '[target]\nplatforms = ["linux-x86_64", "linux-aarch64"]\ngpus = ["H100", "GH200"]\n'
            '[torch]\nversion = "2.9.1"\n'
        ),
        db,
    )
    assert [[g.short for g in c.gpus] for c in cs] == [["H100"], ["GH200"]]
    assert cs[0].torch is not None and cs[1].torch is not None


def test_without_platforms_a_mixed_fleet_hints_at_naming_both(db):
    with pytest.raises(SpecError) as e:
        choose(spec('[target]\ngpus = ["H100", "GH200"]\n[torch]\nversion = "2.9.1"\n'), db)
    p = e.value.problems()[0]
    assert p.reference == "mixed-platforms" and "linux-aarch64" in p.hint


@pytest.mark.parametrize(
    "body, ref, path",
    [
        ('platforms = ["linux-arm64"]', "unknown-platform", "[target].platforms[0]"),
        (
            'platforms = ["linux-aarch64", "linux-aarch64"]',
            "invalid-value",
            "[target].platforms[1]",
        ),
        ('platforms = "linux-aarch64"', "wrong-type", "[target].platforms"),
    ],
)
def test_bad_platforms_name_the_key_and_line(body, ref, path):
    with pytest.raises(SpecError) as e:
        spec("[target]\n" + body + "\n")
    p = e.value.problems()[0]
    assert (p.reference, p.path, p.line) == (ref, path, 3)


def test_the_platform_key_is_in_the_spec_hash_only_when_set():
    plain = spec('[python]\nversion = "3.11"\n')
    x86 = spec('[target]\nplatforms = ["linux-x86_64"]\n[python]\nversion = "3.11"\n')
    arm = spec('[target]\nplatforms = ["linux-aarch64"]\n[python]\nversion = "3.11"\n')
    assert len({plain.spec_hash(), x86.spec_hash(), arm.spec_hash()}) == 3
    # a spec without the key hashes as before the key existed: test_lock's committed locks stay fresh


def test_pypis_aarch64_torch_is_the_cpu_build():
    row = pypi_build("2.9.1", "linux-aarch64")
    assert row is not None and row.variant == "cpu" and "libtorch_cuda" in row.source
    assert pypi_build("2.10.0", "linux-aarch64").variant == "cpu"
    assert pypi_build("2.8.0", "linux-aarch64").variant == "cpu"
    assert pypi_build("2.9.1", "linux-x86_64") is None  # x86's PyPI build is torch_pypi.toml's


def test_pypis_aarch64_torch_from_2_11_is_the_cuda_build_x86_64_has(db):
    # PyPI's aarch64 wheels of 2.11 .. 2.15 carry libtorch_cuda.so and x86_64's Requires-Dist
    for version in ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0"):
        row = pypi_build(version, "linux-aarch64")
        rel = next(r for r in db.torch_releases if r.version == version)
        assert row is not None and row.variant == rel.pypi_variant, version
        assert "libtorch_cuda.so" in row.source and "2026-12-02" in row.source
    assert (
        pypi_build("2.16.0", "linux-aarch64") is None
    )  # a release no row covers: the PyTorch index


def test_a_grace_spec_takes_pypis_aarch64_cuda_wheel_without_a_label(db):
    arm = choose(
        spec('[target]\ngpus = ["GH200"]\ndriver = "580.65.06"\n[torch]\nversion = "2.14.*"\n'), db
    )
    v = arm.torch.variant
    assert arm.arch == "aarch64" and arm.torch.release.version == "2.14.1"
    assert (v.name, v.local, v.index, v.pypi) == ("cu130", "", "https://pypi.org/simple", True)
    assert requirements(arm)[0] == ["torch==2.14.1"]
    # its arches are those PyPI's aarch64 build was compiled for, not x86_64's (sm_75/sm_86, no sm_110)
    assert v.arch_list == ["sm_80", "sm_90", "sm_100", "sm_110", "sm_120"]
    x86 = choose(
        spec('[target]\ngpus = ["H100"]\ndriver = "580.65.06"\n[torch]\nversion = "2.14.*"\n'), db
    )
    assert x86.torch.variant.arch_list == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def test_aarch64_cpu_torch_comes_from_pypi_without_a_local_label(db):
    c = choose(
        spec(
            '[target]\nplatforms = ["linux-aarch64"]\n[torch]\nversion = "==2.9.1"\ncuda = "cpu"\n'
        ),
        db,
    )
    v = c.torch.variant
    assert (v.name, v.index, v.local, v.pypi) == ("cpu", "https://pypi.org/simple", "", True)
    assert requirements(c)[0] == ["torch==2.9.1"]
    x86 = choose(spec('[torch]\nversion = "==2.9.1"\ncuda = "cpu"\n'), db).torch.variant
    assert (x86.index, x86.local) == ("https://download.pytorch.org/whl/cpu", "cpu")


def test_aarch64_cuda_torch_never_takes_pypis_cpu_wheel(db):
    # on x86 PyPI's 2.9.1 is cu128; on aarch64 PyPI's wheel is CPU, so a CUDA build needs its label
    x86 = choose(
        spec(
            '[target]\ngpus = ["H100"]\ndriver = "580.95.05"\n[torch]\nversion = "==2.9.1"\ncuda = "12.8"\n'
        ),
        db,
    )
    assert (x86.torch.variant.name, x86.torch.variant.local) == ("cu128", "")
    arm = choose(
        spec(
            '[target]\ngpus = ["GH200"]\ndriver = "580.95.05"\n[torch]\nversion = "==2.9.1"\ncuda = "12.8"\n'
        ),
        db,
    )
    v = arm.torch.variant
    assert (v.name, v.local, v.index, v.pypi) == (
        "cu128",
        "cu128",
        "https://download.pytorch.org/whl/cu128",
        False,
    )
    assert requirements(arm)[0] == ["torch==2.9.1+cu128"]


def test_aarch64_auto_prefers_the_stable_cuda_from_the_pytorch_index(db):
    # 2.9.1's stable CUDA (PyPI's x86_64 build) is cu128: on aarch64 the same CUDA, with its label
    arm = choose(
        spec('[target]\ngpus = ["GH200"]\ndriver = "580.95.05"\n[torch]\nversion = "==2.9.1"\n'), db
    )
    assert (arm.torch.variant.name, arm.torch.variant.local) == ("cu128", "cu128")
    assert [x.variant for x in arm.torch.candidates if x.preferred] == ["cu128"]
    # a driver below 12.8's floor: the newest CUDA that fits
    old = choose(
        spec(
            '[target]\ngpus = ["GH200"]\ndriver = "560.35.03"\ndriver_policy = "strict"\n'
            '[torch]\nversion = "==2.9.1"\n'
        ),
        db,
    )
    assert old.torch.variant.name == "cu126" and old.torch.variant.index.endswith("/cu126")


UV_NO_TORCH = (
    "  × No solution found when resolving dependencies:\n"
    "  ╰─▶ Because there is no version of torch==2.14.1+cu126 and you require torch==2.14.1+cu126, we can "
    "conclude that your requirements are unsatisfiable.\n"
)


def test_a_torch_build_with_no_aarch64_wheel_is_named_with_what_pypi_has(db):
    from envspec.resolve.failures import _platform_wheel_error

    arm = choose(
        spec('[target]\ngpus = ["GH200"]\ndriver = "580"\n[torch]\nversion = ">=2.9"\n'), db
    )
    err = _platform_wheel_error(
        UV_NO_TORCH,
        arm,
        [
            "https://download.pytorch.org/whl/cu126 is unreachable; its "
            "files must come from a mirror"
        ],
    )
    assert err is not None and err.reference == "no-wheel-for-platform" and err.exit_code == 2
    first = err.causes[0]
    assert isinstance(first, NoWheelForPlatform) and isinstance(err.causes[1], NoWheelForPlatform)
    assert first.where == "[torch].version (t.toml:6)"
    assert "torch==2.14.1+cu126" in first.text and "linux-aarch64" in first.text
    assert "PyPI's linux-aarch64 wheel of torch 2.14.1 is its cu130 build" in first.text
    assert "unreachable" in err.causes[1].text and "mirror" in err.hint
    # on x86_64 the same uv answer stays uv's conflict (the resolver's words), not a platform error
    x86 = choose(spec('[target]\ngpus = ["H100"]\n[torch]\nversion = ">=2.9"\n'), db)
    assert _platform_wheel_error(UV_NO_TORCH, x86, []) is None


UV_NO_AARCH64 = (
    "error: No solution found when resolving dependencies\n"
    "  cause: Because intel-openmp==2024.2.1 has no wheels with a matching platform tag (e.g., "
    "`manylinux_2_36_aarch64`) and you require intel-openmp==2024.2.1, we can conclude that your requirements "
    "are unsatisfiable.\n\n"
    "hint: Wheels are available for `intel-openmp` (v2024.2.1) on the following platforms: `manylinux1_i686`, "
    "`manylinux1_x86_64`, `win32`, `win_amd64`\n"
)  # uv 0.13's words (recorded 2026-12-01)


def test_a_package_with_no_aarch64_wheel_is_named_at_its_line_with_what_it_has(db):
    from envspec.resolve.failures import _platform_wheel_error

    arm = choose(
        spec(
            '[target]\nplatforms = ["linux-aarch64"]\n[python]\npackages = ["six", "intel-openmp==2024.2.1"]\n'
        ),
        db,
    )
    err = _platform_wheel_error(UV_NO_AARCH64, arm, [])
    assert err is not None and err.reference == "no-wheel-for-platform" and err.exit_code == 2
    c = err.causes[0]
    assert isinstance(c, NoWheelForPlatform)
    assert c.where == "[python].packages[1] (t.toml:5)", c
    assert (
        "intel-openmp==2024.2.1 has no linux-aarch64" in c.text and "`manylinux1_x86_64`" in c.text
    )


def test_explain_of_a_two_platform_spec_gives_each_platforms_choice(tmp_path, capsys):
    import json

    from envspec.cli import main

    p = tmp_path / "fleet.toml"
    p.write_text(
        'name = "fleet"\n[target]\nplatforms = ["linux-x86_64", "linux-aarch64"]\ngpus = ["H100", "GH200"]\n'
        '[torch]\nversion = "2.9.1"\n'
    )
    assert main(["explain", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["platform"] for c in out["platforms"]] == ["linux-x86_64", "linux-aarch64"]
    assert main(["explain", str(p)]) == 0
    text = capsys.readouterr().out
    assert text.index("linux-x86_64") < text.index("linux-aarch64")
