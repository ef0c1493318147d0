"""The two copies of the GPU driver-branch rule agree: the compat DB's gpus.toml (`min_driver` per GPU,
with sources; the resolver and doctor use it) and the stdlib-only verify/driverrule.py (by compute
capability; the verifier inside images uses it). Exhaustive over the DB's GPUs."""

from __future__ import annotations

import pytest

from envspec.compat import driver_branch, load_db
from envspec.verify import driverrule

DB = load_db()


@pytest.mark.parametrize("gpu", DB.gpus, ids=[g.name for g in DB.gpus])
def test_each_gpu_has_the_same_first_branch_in_both(gpu):
    want = driverrule.first_branch(gpu.cc)
    if not gpu.min_driver:
        assert want is None, f"{gpu.name}: verify knows R{want} for cc {gpu.cc}, gpus.toml has none"
        return
    assert want == driver_branch(gpu.min_driver), (gpu.name, gpu.cc, gpu.min_driver, want)
    for driver, too_old in (
        (f"{want - 1}.99.99", True),
        (f"{want}.00.01", False),
        (f"{want + 100}.1", False),
    ):
        assert gpu.driver_too_old(driver) is too_old
        assert driverrule.too_old(driver, gpu.cc)[0] is too_old


def test_verify_knows_the_families_of_the_db_and_no_other():
    assert set(driverrule.FIRST_BRANCH) == {f.cc for f in DB.families if f.min_driver}
    assert set(driverrule.LAST_BRANCH) == {f.cc for f in DB.families if f.max_driver}
    for f in DB.families:
        assert driverrule.first_branch(f.cc) == (
            driver_branch(f.min_driver) if f.min_driver else None
        ), f.cc
        assert driverrule.last_branch(f.cc) == (
            driver_branch(f.max_driver) if f.max_driver else None
        ), f.cc


@pytest.mark.parametrize("gpu", DB.gpus, ids=[g.name for g in DB.gpus])
def test_each_gpu_has_the_same_last_branch_in_both(gpu):
    last = driverrule.last_branch(gpu.cc)
    if not gpu.max_driver:
        assert last is None, (
            f"{gpu.name}: verify knows R{last} as the last for cc {gpu.cc}, gpus.toml has none"
        )
        assert not gpu.driver_too_new("999.1")
        return
    assert last == driver_branch(gpu.max_driver) and gpu.max_driver_source.strip(), (
        gpu.name,
        gpu.max_driver,
        last,
    )
    for driver, too_new in (
        (f"{last}.99.99", False),
        (f"{last + 5}.00.01", True),
        (f"{last + 10}.1", True),
    ):
        assert gpu.driver_too_new(driver) is too_new
        assert driverrule.too_new(driver, gpu.cc)[0] is too_new


def test_kepler_ends_at_r470_and_maxwell_pascal_and_volta_at_r580():
    assert {f.architecture for f in DB.families if f.max_driver == "470"} == {"Kepler"}
    assert {f.cc for f in DB.families if f.max_driver == "580"} == {
        "5.0",
        "5.2",
        "6.0",
        "6.1",
        "7.0",
    }
    # every discrete Kepler, Maxwell, Pascal and Volta GPU has its last branch; Jetson has no branch at all
    for g in DB.gpus:
        if g.line == "jetson":
            assert not g.min_driver and not g.max_driver and g.driver_note, g.name
        elif g.architecture in ("Kepler", "Maxwell", "Pascal", "Volta"):
            assert g.max_driver == ("470" if g.architecture == "Kepler" else "580"), g.name
        else:
            assert not g.max_driver, g.name


def test_every_floor_has_a_source_and_grace_systems_are_arm():
    for g in DB.gpus:
        assert not g.min_driver or g.min_driver_source.strip(), g.name
    arm_only = {g.short for g in DB.gpus if g.host_arch == ["aarch64"]}
    assert {"GH200", "GB200", "GB300", "GB10"} <= arm_only
    assert DB.find_gpu("H100").host_arch == ["x86_64"] and "aarch64" in DB.find_gpu("T4").host_arch


def test_the_verifiers_gemm_rates_are_the_db_ones():
    """issue 29, 1: the verifier's speed check expects each GPU's dense bf16 and tf32 rate from gpus.toml
    (verify/rates.py carries a copy: the verifier imports nothing from envspec), found by the name
    torch and nvidia-smi print; a GPU without a published rate gets none, never another GPU's."""
    from envspec.verify import rates

    with_rates = {
        g.name: g for g in DB.gpus if g.bf16_tflops is not None or g.tf32_tflops is not None
    }
    assert set(rates.RATES) == set(with_rates)
    for g in DB.gpus:
        for kind, want in (("bf16", g.bf16_tflops), ("tf32", g.tf32_tflops)):
            got = rates.expected_rate(g.name, kind)
            assert (got[0] if got else None) == want, (g.name, kind, got, want)
            if got:
                assert got[1] and got[1] in g.source, (g.name, got[1])
    # older drivers print the name without "NVIDIA "; a longer name is not taken for a shorter one
    assert rates.expected_rate("A100-SXM4-80GB", "bf16")[0] == 312.0
    assert (
        rates.expected_rate("NVIDIA RTX A1000", "bf16") is None
        and rates.expected_rate("NVIDIA L40", "bf16")[0] == 181.05
    )


def test_the_verifiers_node_figures_are_the_db_ones():
    """issue 31, 3: the node check's expected figures come from gpus.toml with their sources: the
    PCIe generations' rates (copy bandwidth) and the all-reduce bus bandwidth of 8 GPUs of a model."""
    from envspec.verify import health, rates

    assert {x.gen: x.gbs_per_lane for x in DB.pcie} == health.PCIE_GBS_PER_LANE
    assert all(x.source.strip() for x in DB.pcie)
    want = {
        g.name: g.node_allreduce_busbw_gbs
        for g in DB.gpus
        if g.node_allreduce_busbw_gbs is not None
    }
    assert {k: v for k, (v, _) in rates.ALLREDUCE_8.items()} == want
    for name, (_, src) in rates.ALLREDUCE_8.items():
        g = DB.find_gpu(name)
        assert src.split(", ")[-1] in g.node_allreduce_source, (name, src)
