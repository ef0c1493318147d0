"""The derivation of a source build (src/envspec/wheels/sdist.py), offline: what names the output,
and what an sdist's build system is."""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
from pathlib import Path

import pytest

from envspec.errors import SourceBuildError
from envspec.wheels import sdist as sd

BASE = sd.Derivation(
    sd.Pin("pkg", "1.0", "pkg-1.0.tar.gz", "a" * 64),
    (
        sd.Pin("setuptools", "80.9.0", "setuptools-80.9.0-py3-none-any.whl", "b" * 64),
        sd.Pin("wheel", "0.45.1", "wheel-0.45.1-py3-none-any.whl", "c" * 64),
    ),
    "3.11",
    "manylinux_2_36_x86_64",
    compiler="gcc 12.2.0",
)


def _tar(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_every_input_names_the_output_and_nothing_else_does():
    key = BASE.key
    assert key.startswith("sha256:") and len(key) == 71
    reordered = dataclasses.replace(BASE, build_requires=tuple(reversed(BASE.build_requires)))
    assert reordered.key == key  # the order requirements are listed in is not an input
    for change in (
        {"sdist": dataclasses.replace(BASE.sdist, sha256="d" * 64)},
        {"build_requires": BASE.build_requires[:1]},
        {"python": "3.12"},
        {"platform": "manylinux_2_36_aarch64"},
        {"compiler": "gcc 14.2.0"},
        {"epoch": 1},
        {"extra": (("torch", "e" * 64),)},
    ):
        assert dataclasses.replace(BASE, **change).key != key, change


def test_the_build_system_comes_from_pyproject_or_is_setuptools_legacy(tmp_path):
    modern = _tar(
        tmp_path / "a-1.tar.gz",
        {
            "a-1/pyproject.toml": '[build-system]\nrequires = ["hatchling>=1.2"]\n'
            'build-backend = "hatchling.build"\n',
            "a-1/PKG-INFO": "",
        },
    )
    assert sd.build_system(modern) == (["hatchling>=1.2"], "hatchling.build", ())
    legacy = _tar(tmp_path / "b-1.tar.gz", {"b-1/setup.py": "", "b-1/PKG-INFO": ""})
    assert sd.build_system(legacy) == (
        ["setuptools>=40.8.0"],
        "setuptools.build_meta:__legacy__",
        (),
    )
    no_table = _tar(
        tmp_path / "c-1.tar.gz", {"c-1/pyproject.toml": "[tool.black]\n", "c-1/setup.py": ""}
    )
    assert sd.build_system(no_table)[1] == "setuptools.build_meta:__legacy__"
    # a legacy setup.py's unconditional imports of what it builds against (flash-attn's): build inputs;
    # an import in a try (deepspeed's optional torch), a local module or the standard library: not
    imports = _tar(
        tmp_path / "f-1.tar.gz",
        {
            "f-1/setup.py": (
                "import os, sys\nfrom packaging.version import Version\nimport torch.utils.cpp_extension\n"
                "from torch.utils import cpp_extension\nfrom wheel.bdist_wheel import bdist_wheel\nimport op_builder\n"
                "try:\n    import numpy\nexcept ImportError:\n    pass\n"
            ),
            "f-1/PKG-INFO": "",
        },
    )
    assert sd.build_system(imports) == (
        ["setuptools>=40.8.0", "packaging", "torch", "wheel"],
        "setuptools.build_meta:__legacy__",
        ("packaging", "torch", "wheel"),
    )
    broken = _tar(
        tmp_path / "g-1.tar.gz",
        {"g-1/setup.py": "import torch\nthis is not python(", "g-1/PKG-INFO": ""},
    )
    assert sd.build_system(broken)[0] == ["setuptools>=40.8.0"]
    declared = _tar(
        tmp_path / "h-1.tar.gz",
        {
            "h-1/pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n',
            "h-1/setup.py": "import torch\n",
        },
    )
    # mamba-ssm's way: a [build-system] that leaves torch out on purpose ("install torch first, then
    # --no-build-isolation"); its setup.py imports it: given, and said to be undeclared
    assert sd.build_system(declared) == (
        ["setuptools", "torch"],
        sd.LEGACY_BACKEND,
        ("torch",),
    )
    spelled = _tar(
        tmp_path / "i-1.tar.gz",
        {
            "i-1/pyproject.toml": '[build-system]\nrequires = ["setuptools", "Torch>=2", "wheel"]\n'
            'build-backend = "setuptools.build_meta"\n',
            "i-1/setup.py": "import torch\nimport wheel\nimport numpy\n",
        },
    )
    assert sd.build_system(spelled) == (
        ["setuptools", "Torch>=2", "wheel", "numpy"],
        "setuptools.build_meta",
        ("numpy",),
    )
    other = _tar(
        tmp_path / "j-1.tar.gz",
        {
            "j-1/pyproject.toml": '[build-system]\nrequires = ["scikit-build-core"]\n'
            'build-backend = "scikit_build_core.build"\n',
            "j-1/setup.py": "import torch\n",
        },
    )
    assert sd.build_system(other).undeclared == ()  # not setuptools: its setup.py is not run
    two = _tar(tmp_path / "d-1.tar.gz", {"d-1/setup.py": "", "e-1/setup.py": ""})
    with pytest.raises(SourceBuildError, match="one top folder"):
        sd.build_system(two)


def test_a_locked_sdist_gets_its_build_inputs_pinned_and_its_key(tmp_path, monkeypatch):
    """lock: an sdist the resolution takes is fetched into the cache by sha256, its [build-system] is
    read and pinned as wheels (the lock's own version where the lock pins that package too), and its
    derivation key computed; the lock records them (revision 4) and reads them back; the plan
    builds it."""
    from envspec import lock as lockmod
    from envspec.cache.store import Cache
    from envspec.compat import load_db
    from envspec.resolve import Resolution, choose, resolve_python
    from envspec.spec import load_spec
    from tests.unit.test_resolve_packages import CASES, make_sdist, make_wheel, offline_sources

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = CASES / "newest-release-sdist-only-is-built"
    sources = offline_sources(case, tmp_path)
    index = tmp_path / "index"
    make_wheel(index, "setuptools", "80.9.0", [])
    make_wheel(index, "setuptools", "81.0.0", [])
    make_sdist(index, "helper", "1.0", [])  # wheels only for the build: an sdist is no build input
    spec_path = tmp_path / "spec.toml"  # its index is the case's wheelhouse, as the sources say
    spec_path.write_text(
        (case / "spec.toml").read_text() + f'\n[sources]\nindex = "{sources.index}"\n'
    )
    spec = load_spec(spec_path)
    choice = choose(spec, load_db())
    wheels = resolve_python(choice, sources, workdir=tmp_path / "w")
    res = Resolution(choice=choice, wheels=wheels, debs=[], deb_requested=[])
    with pytest.raises(ValueError, match="an sdist without its build inputs"):
        lockmod.from_resolution(res, spec_path="spec.toml", db_version="t")
    cache = Cache(tmp_path / "cache")
    done = sd.pin_inputs(res, sources, cache, workdir=tmp_path / "w")
    ds = next(w for w in done.wheels if w.name == "deepspeed")
    src = ds.source
    assert (src.backend, src.requires) == ("setuptools.build_meta:__legacy__", ("setuptools",))
    assert [(b.name, b.version) for b in src.build] == [("setuptools", "81.0.0")] and src.build[
        0
    ].filename.endswith(".whl")
    assert (src.python, src.compiler) == (
        "3.11",
        "",
    )  # no Debian base: the spec's Python, no compiler pinned
    assert (
        src.key
        == sd.derivation(
            ds, list(src.build), python="3.11", platform=choice.platform_tag, compiler=""
        ).key
    )
    # a package the lock pins too is built with the lock's version of it
    pinned = dataclasses.replace(
        res,
        wheels=res.wheels
        + [
            dataclasses.replace(
                src.build[0],
                version="80.9.0",
                filename="setuptools-80.9.0-py3-none-any.whl",
                group="deps",
            )
        ],
    )
    again = next(
        w
        for w in sd.pin_inputs(pinned, sources, cache, workdir=tmp_path / "w2").wheels
        if w.name == "deepspeed"
    )
    assert [(b.name, b.version) for b in again.source.build] == [
        ("setuptools", "80.9.0")
    ] and again.source.key != src.key

    lock = lockmod.from_resolution(done, spec_path="spec.toml", db_version="t")
    assert lock.revision == 4
    text = lockmod.dumps(lock)
    assert "[wheels.source]" in text and "[[wheels.source.build]]" in text
    back = lockmod.loads(text)
    pin = next(w for w in back.wheels if w.name == "deepspeed")
    assert (
        pin.built
        and pin.source.key == src.key
        and pin.source.build[0].sha256 == src.build[0].sha256
    )
    assert not next(w for w in back.wheels if w.name == "torch").built


def test_compiler_of_a_lock_is_its_debian_gcc():
    from types import SimpleNamespace as NS

    debs = [
        NS(name="gcc", version="4:12.2.0-3"),
        NS(name="gcc-12", version="12.2.0-14+deb12u1"),
        NS(name="libgcc-12-dev", version="12.2.0-14+deb12u1"),
    ]
    assert sd.compiler_of(debs) == "gcc-12 12.2.0-14+deb12u1"
    assert sd.compiler_of([NS(name="bash", version="5.2")]) == ""


@pytest.mark.parametrize(
    ("requires", "setup", "undeclared"),
    [
        ('["setuptools", "torch"]', "", ()),
        # mamba-ssm's way: torch left out of [build-system] on purpose, imported by setup.py: the
        # lock's torch is given all the same (match-runtime), and the lock says so (issue 58)
        ('["setuptools"]', "import torch\nfrom torch.utils import cpp_extension\n", ("torch",)),
    ],
)
def test_a_cuda_extension_gets_the_locks_cuda_toolkit_and_arch_list(
    tmp_path, monkeypatch, requires, setup, undeclared
):
    """An sdist that builds against a CUDA torch (issue 38): NVIDIA's toolkit wheels for the lock's
    CUDA (never the system's nvcc) pinned beside its build requirements, and the lock's arch list,
    both inputs of its key; recorded in the lock and read back."""
    from envspec import lock as lockmod
    from envspec.cache.store import Cache
    from envspec.compat import load_db
    from envspec.resolve import Resolution, choose, resolve_python
    from envspec.spec import load_spec
    from tests.unit.test_resolve_packages import CASES, make_wheel, offline_sources

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = CASES / "newest-release-sdist-only-is-built"
    sources = offline_sources(case, tmp_path)
    index = tmp_path / "index"
    _tar(
        index / "cuext-1.0.tar.gz",
        {
            "cuext-1.0/PKG-INFO": "Metadata-Version: 2.2\nName: cuext\nVersion: 1.0\nRequires-Dist: torch\n",
            "cuext-1.0/pyproject.toml": f"[build-system]\nrequires = {requires}\n"
            'build-backend = "setuptools.build_meta"\n',
            "cuext-1.0/setup.py": setup,
        },
    )
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        (case / "spec.toml").read_text().replace('["deepspeed"]', '["cuext"]')
        + f'\n[sources]\nindex = "{sources.index}"\n'
    )
    choice = choose(load_spec(spec_path), load_db())
    cuda = choice.torch.variant.cuda
    major, minor = cuda.split(".")
    make_wheel(index, "ninja", "1.13.0", [])  # torch's cpp_extension compiles in parallel with it
    for name in sd.TOOLKIT_WHEELS[major]:
        make_wheel(index, name, f"{major}.{minor}.7", [])
        make_wheel(index, name, f"{major}.{int(minor) + 1}.1", [])  # a newer CUDA: not the lock's
    wheels = resolve_python(choice, sources, workdir=tmp_path / "w")
    res = Resolution(choice=choice, wheels=wheels, debs=[], deb_requested=[])
    done = sd.pin_inputs(res, sources, Cache(tmp_path / "cache"), workdir=tmp_path / "w")
    src = next(w for w in done.wheels if w.name == "cuext").source
    assert sorted(b.name for b in src.toolkit) == sorted(sd.TOOLKIT_WHEELS[major])
    assert {b.version for b in src.toolkit} == {
        f"{major}.{minor}.7"
    }  # the lock's CUDA, not the newest
    assert (
        [b.name for b in src.build] == ["ninja", "setuptools", "torch"]
        and src.requires[-1] == "ninja"
        and src.arch_list
        == tuple(f"sm_{cc.replace('.', '')}" for cc in choice.compute_capabilities)
        == ("sm_90",)
    )
    assert (
        src.key
        != sd.derivation(
            next(w for w in done.wheels if w.name == "cuext"),
            list(src.build),
            python=src.python,
            platform=choice.platform_tag,
            compiler="",
        ).key
    )
    lock = lockmod.loads(
        lockmod.dumps(lockmod.from_resolution(done, spec_path="spec.toml", db_version="t"))
    )
    pin = next(w for w in lock.wheels if w.name == "cuext")
    assert [b.name for b in pin.source.toolkit] == [
        b.name for b in src.toolkit
    ] and pin.source.arch_list == list(src.arch_list)
    assert src.undeclared == undeclared and pin.source.undeclared == (list(undeclared) or None)
    assert (
        sd.derivation_of(pin, lock.platform).key == src.key
    )  # the build computes the key the lock recorded
    # a CUDA with no compiler on the indexes (CUDA 12: nvidia-cuda-nvcc-cu12 has ptxas alone): said at lock time
    from envspec.errors import ResolutionImpossible

    monkeypatch.setattr(sd, "TOOLKIT_WHEELS", {})
    with pytest.raises(ResolutionImpossible) as e:
        sd.pin_inputs(res, sources, Cache(tmp_path / "cache"), workdir=tmp_path / "w3")
    assert (
        e.value.reference == "no-cuda-compiler"
        and e.value.exit_code == 2
        and "CUDA 13" in e.value.hint
    )


