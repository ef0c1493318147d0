"""The bundled compatibility DB: coverage, integrity, lookups, and the loader's errors."""

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from envspec.compat import DATA_DIR, CompatDB, load_db, parse_arch, parse_cc
from envspec.errors import CompatDBError


@pytest.fixture(scope="module")
def db() -> CompatDB:
    return load_db(validate=True)  # the data files as checked now, not the cache of checked DBs


# ---- coverage ----------------------------------------------------------------------------------

EXPECTED_RELEASES = [
    "2.0.0",
    "2.0.1",
    "2.1.0",
    "2.1.1",
    "2.1.2",
    "2.2.0",
    "2.2.1",
    "2.2.2",
    "2.3.0",
    "2.3.1",
    "2.4.0",
    "2.4.1",
    "2.5.0",
    "2.5.1",
    "2.6.0",
    "2.7.0",
    "2.7.1",
    "2.8.0",
    "2.9.0",
    "2.9.1",
    "2.10.0",
    "2.11.0",
    "2.12.0",
    "2.12.1",
    "2.13.0",
    "2.14.0",
    "2.14.1",
    "2.15.0",
]


def test_every_release_from_2_0_to_2_15_is_present_and_sorted(db):
    versions = [r.version for r in db.torch_releases]
    assert versions == sorted(versions, key=Version)
    assert set(EXPECTED_RELEASES) <= set(versions)
    assert versions[0] == "2.0.0" and versions[-1] == "2.15.0"


def test_db_is_versioned_and_dated(db):
    assert db.version == "2026.11.30" and db.date == "2026-11-30" and db.format == 1
    Version(db.version)


@pytest.mark.parametrize(
    "version, pypi, cuda, cudnn, nccl",
    [
        ("2.0.0", "cu117", "11.7", "8.5.0.96", "2.14.3"),
        ("2.1.0", "cu121", "12.1", "8.9.2.26", "2.18.1"),
        ("2.5.1", "cu124", "12.4", "9.1.0.70", "2.21.5"),
        ("2.7.1", "cu126", "12.6", "9.5.1.17", "2.26.2"),
        ("2.9.1", "cu128", "12.8", "9.10.2.21", "2.27.5"),
        ("2.11.0", "cu130", "13.0", "9.19.0.56", "2.28.9"),
        ("2.14.1", "cu130", "13.0", "9.24.0.43", "2.30.7"),
        ("2.15.0", "cu132", "13.2", "9.26.0.51", "2.30.7"),
    ],
)
def test_pypi_variant_and_exact_pins(db, version, pypi, cuda, cudnn, nccl):
    rel = db.torch_release(version)
    assert rel.pypi_variant == pypi
    v = rel.variants[pypi]
    assert (v.cuda, v.cudnn, v.nccl) == (cuda, cudnn, nccl)
    assert v.index == "https://pypi.org/simple" and v.local == "" and v.pypi
    assert v.pytorch_index == f"https://download.pytorch.org/whl/{pypi}" and v.pytorch_local == pypi
    assert "pypi-metadata" in v.source


def test_non_pypi_variants_come_from_the_pytorch_index(db):
    v = db.torch_release("2.14.1").variants["cu126"]
    assert v.index == "https://download.pytorch.org/whl/cu126" and v.local == "cu126" and not v.pypi
    cpu = db.torch_release("2.13.0").variants["cpu"]
    assert cpu.cuda is None and cpu.arch_list == [] and cpu.local == "cpu"


def test_python_versions_from_wheel_tags(db):
    assert db.torch_release("2.0.0").python == ["3.8", "3.9", "3.10", "3.11"]
    assert db.torch_release("2.9.1").python == ["3.10", "3.11", "3.12", "3.13", "3.14"]
    assert "3.11" in db.torch_release("2.14.1").python
    assert "3.14" in db.torch_release("2.14.1").python_freethreaded


