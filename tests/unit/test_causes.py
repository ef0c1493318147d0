"""The resolution's facts (envspec.causes): one class per kind, each worded by explain."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from envspec import causes, explain
from envspec.causes import Cause, CauseKind


def _classes() -> list[type[Cause]]:
    out: list[type[Cause]] = []
    todo = [Cause]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if "kind" in sub.__dict__:
                out.append(sub)
    return sorted(out, key=lambda c: c.kind)


def _example(cls: type[Cause]) -> Cause:
    """An instance with every required field filled with a value of its type."""
    kw: dict[str, object] = {}
    hints = typing.get_type_hints(cls, vars(causes))
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            continue
        kw[f.name] = ("<a>", "<b>") if hints[f.name] == tuple[str, ...] else f"<{f.name}>"
    return cls(**kw)  # type: ignore[arg-type]


def test_each_kind_has_one_class():
    kinds = [c.kind for c in _classes()]
    assert sorted(kinds) == sorted(typing.get_args(CauseKind))
    assert len(set(kinds)) == len(kinds)


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.kind)
def test_explain_words_each_kind(cls):
    c = _example(cls)
    said = explain.cause_sentence(c)
    assert said and said != c.kind and "<" in said  # worded, from the fact's own fields
    where = dataclasses.replace(c, where="[torch].version (s.toml:3)")
    assert explain.cause_sentence(where) == f"[torch].version (s.toml:3): {said}"


def test_causes_are_values():  # frozen and hashable: the resolver dedupes them in a set
    c = causes.ArchMissing(gpu="T4", gpu_name="Tesla T4", cc="7.5", variant="cu130", arch_list=())
    assert {c, dataclasses.replace(c)} == {c}
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.gpu = "A100"  # type: ignore[misc]