def test_the_toolkit_wheels_make_one_cuda_home_and_the_arch_list_reads_as_torch_wants(tmp_path):
    import zipfile

    def wheel(name: str, files: dict[str, bytes]) -> Path:
        path = tmp_path / f"{name}-13.0.1-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            for n, data in files.items():
                info = zipfile.ZipInfo(n)
                info.external_attr = (0o755 if "/bin/" in n else 0o644) << 16
                z.writestr(info, data)
            z.writestr(f"{name}-13.0.1.dist-info/METADATA", "Name: x\n")
        return path

    nvcc = wheel(
        "nvidia_cuda_nvcc",
        {"nvidia/cu13/bin/nvcc": b"#!/bin/sh\n", "nvidia/cu13/include/crt/host_config.h": b""},
    )
    rt = wheel(
        "nvidia_cuda_runtime",
        {"nvidia/cu13/lib/libcudart.so.13": b"\x7fELF", "nvidia/cu13/include/cuda_runtime.h": b""},
    )
    cu12 = wheel("nvidia_cuda_cccl_cu12", {"nvidia/cuda_cccl/include/cub/cub.cuh": b""})
    home = sd.cuda_home([nvcc, rt, cu12], tmp_path / "cuda")
    assert os.access(home / "bin" / "nvcc", os.X_OK)
    assert (home / "include" / "cuda_runtime.h").is_file() and (
        home / "include" / "cub" / "cub.cuh"
    ).is_file()
    assert (
        os.readlink(home / "lib" / "libcudart.so") == "libcudart.so.13"
        and (home / "lib64" / "libcudart.so.13").is_file()
    )
    assert not any(p.name.endswith(".dist-info") for p in home.iterdir())
    assert (
        sd.torch_arch_list(["sm_80", "sm_90", "sm_100", "sm_120", "compute_120"])
        == "8.0;9.0;10.0;12.0+PTX"
    )
    assert sd.torch_arch_list(["sm_90a", "sm_100a"]) == "9.0a;10.0a"
    assert sd.toolkit_requirements("13.0") == [f"{n}==13.0.*" for n in sd.TOOLKIT_WHEELS["13"]]
    # issue 58, point 2: the torch build's own pins hold (torch 2.15.0 cu132 brings cccl 13.3.5.0.6
    # and the runtime 13.2), where `==13.2.*` for each conflicted with them
    assert sd.toolkit_requirements(
        "13.2", {"nvidia-cuda-cccl": "13.3.5.0.6", "nvidia-cuda-runtime": "13.2.51"}
    ) == [
        "nvidia-cuda-nvcc==13.2.*",
        "nvidia-cuda-crt==13.2.*",
        "nvidia-nvvm==13.2.*",
        "nvidia-cuda-cccl",
        "nvidia-cuda-runtime",
    ]
    assert sd.toolkit_requirements("13.0", {"nvidia-cuda-runtime": "13.1.80"})[0] == (
        "nvidia-cuda-nvcc==13.1.*"
    )
    assert (
        sd.toolkit_requirements("12.8") == [] and sd.toolkit_requirements("11.8") == []
    )  # no nvcc wheel
    assert sd.memory_jobs() >= 1 and sd.memory_jobs(per_job=1 << 60) == 1
    plain = BASE.key
    assert (
        dataclasses.replace(BASE, toolkit=(), arch_list=()).key == plain
    )  # no CUDA: keys as before
    assert dataclasses.replace(BASE, arch_list=("sm_90",)).key != plain
    assert (
        dataclasses.replace(BASE, arch_list=("sm_90",)).key
        != dataclasses.replace(BASE, arch_list=("sm_100",)).key
    )