def test_known_arch_lists(db):
    # observed: 2.7.1+cu128 reports compute_120 too; 2.9.1+cu128 has Volta back; 2.11.0+cu128 drops it
    assert db.torch_release("2.7.1").variants["cu128"].arch_list == [
        "sm_75",
        "sm_80",
        "sm_86",
        "sm_90",
        "sm_100",
        "sm_120",
        "compute_120",
    ]
    assert db.torch_release("2.9.1").variants["cu128"].arch_list[0] == "sm_70"
    assert db.torch_release("2.11.0").variants["cu128"].arch_list[0] == "sm_75"
    assert (
        db.torch_release("2.13.0").variants["cu130"].arch_list[-1] == "sm_120"
    )  # release builds: no PTX
    # observed on a test machine: torch 2.11.0+cu130 reports sm_75..sm_120
    assert db.torch_release("2.11.0").variants["cu130"].arch_list == [
        "sm_75",
        "sm_80",
        "sm_86",
        "sm_90",
        "sm_100",
        "sm_120",
    ]
    assert "compute_120" in db.torch_release("2.8.0").variants["cu129"].arch_list
    assert "sm_70" in db.torch_release("2.14.1").variants["cu126"].arch_list


def test_variant_order_is_cpu_then_ascending_cuda(db):
    for rel in db.torch_releases:
        names = list(rel.variants)
        assert names[0] == "cpu", rel.version
        cudas = [Version(v.cuda) for v in rel.variants.values() if v.cuda]
        assert cudas == sorted(cudas), rel.version


# ---- integrity ---------------------------------------------------------------------------------


def test_every_variant_cuda_is_a_known_toolkit_and_arch_lists_parse(db):
    for rel in db.torch_releases:
        assert rel.pypi_variant in rel.variants, rel.version
        assert rel.python and rel.source
        for v in rel.variants.values():
            assert v.source, (rel.version, v.name)
            for a in v.arch_list:
                parse_arch(a)
            if v.cuda is None:
                assert v.name == "cpu"
                continue
            tk = db.cuda_toolkit(v.cuda)
            assert tk is not None, (rel.version, v.name)
            assert v.name == "cu" + v.cuda.replace(".", "")
            assert v.arch_list, (rel.version, v.name)
            # nvcc of that CUDA can build every SASS entry of the list
            nvcc = {a.replace("compute_", "sm_") for a in tk.archs}
            for a in v.arch_list:
                assert a.replace("compute_", "sm_") in nvcc, (rel.version, v.name, a)
            Version(v.cudnn)
            Version(v.nccl)


def test_toolkits_cover_11_0_to_13_x_with_parseable_floors(db):
    versions = [t.version for t in db.cuda_toolkits]
    for v in ["11.0", "11.8", "12.0", "12.1", "12.4", "12.6", "12.8", "12.9", "13.0", "13.2"]:
        assert v in versions
    assert "12.7" not in versions  # there was no CUDA 12.7
    for t in db.cuda_toolkits:
        assert t.source
        strict, compat = Version(t.driver_strict), Version(t.driver_compat)
        assert compat <= strict, t.version
        for a in t.archs:
            parse_arch(a)


@pytest.mark.parametrize(
    "cuda, strict, compat",
    [
        ("11.8", "520.61.05", "450.80.02"),
        ("12.1", "530.30.02", "525.60.13"),
        ("12.8", "570.26", "525.60.13"),
        ("13.0", "580.65.06", "580.65.06"),
        ("13.2", "595.45.04", "580.65.06"),
    ],
)
def test_driver_floors(db, cuda, strict, compat):
    tk = db.cuda_toolkit(cuda)
    assert (tk.driver_strict, tk.driver_compat) == (strict, compat)
    assert db.cuda_toolkit(cuda + ".1") is tk


def test_nvcc_arch_ranges(db):
    assert (
        "sm_90a" in db.cuda_toolkit("12.0").archs and "sm_37" not in db.cuda_toolkit("12.0").archs
    )
    assert (
        "sm_100f" in db.cuda_toolkit("12.9").archs
        and "sm_100f" not in db.cuda_toolkit("12.8").archs
    )
    assert "sm_70" not in db.cuda_toolkit("13.0").archs and "sm_75" in db.cuda_toolkit("13.0").archs
    assert "sm_120f" in db.cuda_toolkit("13.0").archs


