"""docs/cli.md is the parsers' own text (issue 42, points 1 and 4): it is regenerated and compared,
and every command has a description and examples, every argument a help text."""

from __future__ import annotations

import argparse
from pathlib import Path

from envspec.cli import _COMMANDS, GROUPS
from envspec.cli.reference import _parsers, markdown

ROOT = Path(__file__).resolve().parents[2]


def test_docs_cli_md_is_the_parsers_text():
    assert (ROOT / "docs" / "cli.md").read_text() == markdown(), (
        "docs/cli.md is stale: python -m envspec.cli.reference > docs/cli.md"
    )


def test_every_command_says_what_it_does_with_examples_and_every_argument_has_help():
    seen = []
    for words, p in _parsers():
        seen.append(words)
        assert p.description and len(p.description) > 20, words
        assert p.epilog and p.epilog.startswith("examples:\n  envspec "), words
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help, f"{words}: {a.option_strings or a.dest} has no help"
    assert {
        "envspec db show",
        "envspec cache gc",
        "envspec verify",
        "envspec cluster render",
    } <= set(seen)


def test_the_top_level_groups_every_command_once():
    grouped = [n for names in GROUPS.values() for n in names]
    assert sorted(grouped) == sorted(_COMMANDS) and len(grouped) == len(set(grouped))
    assert list(GROUPS)[0] == "start here" and GROUPS["start here"][0] == "init"


def test_docs_spec_md_is_the_models_text_and_every_key_is_on_it():
    """issue 42, 3: every key of the spec with its type, default, an example and its meaning; the
    page is regenerated and compared, and each example is a value the models take."""
    from envspec.cli.reference import _model_of, _tables, spec_markdown

    page = (ROOT / "docs" / "spec.md").read_text()
    assert page == spec_markdown(), (
        "docs/spec.md is stale: python -m envspec.cli.reference spec > docs/spec.md"
    )
    keys = 0
    for table, model in _tables():
        assert model.__doc__ and f"## {'[' + table + ']' if table else 'Top level'}" in page
        for key, info in model.model_fields.items():
            if _model_of(info.annotation) is not None:
                continue
            keys += 1
            assert info.description and info.examples, f"[{table}].{key}: no meaning or no example"
            assert f"| `{key}` |" in page
            given = {} if table else {"name": "x"}
            model.model_validate(
                given | {key: info.examples[0]}
            )  # the example is a value the spec takes
    assert keys >= 40


def test_every_commands_usage_line_names_the_command():
    """Issue 56, point 4: `envspec cache gc --help` says `usage: envspec cache gc [-h] ...`, not
    the top parser's usage followed by the command; the same for every command, nested or not."""
    import argparse

    from envspec.cli import build_parser

    def commands(p: argparse.ArgumentParser, path: tuple[str, ...]):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield (*path, name), sub
                    yield from commands(sub, (*path, name))

    found = list(commands(build_parser(), ("envspec",)))
    assert len(found) > 15 and ("envspec", "cache", "gc") in [p for p, _ in found]
    wrong = {
        " ".join(path): sub.format_usage().splitlines()[0]
        for path, sub in found
        if not sub.format_usage().startswith(f"usage: {' '.join(path)} [-h]")
    }
    assert wrong == {}