def test_a_builds_compile_steps_are_reported_as_its_log_shows_them(tmp_path):
    """Progress of a long compile (issue 38): each compiler run, or ninja's [n/m], as the log grows."""
    import subprocess
    import sys

    text = (
        "x86_64-linux-gnu-g++ -DNDEBUG -fPIC -I/a -c torchsort/isotonic_cpu.cpp -o build/x.o\n"
        "/tmp/envspec-sdist/1d61/cuda/bin/nvcc -I/x -c torchsort/isotonic_cuda.cu -o b/i.o -gencode=arch=compute_90,code=sm_90\n"
        "[3/12] /usr/bin/nvcc flash_fwd_hdim128.cu\n"
        "x86_64-linux-gnu-g++ -shared build/x.o -o y.so\n"
        "writing build/lib/torchsort/__init__.py\n"
    )
    assert sd.compile_steps(text) == [
        "x86_64-linux-gnu-g++ isotonic_cpu.cpp",
        "nvcc isotonic_cuda.cu",
        "[3/12]",
    ]
    log = tmp_path / "build.log"
    log.write_text("# header written before the build\n-c not_a_step.c by the header\n")
    seen: list[str] = []
    script = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print(f'gcc -O2 -c src/m{i}.c -o m{i}.o', flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    with open(log, "a") as f:
        start = f.tell()
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=f, stderr=subprocess.STDOUT)
        sd._follow(proc, log, seen.append, every=0.05, start=start)
    assert proc.returncode == 0 and seen == ["gcc m0.c", "gcc m1.c", "gcc m2.c"]