def test_every_gpu_row_is_complete(db):
    names = [g.name for g in db.gpus]
    assert len(names) == len(set(names))
    for g in db.gpus:
        assert g.source
        parse_cc(g.cc)
        # a notebook GPU's memory is the laptop maker's choice where NVIDIA sells more than one size, and a
        # low-end GeForce board's its board maker's ("memory varies by board" in its source)
        notebook = re.search(r"Laptop GPU|Max-Q|\d+MX?$|\bMX\d+|Quadro [KMPT]\d+M?$", g.name)
        assert g.memory_gib and g.memory_gib > 0 or notebook or "varies" in g.source, g.name
    for required in [
        "K80",
        "P100",
        "GTX 1080 Ti",
        "V100",
        "T4",
        "A10",
        "A30",
        "A40",
        "A100 40GB",
        "A100 80GB",
        "L4",
        "L40S",
        "H100 PCIe",
        "H100 SXM",
        "H100 NVL",
        "H200",
        "GH200",
        "B200",
        "B300",
        "GB200",
        "RTX 3090",
        "RTX 4090",
        "RTX 5090",
        "RTX A6000",
        "RTX 6000 Ada",
        "Jetson AGX Orin",
    ]:
        assert load_db().find_gpu(required) is not None, required


# ---- lookups -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, name, cc",
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "9.0"),
        ("H100", "NVIDIA H100 80GB HBM3", "9.0"),
        ("h100 sxm", "NVIDIA H100 80GB HBM3", "9.0"),
        ("NVIDIA H200", "NVIDIA H200", "9.0"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "8.0"),
        ("A100 80GB", "NVIDIA A100-SXM4-80GB", "8.0"),
        ("a100-80gb", "NVIDIA A100-SXM4-80GB", "8.0"),
        ("A100 40GB", "NVIDIA A100-SXM4-40GB", "8.0"),
        ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB", "7.0"),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", "8.9"),
        ("GeForce RTX 4090", "NVIDIA GeForce RTX 4090", "8.9"),
        ("RTX 5090", "NVIDIA GeForce RTX 5090", "12.0"),
        ("B300", "NVIDIA B300 SXM6 AC", "10.3"),
        ("B200", "NVIDIA B200", "10.0"),
        ("Jetson AGX Orin", "Orin (nvgpu)", "8.7"),
        ("NVIDIA L4", "NVIDIA L4", "8.9"),
        ("T4", "Tesla T4", "7.5"),
        ("NVIDIA T4", "Tesla T4", "7.5"),
    ],
)
def test_find_gpu(db, query, name, cc):
    g = db.find_gpu(query)
    assert g is not None, query
    assert (g.name, g.cc) == (name, cc)


@pytest.mark.parametrize(
    "query, name, cc",
    [
        ("sm_90", "sm_90", "9.0"),
        ("9.0", "sm_90", "9.0"),
        ("sm_100", "sm_100", "10.0"),
        ("sm_120", "sm_120", "12.0"),
        ("10.3", "sm_103", "10.3"),
        ("SM_86", "sm_86", "8.6"),
    ],
)
def test_find_gpu_by_capability(db, query, name, cc):
    g = db.find_gpu(query)
    assert (g.name, g.cc) == (name, cc)
    assert g.memory_gib is None and "synthetic" in g.source


def test_unknown_gpu_and_did_you_mean(db):
    assert db.find_gpu("H1000") is None
    assert db.find_gpu("RTX 9999 Ti") is None
    assert "H100" in db.suggest_gpus("H1000")
    assert "RTX 4090" in db.suggest_gpus("RTX 4900")
    assert len(db.suggest_gpus("A100", n=2)) <= 2


def test_h200_rates(db):
    g = db.find_gpu("H200")
    assert (g.memory_gib, g.bf16_tflops, g.tf32_tflops, g.mem_bw_gbs) == (141, 989, 494, 4800)


def test_torch_release_lookup(db):
    assert db.torch_release("2.9.1+cu128").version == "2.9.1"
    assert db.torch_release("1.0.0") is None
    assert db.torch_release("not a version") is None
    assert db.cuda_toolkit("12.7") is None


