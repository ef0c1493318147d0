"""A lockfile of the running python (its torch and every installed distribution), for the
verifier's tests and bench/verify_cpu_nodes.py. Needs torch."""

import hashlib
import json
import tomllib

import torch

from envspec.verify.integrity import find_dists, site_dirs


def with_content_hash(text: str) -> str:
    """The lock text with ``[meta].content_hash`` set to the hash of its tables (all but [meta]),
    as ``envspec lock`` writes it: the verifier refuses a lock whose tables do not give it."""
    data = tomllib.loads(text)
    body = {k: v for k, v in data.items() if k != "meta"}
    digest = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    old = data["meta"]["content_hash"]
    return text.replace(f'content_hash = "{old}"', f'content_hash = "sha256:{digest}"', 1)


def lock_text_for_this_python(venv: str) -> str:
    public, _, local = torch.__version__.partition("+")
    cuda = torch.version.cuda or ""
    lines = [
        "version = 1",
        "revision = 0",
        "",
        "[meta]",
        'name = "this-python"',
        f'content_hash = "sha256:{"5" * 64}"',
        "",
        "[platform]",
        f'venv = "{venv}"',
        "",
        "[hardware]",
        "gpus = []",
        "compute_capabilities = []",
        "arch_list = []",
        'driver_floor = ""',
        'driver_policy = "compat"',
        "",
        "[torch]",
        f'version = "{public}"',
        f'local = "{local}"',
        f'variant = "{"cpu" if not cuda else "cu" + cuda.replace(".", "")}"',
        f'cuda = "{cuda}"',
        'cudnn = ""',
        'nccl = ""',
        "",
        "[runtime]",
        "tf32 = false",
        'matmul_precision = "highest"',
        'shm_size = "1m"',
        "env = {}",
        "",
    ]
    for name, d in sorted(find_dists(site_dirs()).items()):
        group = "torch" if name == "torch" else "deps"
        lines += [
            "[[wheels]]",
            f'name = "{name}"',
            f'version = "{d.version}"',
            f'group = "{group}"',
            "",
        ]
    return with_content_hash("\n".join(lines))
