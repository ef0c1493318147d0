"""Every case in tests/data/gpu_facts/ (a spec, what `envspec explain --json` must answer, and the
source of the fact) holds: driver branches per GPU, the platform of Grace systems, wheel-true pins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envspec.cli import main

ROOT = Path(__file__).parent.parent / "data" / "gpu_facts"
CASES = sorted(p for p in ROOT.iterdir() if p.is_dir())


def test_every_case_is_complete():
    assert len(CASES) >= 12
    for case in CASES:
        assert {p.name for p in case.iterdir()} >= {"spec.toml", "expect.json", "source.md"}, case
        assert (case / "source.md").read_text().strip(), f"{case.name}: a fact needs its source"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_explain_answers_the_fact(case: Path, capsys):
    exp = json.loads((case / "expect.json").read_text())
    spec = case / "spec.toml"
    code = main(["explain", str(spec), "--json"])
    cap = capsys.readouterr()
    assert code == exp["exit"], cap.out + cap.err
    out = json.loads(cap.out)
    if exp["exit"] == 0:
        assert {k: out.get(k) for k in exp["json"]} == exp["json"]
        return
    err = out["error"]
    assert out["ok"] is False and err["reference"] == exp["reference"]
    cause = next(c for c in err["causes"] if c["reference"] == exp["reference"])
    assert (cause["path"], cause["line"]) == (exp["path"], exp["line"])
    for words in exp["says"]:
        assert words in cause["message"], cause["message"]
    for words in exp.get("hint_says", []):
        assert words in cause["hint"], cause["hint"]
    # the human form names the spec's file and line, with the reference
    assert main(["explain", str(spec)]) == 2
    text = capsys.readouterr().err
    assert f"{spec}:{exp['line']}" in text and exp["reference"] in text
