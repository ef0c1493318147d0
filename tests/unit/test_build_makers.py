"""Which wheel layer maker goes first: the layer estimated to cost the most starts first and runs
at the makers' niceness, the others above it (docs/build.md, "Which maker goes first")."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "build"))
import helpers  # noqa: E402

from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.image import BuildOptions, Layers, Reporter, layers  # noqa: E402
from envspec.plan import make_plan  # noqa: E402

MODULES = {f"manymods/m{i:03d}.py": f"X = {i}\n".encode() for i in range(200)}  # 200 modules, 2 kB
BIG = {
    "bigdata/__init__.py": b"",
    "bigdata/blob.bin": bytes(40 << 20),
}  # one 40 MB member (deflates to 40 kB)


def _wheel(tmp: Path, name: str, files: dict[str, bytes]) -> Path:
    (tmp / "w").mkdir(exist_ok=True)
    return helpers.make_wheel(tmp / "w", name, "1.0", files=dict(files))[0]


def test_modules_cost_only_when_compiled_and_bytes_always(tmp_path):
    mods, big = _wheel(tmp_path, "manymods", MODULES), _wheel(tmp_path, "bigdata", BIG)
    compiled = layers.estimated_cost([mods], bytecode=True)
    assert compiled > layers.estimated_cost([big], bytecode=True)  # 200 modules to compile: 0.5 s
    assert layers.estimated_cost([mods], bytecode=False) < layers.estimated_cost(
        [big], bytecode=False
    )
    assert compiled - layers.estimated_cost([mods], bytecode=False) == pytest.approx(
        200 * layers.COST_PER_PY
    )
    both = compiled + layers.estimated_cost([big], bytecode=True)
    assert layers.estimated_cost([mods, big], bytecode=True) == pytest.approx(both)


def test_the_costliest_layer_starts_first_and_the_others_run_niced(tmp_path, monkeypatch):
    monkeypatch.delenv("ENVSPEC_MAKER_NICE", raising=False)
    monkeypatch.delenv("ENVSPEC_MAKER_NICE_OTHERS", raising=False)
    # the torch layer (second in the plan) holds the 40 MB member: without .pyc it costs the most
    lock, mirror = helpers.local_lock(
        tmp_path,
        [("cudalib", "1.0", "cuda"), ("bigdata", "1.0", "torch"), ("teampkg", "1.0", "team")],
        files={"bigdata": BIG},
    )
    plan = make_plan(lock)
    lay = Layers(
        plan,
        Cache(tmp_path / "cache"),
        tmp_path / "work",
        Reporter(),
        options=BuildOptions(no_cache=True),
    )
    (tmp_path / "work").mkdir()
    lay.fetch_wheels([sources.Mirror(mirror.as_uri(), "links", "test")])
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with lay.wheel_makers(2) as makers:
        assert [m.group for m in makers.todo] == ["torch", "cuda", "team"]
        ran = {m.group: fut.result().nice for m, _out, fut in makers.jobs}
    assert ran == {"torch": base, "cuda": min(19, base + 10), "team": min(19, base + 10)}


def test_the_others_niceness_is_a_setting_and_0_turns_it_off(tmp_path, monkeypatch):
    lock, mirror = helpers.local_lock(
        tmp_path, [("cudalib", "1.0", "cuda"), ("bigdata", "1.0", "torch")], files={"bigdata": BIG}
    )
    lay = Layers(
        make_plan(lock),
        Cache(tmp_path / "cache"),
        tmp_path / "work",
        Reporter(),
        options=BuildOptions(no_cache=True),
    )
    (tmp_path / "work").mkdir()
    lay.fetch_wheels([sources.Mirror(mirror.as_uri(), "links", "test")])
    base = os.getpriority(os.PRIO_PROCESS, 0)
    monkeypatch.setenv("ENVSPEC_MAKER_NICE_OTHERS", "0")
    monkeypatch.setenv("ENVSPEC_MAKER_NICE", "3")
    with lay.wheel_makers(1) as makers:
        ran = {m.group: fut.result().nice for m, _out, fut in makers.jobs}
    assert ran == {"torch": min(19, base + 3), "cuda": min(19, base + 3)}
