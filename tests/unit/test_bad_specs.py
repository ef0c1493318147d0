"""Every bad spec in tests/data/bad_specs/ gets a clear error: file, key, line, exit 2, nothing written.

Each case is a spec whose first line says what is expected:
``# expect: reference=... path=... line=N hint=...``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envspec.cli import main

CASES = sorted((Path(__file__).parent.parent / "data" / "bad_specs").glob("*.toml"))


def expectation(path: Path) -> dict[str, str]:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), path
    return dict(kv.split("=", 1) for kv in first[len("# expect:") :].split())


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_bad_spec(case: Path, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")  # every case fails before any index is asked
    exp = expectation(case)
    out = tmp_path / "out.lock"
    code = main(["lock", str(case), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not out.exists()
    assert not list(tmp_path.iterdir()), "nothing half-written"
    assert str(case) in err, f"the file is named:\n{err}"
    assert exp["reference"] in err, err
    if "path" in exp:
        assert exp["path"] in err, err
    if "line" in exp:
        assert f"{case}:{exp['line']}" in err, f"line {exp['line']} is named:\n{err}"
    hints = [line.strip() for line in err.splitlines() if line.strip().startswith("hint:")]
    assert len(hints) == len(set(hints)), f"each hint is printed once:\n{err}"
    if "hint" in exp:
        assert re.search(r"(hint|did you mean|needs).*" + re.escape(exp["hint"]), err, re.S), err


@pytest.mark.parametrize("case", CASES[:3], ids=[c.stem for c in CASES[:3]])
def test_old_lock_survives_a_bad_spec(case: Path, tmp_path: Path):
    out = tmp_path / "x.lock"
    out.write_text("old content\n")
    assert main(["lock", str(case), "-o", str(out)]) == 2
    assert out.read_text() == "old content\n"
