"""The CLI edge: argument splitting, exit codes, JSON on stdout, errors without tracebacks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from envspec.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0 and "envspec" in capsys.readouterr().out


def test_run_print_splits_the_command_at_double_dash(capsys):
    code = main(
        [
            "run",
            str(ROOT / "lockfiles" / "smoke.lock"),
            "--print",
            "--engine",
            "podman",
            "--no-mount",
            "--",
            "python",
            "--print",
            "-c",
            "x",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    cmd = [ln for ln in out.splitlines() if not ln.startswith("#")][0]
    assert cmd.endswith(
        "localhost/envspec/smoke:"
        + _short(ROOT / "lockfiles" / "smoke.lock")
        + " python --print -c x"
    )
    assert "--shm-size 64m" in cmd


def _short(p: Path) -> str:
    from envspec.lock import load

    return load(p).short_hash


def test_diff_json(capsys):
    code = main(
        [
            "diff",
            str(ROOT / "lockfiles" / "h100-train.lock"),
            str(ROOT / "lockfiles" / "a100-train.lock"),
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["wheels"]["counts"]["removed"] == 1
    assert [(c["name"], c["change"]) for c in data["wheels"]["changes"]] == [
        ("safetensors", "removed")
    ]
    layers = {lay["group"]: lay["change"] for lay in data["layers"]["layers"]}
    assert (
        layers["base"] == layers["cuda"] == layers["torch"] == "same" and layers["team"] != "same"
    )


def test_build_locked_refuses_a_missing_lock(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.toml"
    spec.write_text('name = "nolock"\n[python]\npackages = ["six"]\n')
    code = main(["build", str(spec), "--locked", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "no lockfile" in err and "Traceback" not in err


def test_build_locked_refuses_a_stale_lock(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lockfiles").mkdir()
    shutil.copy(ROOT / "lockfiles" / "smoke.lock", tmp_path / "lockfiles" / "smoke.lock")
    spec = tmp_path / "smoke.toml"
    spec.write_text((ROOT / "specs" / "smoke.toml").read_text().replace("idna==3.7", "idna==3.6"))
    code = main(["build", str(spec), "--locked", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 1 and "lock-out-of-date" in err and "idna" in err


def test_unknown_lock_is_a_clear_error(capsys):
    code = main(["diff", "nope.lock", str(ROOT / "lockfiles" / "smoke.lock")])
    err = capsys.readouterr().err
    assert code == 2 and "nope.lock" in err and "Traceback" not in err


def test_db_show_piped_gives_each_entry_one_line():
    """issue 43, 14: piped, `db show` wrapped entries at 80 columns and left out aliases, driver
    floors and arch lists: each GPU and each build of each release is one line that has them."""
    import subprocess
    import sys

    from envspec.compat import load_db
    from envspec.compat.load import LINES
    from envspec.resolve import driver_floor

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "envspec", "db", "show"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    db = load_db()
    import re

    titles = [x for x in out if x.startswith("GPUs, ")]
    assert [t.split(" (")[0] for t in titles] == [
        "GPUs, data center",
        "GPUs, workstation",
        "GPUs, GeForce and TITAN",
        "GPUs, Jetson",
    ]
    for g in db.gpus:
        # the name, then at least two spaces: "NVIDIA H100" is not the start of "NVIDIA H100 80GB HBM3"'s line
        i, line = next((i, x) for i, x in enumerate(out) if re.match(rf" {re.escape(g.name)}  ", x))
        assert (
            all(a in line for a in g.aliases)
            and f" {g.cc} " in line
            and f" {g.architecture} " in line
        )
        assert (f" R{g.min_driver} " in line) if g.min_driver else True
        assert (f" R{g.max_driver} " in line) if g.max_driver else True
        # in its product line's table: the last title above it
        assert [t for t in titles if out.index(t) < i][-1].startswith(f"GPUs, {LINES[g.line]} ("), (
            g.name
        )
    for f in db.families:
        assert any(x.split()[:2] == [f.cc, f.architecture.split()[0]] for x in out), f.cc
    for r in db.torch_releases:
        for v in r.variants.values():
            line = next(x for x in out if x.split()[:2] == [r.version, v.name])
            assert " ".join(v.arch_list) in line
            if v.cuda:
                assert f"{driver_floor(db, v, 'compat')} / {driver_floor(db, v, 'strict')}" in line
