"""`envspec init` (issue 42, point 2): a commented spec that locks as written, no question when every
value is given, questions in a terminal for what is not, never an overwritten file."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from envspec.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


def envspec(*args: str, cwd: Path, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        cwd=cwd,
        env=env,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_value_given_writes_a_commented_spec_that_explains(tmp_path):
    cp = envspec(
        "init",
        "--name",
        "demo",
        "--gpu",
        "H100",
        "--driver",
        "580.65.06",
        "--torch",
        "2.14",
        "--python",
        "3.11",
        "--packages",
        "transformers>=4.50,datasets",
        cwd=tmp_path,
    )
    assert cp.returncode == 0, cp.stderr
    path = tmp_path / "specs" / "demo.toml"
    text = path.read_text()
    assert text.startswith("# demo: written by `envspec init`") and "docs/spec.md" in text
    assert sum(1 for line in text.splitlines() if "#" in line) >= 12  # every key says what it is
    spec = load_spec(path)
    assert (spec.target.gpus, spec.target.driver, spec.torch.version, spec.python.packages) == (
        ["H100"],
        "580.65.06",
        "==2.14.*",
        ["transformers>=4.50", "datasets"],
    )
    out = envspec("explain", str(path), cwd=tmp_path)
    assert out.returncode == 0 and "torch 2.14.1 cu130" in out.stdout
    assert f"next: envspec explain {Path('specs/demo.toml')}" in cp.stderr


def test_a_file_is_never_overwritten(tmp_path):
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs" / "demo.toml"
    spec.write_text("# mine\n")
    cp = envspec("init", "--name", "demo", "--cpu", cwd=tmp_path)
    assert (
        cp.returncode == 2 and "error[file-exists]" in cp.stderr and spec.read_text() == "# mine\n"
    )


def test_values_that_do_not_fit_write_nothing(tmp_path):
    cp = envspec(
        "init",
        "--name",
        "v100",
        "--gpu",
        "V100",
        "--driver",
        "470.82.01",
        "--torch",
        "2.14",
        cwd=tmp_path,
    )
    assert (
        cp.returncode == 2
        and "what would fit" in cp.stderr
        and "torch 2.7.1 with cu118" in cp.stderr
    )
    cp = envspec("init", "--name", "x", "--gpu", "H1OO", cwd=tmp_path)
    assert (
        cp.returncode == 2
        and "unknown GPU 'H1OO'" in cp.stderr
        and "did you mean 'H100'?" in cp.stderr
    )
    assert not (tmp_path / "specs").exists()


def test_without_a_terminal_a_missing_gpu_is_an_error_not_a_guess(tmp_path):
    cp = envspec("init", "--name", "x", cwd=tmp_path)
    assert cp.returncode == 2 and "--gpu" in cp.stderr and "--cpu" in cp.stderr
    cp = envspec("init", "--name", "c", "--cpu", cwd=tmp_path)  # the rest has defaults
    assert cp.returncode == 0, cp.stderr
    spec = load_spec(tmp_path / "specs" / "c.toml")
    assert spec.target.gpus == [] and spec.torch.cuda == "cpu" and spec.python.version == "3.11"


def test_in_a_terminal_it_asks_for_what_is_not_given(tmp_path):
    main, sub = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "envspec", "init", "--name", "asked", "--driver", "580.65.06"],
        cwd=tmp_path,
        env=env,
        stdin=sub,
        stdout=sub,
        stderr=sub,
    )
    os.close(sub)
    answers = {
        "GPUs": "A100 80GB",
        "torch versions": "2.13",
        "Python": "",
        "Python packages": "numpy>=2",
    }
    seen, buf, deadline = [], b"", time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if not ready:
            continue
        try:
            buf += os.read(main, 4096)
        except OSError:
            break
        for q, a in answers.items():
            if q not in seen and f"{q}".encode() in buf and buf.rstrip().endswith(b":"):
                seen.append(q)
                os.write(main, (a + "\n").encode())
                buf = b""
    proc.wait(timeout=60)
    os.close(main)
    assert proc.returncode == 0 and seen == list(answers), (seen, buf)
    spec = load_spec(tmp_path / "specs" / "asked.toml")
    assert (
        spec.target.gpus == ["A100 80GB"]
        and spec.torch.version == "==2.13.*"
        and spec.python.packages == ["numpy>=2"]
    )
    assert spec.python.version == "3.11"  # the default, an empty answer
