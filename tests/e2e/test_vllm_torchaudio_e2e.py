"""A torch 2.9 stack with torchaudio builds and imports (issue 57, point 7), against PyPI.

An RTX 4090 on driver 550.54 with ``torch = "2.9"`` and ``packages = ["vllm"]`` locks vllm 0.16.0,
which pins torch 2.9.1, torchaudio 2.9.1 and torchvision 0.24.1. ``envspec build`` stopped with
``abi-mismatch``: torchaudio's ``_torchaudio.so`` links ``libtorchaudio.so``, which its own wheel
ships (``torchaudio/lib/``) and whose name looks like torch's libraries, so it was judged against
torch 2.9.1's. Here the spec is locked, built with ``envspec build`` as a user runs it, and vllm and
torchaudio are imported in the image (their extension modules loaded: torchaudio's links its own
library and torch's). About 4 GB of wheels on a first run; the image leaves the store afterwards.

Skips where buildah or podman is absent, or PyPI cannot be reached.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envspec import sources

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("buildah") is None or shutil.which("podman") is None,
        reason="needs buildah and podman (scripts/dev.sh setup)",
    ),
    pytest.mark.skipif(
        not sources.reachable("https://pypi.org/simple") and not os.environ.get("CI"),
        reason="PyPI unreachable",
    ),
]

SPEC = """name = "rtx4090-vllm"
[target]
gpus = ["RTX 4090"]
driver = "550.54.15"
[python]
version = "3.11"
packages = ["vllm"]
[torch]
version = "2.9"
"""

IMPORT = (
    "import json, torch, torchaudio, torchvision, vllm; "
    "from torchaudio.lib import _torchaudio; "
    "print(json.dumps({'torch': torch.__version__, 'torchaudio': torchaudio.__version__, "
    "'vllm': vllm.__version__, 'ext': _torchaudio.__file__}))"
)


def envspec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=3000,
    )


def _in_image(ref: str, code: str) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh container of ``ref``, past the entrypoint's start-up check
    (no GPU here)."""
    from conftest import in_image

    return in_image(ref, "python", ["-c", code], timeout=600)


def test_the_rtx4090_vllm_stack_builds_and_imports_vllm_and_torchaudio(tmp_path):
    spec = tmp_path / "rtx4090.toml"
    spec.write_text(SPEC)
    lock = tmp_path / "rtx4090.lock"
    cp = envspec("lock", str(spec), "-o", str(lock), "--json")
    assert cp.returncode == 0, cp.stderr[-3000:]
    from envspec import lock as lockmod

    pins = {w.name: w.version for w in lockmod.load(lock).wheels}
    assert (pins["vllm"], pins["torch"], pins["torchaudio"]) == ("0.16.0", "2.9.1", "2.9.1"), pins
    cp = envspec("build", str(lock), "--json")
    assert cp.returncode == 0, (cp.stdout[-2000:], cp.stderr[-3000:])
    image = json.loads(cp.stdout)["image"]
    try:
        run = _in_image(image, IMPORT)
        assert run.returncode == 0, run.stderr[-3000:]
        got = json.loads(run.stdout.strip().splitlines()[-1])
        assert got["torch"].startswith("2.9.1") and got["torchaudio"].startswith("2.9.1"), got
        assert got["vllm"] == "0.16.0" and got["ext"].endswith(".so"), got
    finally:
        subprocess.run(["podman", "rmi", "--ignore", image], capture_output=True, timeout=300)
