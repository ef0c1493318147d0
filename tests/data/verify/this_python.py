"""A lockfile of the running python (its torch and every installed distribution), for the
verifier's tests and bench/verify_cpu_nodes.py. Needs torch."""

import torch

from envspec.verify.integrity import find_dists, site_dirs


def lock_text_for_this_python(venv: str) -> str:
    public, _, local = torch.__version__.partition("+")
    cuda = torch.version.cuda or ""
    lines = [
        "version = 1", "revision = 0", "", "[meta]", 'name = "this-python"',
        f'content_hash = "sha256:{"5" * 64}"', "", "[platform]", f'venv = "{venv}"', "",
        "[hardware]", "gpus = []", "compute_capabilities = []", "arch_list = []", 'driver_floor = ""',
        'driver_policy = "compat"', "", "[torch]", f'version = "{public}"', f'local = "{local}"',
        f'variant = "{"cpu" if not cuda else "cu" + cuda.replace(".", "")}"', f'cuda = "{cuda}"',
        'cudnn = ""', 'nccl = ""', "", "[runtime]", "tf32 = false", 'matmul_precision = "highest"',
        'shm_size = "1m"', "env = {}", "",
    ]
    for name, d in sorted(find_dists(site_dirs()).items()):
        group = "torch" if name == "torch" else "deps"
        lines += ["[[wheels]]", f'name = "{name}"', f'version = "{d.version}"', f'group = "{group}"', ""]
    return "\n".join(lines)