def test_a_cuda_extensions_own_settings_follow_the_lock_and_name_the_wheel():
    env = sd.package_env("flash-attn", ["sm_90", "sm_100"])
    assert env == {"FLASH_ATTN_CUDA_ARCHS": "90;100", "FLASH_ATTENTION_FORCE_BUILD": "TRUE"}
    assert sd.package_env("torchsort", ["sm_90"]) == {}
    w = dataclasses.replace(BASE.sdist)
    from types import SimpleNamespace as NS

    pin = NS(name=w.name, version=w.version, filename=w.filename, sha256=w.sha256)
    a = sd.derivation(
        pin,
        [],
        python="3.11.2",
        platform="manylinux_2_36_x86_64",
        compiler="",
        arch_list=["sm_90"],
        env=env,
    )
    b = sd.derivation(
        pin, [], python="3.11.2", platform="manylinux_2_36_x86_64", compiler="", arch_list=["sm_90"]
    )
    assert a.key != b.key and ("env:FLASH_ATTN_CUDA_ARCHS", "90;100") in a.extra


def test_a_failed_compile_shows_its_first_errors_and_its_end():
    log = "\n".join(
        [
            "[1/73] nvcc a.cu",
            "FAILED: [code=255] build/a.o",
            'intrusive_ptr.h(775): error: namespace "std" has no member "strong_ordering"',
            *[f"ninja line {i}" for i in range(60)],
            "RuntimeError: Error compiling objects for extension",
        ]
    )
    out = sd.failure_excerpt(log, tail=5)
    assert out.splitlines()[:3] == [
        "first errors in the log:",
        "FAILED: [code=255] build/a.o",
        'intrusive_ptr.h(775): error: namespace "std" has no member "strong_ordering"',
    ]
    assert (
        out.endswith("RuntimeError: Error compiling objects for extension")
        and "ninja line 10" not in out
    )
    assert sd.failure_excerpt("a\nb\nc", tail=5) == "a\nb\nc"  # nothing more to show than the end


