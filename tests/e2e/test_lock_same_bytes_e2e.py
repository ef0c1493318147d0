"""The same spec gives the same lock bytes from any cache state (issue 57, point 3), against PyPI.

The hunt: an L4 on driver 550 with ``torch = "<2.11"`` and vllm locks torch 2.10.0 with vllm 0.19.1
(vllm 0.17.0-0.19.1 pin torch 2.10.0). Locked a few minutes after a spec of ``torch = "2.9"`` and
vllm, it once locked torch 2.9.1 with vllm 0.16.0: uv ran ``--offline`` first where a lock of "the
same requirements" had read the indexes recently (the torch range was not part of that key), and
offline uv passes over a release whose metadata its cache lacks. Three specs (that one, its torch
2.9 sibling, an H100 spec of torch 2.13) are locked from a cold cache, again warm, in another
order in a new cache (the sibling first), and with pip configured (by the test: a find-links
folder of its own with a torch 2.13.0+cpu, an extra index of its own); every lock of a spec is the
same bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envspec import sources

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import cpu_torch_links  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not sources.reachable("https://pypi.org/simple") and not os.environ.get("CI"),
    reason="PyPI unreachable",
)

L4 = """name = "l4-vllm"
[target]
gpus = ["L4"]
driver = "550.54.15"
[python]
version = "3.11"
packages = ["vllm"]
[torch]
version = "{torch}"
"""
H100 = """name = "h100-numpy"
[target]
gpus = ["H100"]
driver = "580.65.06"
[python]
version = "3.11"
packages = ["numpy>=2"]
[torch]
version = "2.13"
"""


def _env(cache: Path, pip_conf: Path | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "UV_", "ENVSPEC_")) or k == "ENVSPEC_CI"
    }
    env.update(PYTHONPATH=str(ROOT / "src"), ENVSPEC_CACHE=str(cache))
    env["PIP_CONFIG_FILE"] = str(pip_conf) if pip_conf else os.devnull
    return env


def _lock(spec: Path, out: Path, env: dict[str, str]) -> bytes:
    out.parent.mkdir(parents=True, exist_ok=True)
    cp = subprocess.run(
        [sys.executable, "-m", "envspec", "lock", str(spec), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    assert cp.returncode == 0, cp.stderr[-3000:]
    return out.read_bytes()


def _pins(text: bytes) -> dict[str, str]:
    from envspec import lock as lockmod

    return {w.name: w.version for w in lockmod.loads(text.decode()).wheels}


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    base = tmp_path_factory.mktemp("same-bytes")
    d = base / "specs"
    d.mkdir()
    (d / "l4.toml").write_text(L4.format(torch="<2.11"))
    (d / "l4-29.toml").write_text(L4.format(torch="2.9").replace("l4-vllm", "l4-vllm-29"))
    (d / "h100.toml").write_text(H100)
    # pip's configuration as a CI machine has it: a find-links folder with a CPU torch that
    # torch==2.13.0 matches, and an extra index (a local simple index of one project)
    links = cpu_torch_links(base / "links")
    extra = base / "simple" / "torch"
    extra.mkdir(parents=True)
    (extra / "index.html").write_text("<html><body></body></html>\n")
    conf = base / "pip.conf"
    conf.write_text(
        f"[global]\nfind-links = {links}\nextra-index-url = {(base / 'simple').as_uri()}\n"
    )
    return base, conf


def test_the_same_spec_locks_to_the_same_bytes_from_any_cache_state(specs):
    base, conf = specs
    names = ["l4", "l4-29", "h100"]
    spec = {n: base / "specs" / f"{n}.toml" for n in names}
    cold = _env(base / "cache-a", None)
    first = {n: _lock(spec[n], base / "cold" / f"{n}.lock", cold) for n in names}
    l4 = _pins(first["l4"])
    assert (l4["torch"], l4["vllm"]) == ("2.10.0", "0.19.1"), l4
    assert _pins(first["l4-29"])["torch"] == "2.9.1"
    assert _pins(first["h100"])["torch"] == "2.13.0"
    for n in names:  # warm: the same cache again
        assert _lock(spec[n], base / "warm" / f"{n}.lock", cold) == first[n], n
    other = _env(base / "cache-b", None)  # a new cache, the torch 2.9 sibling locked first
    for n in ["l4-29", "l4", "h100"]:
        assert _lock(spec[n], base / "after" / f"{n}.lock", other) == first[n], n
    piped = _env(base / "cache-c", conf)  # pip configured with a find-links folder and an index
    for n in ["h100", "l4-29", "l4"]:
        assert _lock(spec[n], base / "pip" / f"{n}.lock", piped) == first[n], n
