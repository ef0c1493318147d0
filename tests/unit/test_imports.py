"""Imports go one way: no cycle between envspec's packages or between its files, no stage imports a
later one, verify/ imports nothing else from envspec (it is copied into images alone), and the
command line is imported by nobody but ``python -m envspec``.

Every import counts: at the top of a module, inside a function (deferred for start-up time) and
under ``TYPE_CHECKING``. (A module is not counted as importing the packages above it, although
Python runs their ``__init__`` first: a package's ``__init__`` that hands on its modules' names is
no cycle.)
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# The pipeline, in the order data flows (docs/architecture.md): a package may import the ones
# before it, never one after it.
PIPELINE = ["spec", "compat", "resolve", "lock", "plan", "wheels", "image", "registry"]


def module_graph(src: Path, top: str = "envspec") -> dict[str, set[str]]:
    """module -> the modules of ``top`` it imports (by dotted name), read from the source."""
    root = src / top
    mods: dict[str, Path] = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [
                    f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names
                ]
            else:
                continue
            for t in targets:
                while t and t not in mods:  # `import envspec.x.y` names y; `from x import Name`: x
                    t = t.rpartition(".")[0]
                if t:
                    out.add(t)
        out.discard(name)
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit(module: str) -> str:
    """The package (or top-level module) of envspec that ``module`` belongs to: envspec.image.oci -> image."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        if not unit(m):
            continue
        out.setdefault(unit(m), set()).update(
            unit(t) for t in targets if unit(t) and unit(t) != unit(m)
        )
    return out


def importers(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """package -> the modules of it that import ``package``, for the packages that do."""
    found: dict[str, list[str]] = {}
    for m, targets in sorted(graph.items()):
        if unit(m) != package and any(unit(t) == package for t in targets):
            found.setdefault(unit(m), []).append(m)
    return found


GRAPH = module_graph(SRC)
PACKAGES = package_graph(GRAPH)


def test_the_graph_is_read():  # the checks below mean something: the layout's known arrows are there
    assert {
        "envspec.image.layers",
        "envspec.registry.regcache",
        "envspec.cli.build",
        "envspec.verify.startup",
    } <= set(GRAPH)
    assert "envspec.image" in GRAPH["envspec.registry.regcache"]
    assert "envspec.plan" in GRAPH["envspec.image.layers"]
    assert {"image", "plan", "lock"} <= PACKAGES["registry"]
    assert "envspec.verify.startup" in GRAPH["envspec.verify.checks"]


def test_no_cycle_between_packages():
    assert cycles(PACKAGES) == []


def test_no_cycle_between_files():  # an import inside a function counts: none dodges a cycle
    assert cycles(GRAPH) == []


def test_no_stage_imports_a_later_one():
    wrong = [
        (a, b)
        for i, a in enumerate(PIPELINE)
        for b in PIPELINE[i + 1 :]
        if b in PACKAGES.get(a, set())
    ]
    assert wrong == []


def test_the_cache_imports_no_stage():  # it is below all of them: compat's DB cache and host use it
    assert PACKAGES["cache"] <= {"errors", "settings"}


def test_settings_are_below_every_stage():  # every stage may read them (issue 41, point 1)
    # (verify: its own table of the verifier's variables, read for docs/usage.md's list)
    assert PACKAGES["settings"] <= {"errors", "verify"}


def test_verify_imports_nothing_else_from_envspec():  # it is copied into images alone
    outside = {
        m: sorted(t for t in ts if not t.startswith("envspec.verify") and t != "envspec")
        for m, ts in GRAPH.items()
        if m.startswith("envspec.verify")
    }
    assert {m: ts for m, ts in outside.items() if ts} == {}


def test_only_the_module_entry_imports_the_cli():
    assert importers(GRAPH, "cli") == {"__main__": ["envspec.__main__"]}


def test_the_finder_finds_a_cycle_through_a_deferred_import(tmp_path):
    pkg = tmp_path / "toy"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "one.py").write_text("from toy.b import two\n")
    (pkg / "b.py").write_text("def f():\n    from .a import one\n")
    graph = module_graph(tmp_path, "toy")
    assert graph["toy.b"] == {"toy.a.one"}
    assert cycles(graph) == [["toy.a.one", "toy.b"]]
    assert cycles(package_graph(graph)) == [["a", "b"]]


# resolve/'s steps, each importing only those below it (issue 56): the data the stage hands on at
# the bottom, the pure torch choice on it alone, uv's runs above their failures' words, the steps
# in order at the top; __init__ only re-exports.
RESOLVE_STEPS = {
    "model": set(),
    "torch": {"model"},
    "failures": {"model", "torch"},
    "uv": {"model", "failures"},
    "candidates": {"model"},
    "sdists": {"model", "torch", "uv", "candidates"},
    "held": {"model", "uv", "sdists", "candidates"},
    "packages": {"model", "torch", "uv", "failures", "candidates", "sdists", "held"},
    "debian": {"model", "failures"},
    "stage": {"model", "packages", "sdists", "held", "debian"},
}


def test_resolves_steps_import_only_the_ones_below_them():
    steps = {m for m in GRAPH if m.startswith("envspec.resolve.")}
    assert steps == {f"envspec.resolve.{s}" for s in RESOLVE_STEPS}, "a new step: place it here"
    wrong = {
        step: sorted(extra)
        for step, below in RESOLVE_STEPS.items()
        if (
            extra := {t.rsplit(".", 1)[1] for t in GRAPH[f"envspec.resolve.{step}"] if t in steps}
            - below
        )
    }
    assert wrong == {}


def test_the_torch_choice_reads_no_index():  # explain runs it offline, without the host's tools
    assert (
        not {"envspec.sources", "envspec.sides", "envspec.cache.dirs"}
        & GRAPH["envspec.resolve.torch"]
    )
    assert not {t for t in GRAPH["envspec.resolve.model"] if t.startswith("envspec.resolve")}