def test_a_source_builds_time_is_estimated_from_the_caches_history_else_its_sources(tmp_path):
    """Issue 58, point 6: the cost shown before it is paid."""
    import io
    import json
    import tarfile

    from envspec.lock import BuildInput, SourceBuild, Wheel
    from envspec.wheels import cost

    def pin(name: str, archs: list[str]) -> Wheel:
        src = SourceBuild(backend="b", requires=[], python="3.11", compiler="", key="k", build=[])
        toolkit = [
            BuildInput(
                name="nvidia-cuda-nvcc", version="13.0.88", filename="n.whl", index="i", sha256="1"
            )
        ]
        src = src.model_copy(update={"arch_list": archs, "toolkit": toolkit if archs else []})
        return Wheel(
            name=name,
            version="1.0",
            filename=f"{name}-1.0.tar.gz",
            index="i",
            sha256="0" * 64,
            size=1,
            group="team",
            direct=True,
            source=src,
        )

    tgz = tmp_path / "ext-1.0.tar.gz"
    with tarfile.open(tgz, "w:gz") as t:
        for n in ("ext-1.0/a.cu", "ext-1.0/b.cu", "ext-1.0/c.cpp", "ext-1.0/setup.py"):
            info = tarfile.TarInfo(n)
            t.addfile(info, io.BytesIO(b""))
    cache = tmp_path / "cache"
    e = cost.estimate(pin("ext", ["sm_90", "sm_100"]), cache, tgz, jobs=2)
    assert e is not None and e.seconds == (2 * cost.CUDA_SOURCE_S * 2 + cost.CXX_SOURCE_S) / 2
    assert "2 CUDA and 1 C/C++ sources for 2 GPU architecture(s)" in e.basis
    assert cost.estimate(pin("ext", []), cache, None, jobs=2) is None  # no sdist, no history
    # beside a CPU torch (no toolkit, torch-scatter's CPU build): its C/C++ sources alone
    e = cost.estimate(pin("ext", []), cache, tgz, jobs=2)
    assert (
        e is not None
        and e.seconds == cost.CXX_SOURCE_S / 2
        and e.basis == "its sdist's 1 C/C++ sources"
    )
    # a build on torch's headers (torch among its inputs: torch-scatter): its C++ at that rate
    on_torch = pin("ext", [])
    on_torch.source.build.append(
        BuildInput(name="torch", version="2.13.0+cpu", filename="t.whl", index="i", sha256="2")
    )
    e = cost.estimate(on_torch, cache, tgz, jobs=2)
    assert e is not None and e.seconds == cost.TORCH_CXX_SOURCE_S / 2
    assert e.basis == "its sdist's 1 C/C++ sources on torch's headers"
    assert cost.say_estimate(None).startswith("build time not known")
    # a build this cache recorded wins: 600 s with 1 job -> 300 s with 2
    entry = cache / "built" / "abc"
    entry.mkdir(parents=True)
    (entry / "wheel.json").write_text(
        json.dumps(
            {
                "filename": "x.whl",
                "sha256": "1",
                "key": "k",
                "sdist": ["ext", "0.9", "2"],
                "seconds": 600.0,
                "jobs": 1,
            }
        )
    )
    e = cost.estimate(pin("ext", ["sm_90"]), cache, tgz, jobs=2)
    assert e is not None and e.seconds == 300 and "ext 0.9, 600 s with 1 jobs" in e.basis
    assert cost.say_estimate(e) == f"about 5 min here (from {e.basis})"