def test_to_json_round_trips_through_json(db):
    data = json.loads(json.dumps(db.to_json()))
    assert data["db_version"] == db.version
    assert len(data["torch_releases"]) == len(db.torch_releases)
    assert data["torch_releases"][-1]["variants"]["cu132"]["cuda"] == "13.2"
    assert {"name", "cc", "source"} <= set(data["gpus"][0])


def test_load_is_cached_and_lazy():
    import subprocess
    import sys

    assert load_db() is load_db()
    # importing the package reads no data (checked in a fresh interpreter)
    code = (
        "import envspec.compat as c, envspec.compat.load as l; "
        "assert l._load_cached.cache_info().currsize == 0; c.load_db(); "
        "assert l._load_cached.cache_info().currsize == 1"
    )
    src = str(Path(__file__).parents[2] / "src")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": src})


# ---- loader errors -----------------------------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(DATA_DIR, d)
    return d


def test_loads_from_a_directory_or_its_manifest(tmp_path):
    d = _copy(tmp_path)
    assert load_db(d).version == load_db(d / "db.toml").version == "2026.11.30"


def test_unknown_format_is_rejected(tmp_path):
    d = _copy(tmp_path)
    (d / "gpus.toml").write_text(
        (d / "gpus.toml").read_text().replace("format = 2", "format = 3", 1)
    )
    with pytest.raises(CompatDBError) as exc:
        load_db(d)
    assert "gpus.toml: format: unknown format 3; this envspec reads format 2" in exc.value.message
    assert exc.value.exit_code == 2 and exc.value.hint


def test_every_bad_row_is_reported_with_file_and_row(tmp_path):
    d = _copy(tmp_path)
    g = (d / "gpus.toml").read_text()
    k80 = g.index('name = "Tesla K80"')
    g = g[:k80] + g[k80:].replace('cc = "3.7"', 'cc = "three"', 1)
    rows = [r["name"] for r in tomllib.loads(g)["gpu"]]
    g = g.replace(
        'source = "https://www.nvidia.com/en-us/data-center/l4/ (BF16 242 and TF32 120 with sparsity)"',
        'source = " "',
        1,
    )
    (d / "gpus.toml").write_text(g)
    c = (d / "cuda.toml").read_text().replace('driver_strict = "570.26"', 'driver_strict = "r570"')
    (d / "cuda.toml").write_text(c)
    t = (d / "torch_variants.toml").read_text().replace('"sm_37", "sm_50"', '"sm37", "sm_50"', 1)
    (d / "torch_variants.toml").write_text(t)
    with pytest.raises(CompatDBError) as exc:
        load_db(d)
    msg = exc.value.message
    assert (
        "7 problems" in msg
    )  # the four above, and the three cu128 rows whose CUDA 12.8 row is now invalid
    assert f"gpus.toml: gpu[{rows.index('Tesla K80')}] ('Tesla K80').cc: 'three'" in msg
    assert f"gpus.toml: gpu[{rows.index('NVIDIA L4')}] ('NVIDIA L4').source: empty" in msg
    assert "cuda.toml: toolkit[" in msg and "driver_strict: 'r570' is not a version" in msg
    assert "torch_variants.toml: build[1] ('cu117').arch_list[0]" in msg


def test_variant_with_unknown_cuda_is_rejected(tmp_path):
    d = _copy(tmp_path)
    c = (d / "cuda.toml").read_text()
    start = c.index('[[toolkit]]\nversion = "12.9"')
    end = c.index("[[toolkit]]", start + 5)
    (d / "cuda.toml").write_text(c[:start] + c[end:])
    with pytest.raises(CompatDBError, match="CUDA 12.9 is not in cuda.toml"):
        load_db(d)


def test_overlapping_rows_are_rejected(tmp_path):
    d = _copy(tmp_path)
    t = (
        (d / "torch_variants.toml")
        .read_text()
        .replace(
            'torch = ">=2.0,<2.1"\nvariant = "cu117"', 'torch = ">=2.0,<2.2"\nvariant = "cu118"'
        )
    )
    (d / "torch_variants.toml").write_text(t.replace('cuda = "11.7"', 'cuda = "11.8"', 1))
    with pytest.raises(CompatDBError, match="overlaps another cu118 row"):
        load_db(d)


