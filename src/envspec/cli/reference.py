"""docs/cli.md and docs/spec.md, generated: every command from the parsers (its description,
usage, options and examples), every spec key from the pydantic models (its type, default, example
and meaning), so that the pages and the code cannot disagree (tests/unit/test_cli_reference.py).

    python -m envspec.cli.reference > docs/cli.md
    python -m envspec.cli.reference spec > docs/spec.md
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

WIDTH = 100


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(the command line's words, its parser) for every command and sub-command, in `--help`'s order."""
    from envspec import cluster
    from envspec.cli import GROUPS, build_parser
    from envspec.verify.cli import build_parser as verify_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for names in GROUPS.values():
        for name in names:
            if name == "verify":
                yield "envspec verify", verify_parser()
                continue
            if name == "cluster":
                yield "envspec cluster render", cluster.build_parser()
                continue
            p = sub.choices[name]
            yield f"envspec {name}", p
            inner = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
            for child, cp in inner.choices.items() if inner else ():
                yield f"envspec {name} {child}", cp


def _usage(words: str, p: argparse.ArgumentParser) -> str:
    f = argparse.HelpFormatter(prog=words, width=WIDTH)
    f.add_usage(p.usage, p._actions, p._mutually_exclusive_groups, prefix="")
    return f.format_help().strip()


def _option(a: argparse.Action) -> str:
    if a.option_strings:
        names = ", ".join(a.option_strings)
        if a.nargs != 0:
            names += " " + (
                a.metavar
                if isinstance(a.metavar, str)
                else (
                    a.dest.upper() if not a.choices else "{" + ",".join(map(str, a.choices)) + "}"
                )
            )
        return names
    return a.metavar if isinstance(a.metavar, str) else a.dest.upper()


def _cell(text: str) -> str:
    """A table cell's code (shown as written)."""
    return " ".join(text.split()).replace("|", "\\|")


def _plain(text: str) -> str:
    """A table cell's words: a <name> is not an HTML tag."""
    return _cell(text).replace("<", "&lt;")


def markdown() -> str:
    out = [
        "# The command line",
        "",
        "Generated from the parsers by `python -m envspec.cli.reference > docs/cli.md`; "
        "`envspec COMMAND --help` says the same. Exit codes: README.md.",
        "",
    ]
    from envspec.cli import GROUPS

    out += ["| group | commands |", "| --- | --- |"]
    out += [f"| {g} | {', '.join(f'`{n}`' for n in names)} |" for g, names in GROUPS.items()]
    for words, p in _parsers():
        out += [
            "",
            f"## `{words}`",
            "",
            _plain(p.description or ""),
            "",
            "```",
            _usage(words, p),
            "```",
            "",
        ]
        rows = [a for a in p._actions if not isinstance(a, argparse._HelpAction)]
        if rows:
            out += ["| argument | meaning |", "| --- | --- |"]
            out += [f"| `{_cell(_option(a))}` | {_plain(a.help or '')} |" for a in rows]
        if p.epilog and p.epilog.startswith("examples:"):
            out += [
                "",
                "Examples:",
                "",
                "```sh",
                *[line[2:] for line in p.epilog.splitlines()[1:]],
                "```",
            ]
    return "\n".join(out) + "\n"


# --- docs/spec.md ---------------------------------------------------------------------------------


def _toml(v: object) -> str:
    """A value as TOML writes it inline."""
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)


def _type(info: FieldInfo) -> str:
    """A field's type in a reader's words."""
    import types
    import typing

    from envspec import spec as specmod

    def words(t: object) -> str:
        origin, args = typing.get_origin(t), typing.get_args(t)
        if t is specmod.Req:
            return "PEP 508 requirement"
        if t is specmod.DebName:
            return "Debian package name"
        if origin is typing.Literal:
            return "one of " + ", ".join(_toml(a) for a in args)
        if origin in (typing.Union, types.UnionType):
            return " or ".join(words(a) for a in args if a is not type(None))
        if origin is list:
            return f"array of {words(args[0])}s"
        if origin is dict:
            return f"table of {words(args[1])}s"
        named: dict[object, str] = {str: "string", bool: "boolean", int: "integer"}
        return named.get(t) or str(getattr(t, "__name__", t))

    text = words(info.annotation)
    bounds = [m for m in info.metadata if hasattr(m, "ge") or hasattr(m, "le")]
    lo = next((m.ge for m in bounds if getattr(m, "ge", None) is not None), None)
    hi = next((m.le for m in bounds if getattr(m, "le", None) is not None), None)
    return text + (f", {lo} to {hi}" if lo is not None and hi is not None else "")


def _default(info: FieldInfo) -> str:
    from pydantic_core import PydanticUndefined

    if info.default is PydanticUndefined and info.default_factory is None:
        return "(required)"
    value = info.get_default(call_default_factory=True)
    return "(none)" if value is None else f"`{_toml(value)}`"


def _tables() -> Iterator[tuple[str, type[BaseModel]]]:
    """(TOML table name, model) of the spec, in its order: the top level, each table, the services'."""
    from envspec import spec as specmod

    yield "", specmod.EnvSpec
    for name, info in specmod.EnvSpec.model_fields.items():
        model = _model_of(info.annotation)
        if model is None:
            continue
        if model is specmod.Services:
            for sname, sinfo in model.model_fields.items():
                if (service := _model_of(sinfo.annotation)) is not None:
                    yield f"services.{sname}", service
            continue
        yield name, model


def _model_of(t: object) -> type[BaseModel] | None:
    """The model a field's annotation names (``X`` or ``X | None``), None where it is no model."""
    import typing

    from pydantic import BaseModel

    for c in (t, *typing.get_args(t)):
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def spec_markdown() -> str:
    from envspec.spec import EnvSpec

    out = [
        "# The spec",
        "",
        "A spec is one TOML file (`specs/<name>.toml`; `envspec init` writes a commented one). "
        "Generated from the models in `src/envspec/spec.py` by `python -m envspec.cli.reference spec > "
        "docs/spec.md`; a test keeps it in sync. A key the models do not know is an error, with did-you-mean.",
        "",
        "```toml",
        'name = "h100-train"',
        "",
        "[target]",
        'gpus = ["H100"]',
        'driver = "580.65.06"',
        "",
        "[python]",
        'packages = ["transformers>=4.50"]',
        "",
        "[torch]",
        'version = "2.14"',
        "```",
    ]
    for table, model in _tables():
        out += ["", f"## {'[' + table + ']' if table else 'Top level'}", ""]
        out += [" ".join((model.__doc__ or "").split()), ""]
        out += ["| key | type | default | example | meaning |", "| --- | --- | --- | --- | --- |"]
        for key, info in model.model_fields.items():
            if _model_of(info.annotation) is not None and model is EnvSpec:
                continue  # a table: its own section
            if _model_of(info.annotation) is not None:
                continue
            example = (info.examples or [None])[0]
            out.append(
                f"| `{key}` | {_plain(_type(info))} | {_cell(_default(info))} | "
                f"{'`' + _cell(_toml(example)) + '`' if example is not None else ''} | {_plain(info.description or '')} |"
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(spec_markdown() if sys.argv[1:] == ["spec"] else markdown())
