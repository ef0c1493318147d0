"""`envspec explain` is offline, pure and light: it starts no process, opens no connection, scans no
installed package's entry points (pydantic's plugin discovery, turned off for explain), and does
not import what only `lock`, `build` or `db refresh` need (the Debian fetcher, closure and root
filesystem builder, the package-index client, host probes, rich, jinja2, the lock and Debian pin
models, packaging's requirement parser for requirements of the simple form). Each case runs the real
command in a fresh interpreter, so the modules it leaves in ``sys.modules`` are the ones explain
itself pulled in. Its speed is measured by bench/lock.py (docs/benchmarks.md), not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Not imported by `envspec explain` (nor by anything it imports): each was on its path before.
KEPT_OFF = [
    "envspec.debian.closure",
    "envspec.debian.fetch",
    "envspec.debian.rootfs",
    "envspec.debian.certs",
    "envspec.debian.debfile",
    "envspec.debian.reporter",
    "envspec.compat.pypi",
    "envspec.host",
    "envspec.sources",
    "rich",
    "jinja2",
    "markupsafe",
    "urllib.request",
    "http.client",
    "ssl",
    "sqlite3",
    "multiprocessing",
    "tarfile",
    "concurrent.futures",
    "configparser",
    "html.parser",
    "envspec.debian.models",
    "envspec.lock",
    # packaging's requirement parser, marker grammar and tags (a spec's requirements of the simple form
    # are checked without them); logging (explain logs nothing) and traceback (for -v's tracebacks)
    "packaging.requirements",
    "packaging.markers",
    "packaging.tags",
    "packaging.utils",
    "logging",
    "traceback",
]

# Runs in the child: forbid processes and connections, run the CLI, write what was imported.
CHILD = """
import json, socket, subprocess, sys

def refuse(*args, **kwargs):
    raise AssertionError("envspec explain must not start a process or open a connection")

subprocess.Popen.__init__ = refuse
socket.socket.connect = refuse
socket.create_connection = refuse

import importlib.metadata

def no_scan(*args, **kwargs):  # pydantic's plugin discovery: explain turns it off (PYDANTIC_DISABLE_PLUGINS)
    raise AssertionError("envspec explain must not scan the installed packages' entry points")

importlib.metadata.entry_points = no_scan

from envspec.cli import main

rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "modules": sorted(sys.modules)}, f)
"""

CASES = [
    (["explain", "specs/h100.toml"], 0),
    (["explain", "specs/h100.toml", "--json"], 0),
    (["explain", "specs/cpu.toml"], 0),
    (
        ["explain", "tests/data/bad_specs/19-driver-too-old.toml"],
        2,
    ),  # ResolutionImpossible, in cmd_explain
    (
        ["explain", "tests/data/bad_specs/16-unknown-gpu.toml", "--json"],
        2,
    ),  # SpecError, in main's handler
]


@pytest.mark.parametrize("argv,code", CASES, ids=[" ".join(a[1:]) for a, _ in CASES])
def test_explain_imports_nothing_heavy_and_runs_nothing(argv, code, tmp_path):
    report = tmp_path / "modules.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(report), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "must not start a process" not in proc.stdout + proc.stderr
    assert "must not scan" not in proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["rc"] == code, proc.stdout + proc.stderr
    assert proc.stdout.strip() or proc.stderr.strip()  # it did answer
    modules = set(data["modules"])
    assert (
        "envspec.resolve" in modules and "envspec.compat.load" in modules
    )  # it really ran the resolver
    loaded = [
        m for m in KEPT_OFF + (["difflib"] if code == 0 else []) if m in modules
    ]  # suggestions: bad specs only
    assert not loaded, f"`envspec {' '.join(argv)}` imported {loaded}"


def test_the_debian_package_still_exports_its_names_on_first_use(tmp_path):
    # the lazy package keeps `from envspec.debian import X` working for every name it lists
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, envspec.debian as d, envspec.compat as c\n"
            "assert 'envspec.debian.rootfs' not in sys.modules\n"
            "names = [getattr(d, n) for n in d.__all__] + [c.refresh, c.RefreshReport]\n"
            "assert 'envspec.debian.rootfs' in sys.modules and 'envspec.compat.pypi' in sys.modules\n"
            "from envspec.debian import make_rootfs, DebPin\n"
            "from envspec.debian.rootfs import make_rootfs as m2\n"
            "assert make_rootfs is m2\n"
            "try:\n    d.nothing_here\nexcept AttributeError:\n    pass\n"
            "else:\n    raise SystemExit('no AttributeError')\n",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


# Runs in the child: the CLI, then which of the compatibility DB's pydantic models built a schema, and
# whether the row models (envspec.compat.rows) were imported.
CHILD_SCHEMAS = """
import contextlib, io, json, sys
import envspec.compat.model as m
from envspec.cli import main

out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(sys.argv[2:])
models = [m.Variant, m.TorchRelease, m.CudaToolkit, m.Gpu]
if "envspec.compat.rows" in sys.modules:  # the row models, imported on a cache miss only
    r = sys.modules["envspec.compat.rows"]
    models += [r.PypiRow, r.BuildRow, r.ToolkitRow, r.GpuRow]
built = [c.__name__ for c in models if c.__pydantic_complete__]
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "built": built, "rows": "envspec.compat.rows" in sys.modules, "stdout": out.getvalue()}, f)
"""


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_explain_reads_the_checked_db_from_the_cache_and_builds_no_db_schema(json_out, tmp_path):
    # the first run checks the DB's files (a cache miss: the row and DB models are built) and stores
    # the result; the second reads it (docs/compat-db.md, "Loading"); both answer the same
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), ENVSPEC_CACHE=str(tmp_path / "cache"))
    runs = []
    for i in range(2):
        report = tmp_path / f"run{i}.json"
        argv = ["explain", "specs/h100.toml"] + (["--json"] if json_out else [])
        proc = subprocess.run(
            [sys.executable, "-c", CHILD_SCHEMAS, str(report), *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(report.read_text()))
    cold, warm = runs
    assert cold["rc"] == warm["rc"] == 0
    assert cold["rows"] and "Variant" in cold["built"] and "GpuRow" in cold["built"]
    assert warm["built"] == [] and not warm["rows"]
    assert warm["stdout"] == cold["stdout"] and "2.14" in warm["stdout"]
    assert len(list((tmp_path / "cache" / "compat-db").glob("*.json"))) == 1