def test_missing_file_and_bad_toml(tmp_path):
    d = _copy(tmp_path)
    (d / "cuda.toml").unlink()
    (d / "gpus.toml").write_text("format = 2\n[[gpu]\n")
    with pytest.raises(CompatDBError) as exc:
        load_db(d)
    assert (
        "cuda.toml: missing" in exc.value.message
        and "gpus.toml: not valid TOML" in exc.value.message
    )


def test_a_release_newer_than_the_curated_rows_gets_pypi_variant_from_metadata(tmp_path):
    d = _copy(tmp_path)
    p = (d / "torch_pypi.toml").read_text()
    p += (
        '\n[[release]]\nversion = "2.16.0"\npython = ["3.11", "3.12"]\npython_freethreaded = []\n'
        'pypi_variant = "cu130"\ncuda = "13.0"\ncuda_pin = "13.0.3"\ncudnn = "9.30.0.1"\nnccl = "2.31.1"\n'
        'wheel = "x"\nsource = "pypi-metadata: test"\n'
    )
    (d / "torch_pypi.toml").write_text(p)
    t = (
        (d / "torch_variants.toml")
        .read_text()
        .replace('torch = ">=2.15"\nvariant = "cu130"', 'torch = ">=2.15,<2.16"\nvariant = "cu130"')
    )
    (d / "torch_variants.toml").write_text(t)
    rel = load_db(d).torch_release("2.16.0")
    v = rel.variants["cu130"]
    assert (v.cudnn, v.nccl, v.index) == ("9.30.0.1", "2.31.1", "https://pypi.org/simple")
    assert v.arch_list == load_db(d).torch_release("2.15.0").variants["cu130"].arch_list
    assert "assumed unchanged" in v.source
    assert set(rel.variants) == {"cpu", "cu130", "cu132"}  # open-ended rows carry forward


def test_gpus_take_their_architecture_and_driver_branches_from_their_family():
    db = load_db()
    by_cc = {f.cc: f for f in db.families}
    assert len(by_cc) == len(db.families)
    for g in db.gpus:
        f = by_cc[g.cc]
        assert (g.architecture, g.min_driver, g.max_driver) == (
            f.architecture,
            f.min_driver,
            f.max_driver,
        ), g.name
        assert g.line in ("datacenter", "workstation", "geforce", "jetson"), g.name
    assert (
        db.find_gpu("V100").architecture == "Volta" and db.find_gpu("H100").architecture == "Hopper"
    )
    assert [f.cc for f in db.families] == sorted(by_cc, key=lambda c: tuple(map(int, c.split("."))))


def test_bad_family_rows_are_each_reported(tmp_path):
    d = _copy(tmp_path)
    g = (d / "gpus.toml").read_text()
    # the Jetson Orin family loses its reason for having no driver branch; the Volta one is written twice;
    # a GPU names a capability no family has, and a product line that does not exist
    orin = g.index('[[family]]\ncc = "8.7"')
    g = g[:orin] + re.sub(r'driver_note = "[^"]*"\n', "", g[orin:], count=1)
    volta = g.index('[[family]]\ncc = "7.0"')
    g = g[:volta] + g[volta : g.index("[[family]]", volta + 5)] + g[volta:]
    t4 = g.index('name = "Tesla T4"')
    g = g[:t4] + g[t4:].replace('cc = "7.5"', 'cc = "7.6"', 1)
    l4 = g.index('name = "NVIDIA L4"')
    g = g[:l4] + g[l4:].replace('line = "datacenter"', 'line = "server"', 1)
    (d / "gpus.toml").write_text(g)
    with pytest.raises(CompatDBError) as exc:
        load_db(d)
    msg = exc.value.message
    assert "('8.7').driver_note: empty: a family without min_driver says why" in msg
    assert "('7.0').cc: '7.0': a second family for this compute capability" in msg
    assert "('Tesla T4').cc: '7.6': no [[family]] row has this compute capability" in msg
    assert "('NVIDIA L4').line: 'server': one of datacenter, workstation, geforce, jetson" in msg
