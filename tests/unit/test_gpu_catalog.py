"""The GPU catalog as a user meets it (issue 29): every GPU is found by each of its names, written
the ways people and tools write them, and did-you-mean stays within the generation a name's model
number belongs to. Exhaustive over the catalog: a property of every entry, not of a sample."""

from __future__ import annotations

import re

import pytest

from envspec.compat import load_db
from envspec.compat.model import _model_tokens

DB = load_db()
IDS = [g.name for g in DB.gpus]


def _spellings(label: str) -> list[str]:
    """How people and tools write one name: as is, upper and lower case, dashes or nothing for spaces,
    and with the "NVIDIA " prefix that drivers since R470 print and older ones did not."""
    out = [
        label,
        label.upper(),
        label.lower(),
        label.replace(" ", "-"),
        label.replace(" ", ""),
        f"NVIDIA {label}" if not label.startswith("NVIDIA ") else label[len("NVIDIA ") :],
    ]
    return out


@pytest.mark.parametrize("gpu", DB.gpus, ids=IDS)
def test_each_gpu_is_found_by_each_of_its_names(gpu):
    for label in [gpu.name, *gpu.aliases]:
        for text in _spellings(label):
            found = DB.find_gpu(text)
            assert found is not None and found.name == gpu.name, (text, found and found.name)


def test_names_are_what_nvidia_smi_prints():
    """nvidia-smi (and NVML's nvmlDeviceGetName) print "NVIDIA ..." for every GPU a current driver
    drives from Ampere on; Tesla-era data center GPUs keep "Tesla ..."; Quadro keeps "Quadro ..."."""
    for g in DB.gpus:
        if g.line == "jetson":
            continue  # Jetson Linux's nvidia-smi prints "Orin (nvgpu)", "NVIDIA Thor"; the others have none
        assert re.match(r"(NVIDIA|Tesla|Quadro) ", g.name), g.name
        if g.architecture in ("Ampere", "Ada Lovelace", "Hopper", "Blackwell"):
            assert g.name.startswith("NVIDIA "), g.name


def _generation_of_tokens(gpu) -> set[str]:
    archs: set[str] = set()
    for t in _model_tokens(gpu.short):
        archs |= {
            g.architecture
            for g in DB.gpus
            for label in [g.name, *g.aliases]
            if t in _model_tokens(label)
        }
    return archs


@pytest.mark.parametrize("gpu", DB.gpus, ids=IDS)
def test_did_you_mean_never_leaves_the_generation_of_the_model_number(gpu):
    """A name that is not in the catalog but carries the model number of a GPU ("H100-SXM5-94GB",
    "RTX 4090 Turbo") is offered GPUs of that model's generation only."""
    if _generation_of_tokens(gpu) != {gpu.architecture}:
        pytest.skip(f"{gpu.short!r} has no model number of one generation alone")
    for query in (f"{gpu.short} 999GB", f"{gpu.short} Turbo", f"NVIDIA {gpu.short}-XT"):
        if DB.find_gpu(query) is not None:
            continue
        sugg = DB.suggest_gpus(query)
        assert sugg, query
        archs = {DB.find_gpu(s).architecture for s in sugg}
        assert archs == {gpu.architecture}, (query, sugg, archs)


@pytest.mark.parametrize(
    "query, want, not_",
    [
        ("H100-SXM5-94GB", "H100-SXM5-80GB", "A100"),
        ("RTX 3065", "RTX 3060", "RTX 4060"),
        ("Quadro RTX 9000", "Quadro RTX 8000", "RTX A6000"),
        ("Tesla V100-SXM3-16GB", "V100", "P100"),
        ("RTX 4900", "RTX 4090", None),
    ],
)
def test_did_you_mean_examples(query, want, not_):
    assert DB.find_gpu(query) is None
    sugg = DB.suggest_gpus(query)
    assert any(want in s for s in sugg), sugg
    assert not_ is None or not any(s.startswith(not_) for s in sugg), sugg


def test_every_generation_and_line_is_there():
    archs = {g.architecture for g in DB.gpus}
    assert archs == {
        "Kepler",
        "Maxwell",
        "Pascal",
        "Volta",
        "Turing",
        "Ampere",
        "Ada Lovelace",
        "Hopper",
        "Blackwell",
    }
    for short in [
        "GTX 1080",
        "RTX 3060",
        "RTX 4070",
        "RTX 5080",
        "A2",
        "A16",
        "L20",
        "H20",
        "H800",
        "A800",
        "Quadro RTX 8000",
        "TITAN V",
        "P40",
        "M60",
        "K40m",
        "RTX PRO 6000",
        "RTX PRO 4000",
        "Jetson AGX Orin",
        "Jetson AGX Thor",
        "DGX Spark",
        "RTX 4090 Laptop",
    ]:
        assert DB.find_gpu(short) is not None, short
    assert {g.line for g in DB.gpus} == {"datacenter", "workstation", "geforce", "jetson"}
