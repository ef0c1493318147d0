"""One screen per function (issue 40): no function of src/envspec over 60 lines or with more than 8
parameters (a keyword-only options model counts as one). A function that grows past either is
split into named steps, or given an options model (a frozen dataclass)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "envspec"
MAX_LINES = 60
MAX_PARAMS = 8


def _functions() -> list[tuple[str, int, int]]:
    """("module:function", lines, parameters) of every function and method of src/envspec."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                params = len([n for n in names if n not in ("self", "cls")])
                params += (a.vararg is not None) + (a.kwarg is not None)
                assert node.end_lineno is not None
                out.append((f"{rel}:{node.name}", node.end_lineno - node.lineno + 1, params))
    return out


def test_functions_fit_on_a_screen():
    found = _functions()
    assert len(found) > 1000  # the walk reads the package
    too_long = {name: lines for name, lines, _ in found if lines > MAX_LINES}
    assert not too_long, (
        f"functions over {MAX_LINES} lines: split them into named steps: {too_long}"
    )


def test_parameters_are_few():
    many = {name: params for name, _, params in _functions() if params > MAX_PARAMS}
    assert not many, (
        f"functions with more than {MAX_PARAMS} parameters: take a keyword-only options model "
        f"(a frozen dataclass) instead: {many}"
    )


MAX_MODULE_LINES = 1200


def test_no_module_is_too_big_to_live_in():
    """Issue 56, point 5: a module past 1,200 lines is split into the steps it holds (resolve/ and
    image/ were 2,400 and 1,830)."""
    sizes = {
        p.relative_to(SRC).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in SRC.rglob("*.py")
    }
    assert len(sizes) > 50
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}
