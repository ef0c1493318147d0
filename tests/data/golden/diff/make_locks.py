"""Writes old.lock and new.lock: two small hand-written locks in the format of docs/lockfile.md.

Run from the repository root: ``python tests/data/golden/diff/make_locks.py``. The values are
made up but shaped like real ones (hashes are sha256 of the file name); the point is a review-
sized diff: a torch upgrade across CUDA variants, a raised driver floor, arch list changes, wheels
and debs added, removed, upgraded, downgraded and rebuilt.
"""

import hashlib
from pathlib import Path

from envspec.lock import Lockfile, dumps

HERE = Path(__file__).resolve().parent


def h(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def wheel(name, version, group, size, *, tag="py3-none-any", direct=False, salt=""):
    fn = f"{name.replace('-', '_')}-{version}-{tag}.whl"
    return {
        "name": name,
        "version": version,
        "filename": fn,
        "index": "https://pypi.org/simple",
        "sha256": h(fn + salt),
        "size": size,
        "group": group,
        "direct": direct,
    }


def deb(name, version, size, suite="bookworm"):
    fn = f"pool/main/{name[0]}/{name}/{name}_{version.split(':')[-1]}_amd64.deb"
    return {
        "name": name,
        "version": version,
        "architecture": "amd64",
        "filename": fn,
        "size": size,
        "sha256": h(fn),
        "suite": suite,
    }


CP = "cp311-cp311-manylinux_2_28_x86_64"


def lock(*, torch, variant, cuda, cudnn, nccl, floor, archs, wheels, debs, env):
    return {
        "version": 1,
        "revision": 0,
        "meta": {
            "name": "h100-train",
            "spec": "specs/h100.toml",
            "spec_hash": "sha256:" + h(variant),
            "db_version": "2026.11.30",
            "envspec": "0.1.0",
        },
        "platform": {
            "python": "3.11",
            "python_full": "3.11.2",
            "python_tag": "cp311",
            "platform_tag": "manylinux_2_36_x86_64",
            "base": "debian:bookworm",
        },
        "hardware": {
            "gpus": ["NVIDIA H100 80GB HBM3"],
            "compute_capabilities": ["9.0"],
            "arch_list": archs,
            "driver_floor": floor,
            "driver_policy": "compat",
        },
        "torch": {
            "version": torch,
            "local": "",
            "variant": variant,
            "cuda": cuda,
            "cudnn": cudnn,
            "nccl": nccl,
            "index": "https://pypi.org/simple",
        },
        "runtime": {
            "tf32": True,
            "matmul_precision": "high",
            "shm_size": "16g",
            "env": env,
            "ulimits": {"memlock": -1, "stack": 67108864},
            "user": "envspec",
            "uid": 1000,
        },
        "services": {},
        "debian": {
            "suite": "bookworm",
            "mirror": "http://deb.debian.org/debian",
            "requested": ["bash", "ca-certificates", "python3", "python3-venv", "tini"],
            "packages": sorted(debs, key=lambda d: d["name"]),
        },
        "wheels": sorted(wheels, key=lambda w: w["name"]),
    }


old = lock(
    torch="2.13.0",
    variant="cu128",
    cuda="12.8",
    cudnn="9.10.2.21",
    nccl="2.27.3",
    floor="570.26",
    archs=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    env={"NCCL_DEBUG": "WARN"},
    wheels=[
        wheel("torch", "2.13.0", "torch", 900_000_000, tag=CP, direct=True),
        wheel("triton", "3.5.0", "torch", 160_000_000, tag=CP),
        wheel(
            "nvidia-cudnn-cu12",
            "9.10.2.21",
            "cuda",
            700_000_000,
            tag="py3-none-manylinux_2_27_x86_64",
        ),
        wheel(
            "nvidia-nccl-cu12", "2.27.3", "cuda", 320_000_000, tag="py3-none-manylinux_2_18_x86_64"
        ),
        wheel(
            "nvidia-cuda-runtime-cu12",
            "12.8.90",
            "cuda",
            950_000,
            tag="py3-none-manylinux_2_17_x86_64",
        ),
        wheel("filelock", "3.20.0", "torch", 16_000),
        wheel("numpy", "2.3.4", "deps", 16_600_000, tag=CP),
        wheel(
            "safetensors",
            "0.6.2",
            "team",
            480_000,
            tag="cp38-abi3-manylinux_2_17_x86_64",
            direct=True,
        ),
        wheel("tqdm", "4.67.1", "deps", 78_000),
        wheel("einops", "0.8.1", "team", 64_000, direct=True),
    ],
    debs=[
        deb("libc6", "2.36-9+deb12u13", 2_758_000),
        deb("python3.11", "3.11.2-6+deb12u6", 573_000),
        deb("tzdata", "2025b-0+deb12u1", 260_000, suite="bookworm-updates"),
        deb("tini", "0.19.0-1", 260_000),
        deb("libgdbm-compat4", "1.23-3", 47_000),
    ],
)

new = lock(
    torch="2.14.1",
    variant="cu130",
    cuda="13.0",
    cudnn="9.24.0.43",
    nccl="2.30.7",
    floor="580.65.06",
    archs=["sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
    env={"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
    wheels=[
        wheel("torch", "2.14.1", "torch", 910_000_000, tag=CP, direct=True),
        wheel("triton", "3.6.0", "torch", 165_000_000, tag=CP),
        wheel(
            "nvidia-cudnn-cu13",
            "9.24.0.43",
            "cuda",
            720_000_000,
            tag="py3-none-manylinux_2_27_x86_64",
        ),
        wheel(
            "nvidia-nccl-cu13", "2.30.7", "cuda", 330_000_000, tag="py3-none-manylinux_2_18_x86_64"
        ),
        wheel(
            "nvidia-cuda-runtime",
            "13.0.96",
            "cuda",
            1_000_000,
            tag="py3-none-manylinux_2_17_x86_64",
        ),
        wheel("filelock", "3.20.0", "torch", 16_000),
        wheel("numpy", "2.3.3", "deps", 16_500_000, tag=CP),
        wheel(
            "safetensors",
            "0.6.2",
            "team",
            480_000,
            tag="cp38-abi3-manylinux_2_17_x86_64",
            direct=True,
        ),
        wheel("tqdm", "4.67.1", "deps", 78_000, salt="re-uploaded"),
        wheel("einops", "0.8.1", "team", 64_000, direct=True),
        wheel("pyyaml", "6.0.3", "deps", 800_000, tag=CP),
    ],
    debs=[
        deb("libc6", "2.36-9+deb12u14", 2_758_872),
        deb("python3.11", "3.11.2-6+deb12u6", 573_000),
        deb("tzdata", "2025b-0+deb12u2", 261_000, suite="bookworm-updates"),
        deb("tini", "0.19.0-1", 260_000),
        deb("libyaml-0-2", "0.2.5-1", 52_000),
    ],
)

if __name__ == "__main__":
    for name, d in (("old.lock", old), ("new.lock", new)):
        text = dumps(Lockfile.model_validate(d).with_hash())
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")
