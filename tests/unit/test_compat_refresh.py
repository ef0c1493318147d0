"""`envspec db refresh` on recorded PyPI responses (tests/data/compat, see record.py there): no network."""

import io
import json
import shutil
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from envspec.causes import ReleaseNeedsReview
from envspec.cli import main
from envspec.compat import DATA_DIR, load_db, pypi, refresh
from envspec.errors import EXIT_CHECK_FAILED, EXIT_SOURCE, SourceError

REC = Path(__file__).parents[1] / "data" / "compat"
METADATA = {
    p.name[: -len(".metadata")]: p.read_bytes() for p in (REC / "metadata").glob("*.metadata")
}


def _skeleton(filename: str, metadata: bytes) -> bytes:
    """A small zip laid out like the wheel: some files, then the dist-info METADATA (deflated)."""
    name, version = filename.split("-")[:2]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for i in range(20):
            z.writestr(f"{name}/lib/part{i}.py", f"# {i}\n" * 200)
        z.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
        z.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return buf.getvalue()


class RecordedIndex:
    """Serves the recorded responses; wheels as skeleton zips holding the recorded METADATA."""

    def __init__(self, core_metadata: bool = False, broken: set[str] = frozenset()) -> None:
        self.api = (REC / "pypi_torch.json").read_bytes()
        self.simple = json.loads((REC / "simple_torch.json").read_text())
        self.wheels: dict[str, bytes] = {}
        self.calls: list[str] = []
        self.ranges: list[tuple[str, int, int]] = []
        for f in self.simple["files"]:
            meta = METADATA.get(f["filename"])
            if meta is None:
                continue
            if f["filename"].split("-")[1] in broken:
                meta = None
                self.wheels[f["url"]] = b"not a zip at all" * 10
            else:
                self.wheels[f["url"]] = _skeleton(f["filename"], meta)
            f["size"] = len(self.wheels[f["url"]])
            if core_metadata and meta is not None:
                f["core-metadata"] = {"sha256": "0" * 64}

    def fetch(self, url: str) -> bytes:
        self.calls.append(url)
        if url == pypi.JSON_API:
            return self.api
        if url == pypi.SIMPLE_API:
            return json.dumps(self.simple).encode()
        if url.endswith(".metadata"):
            fn = url.rsplit("/", 1)[1][: -len(".metadata")]
            return METADATA[fn]
        raise AssertionError(f"unexpected fetch {url}")

    def fetch_range(self, url: str, start: int, end: int) -> bytes:
        self.ranges.append((url, start, end))
        data = self.wheels[url]
        assert 0 <= start <= end < len(data), (start, end, len(data))
        return data[start : end + 1]


AARCH64 = {
    "torch-2.0.0-1-cp311-cp311-manylinux2014_aarch64.whl",
    "torch-2.9.1-cp314-cp314-manylinux_2_28_aarch64.whl",
    "torch-2.14.1-cp314-cp314-manylinux_2_28_aarch64.whl",
    "torch-2.15.0-cp315-cp315-manylinux_2_28_aarch64.whl",
}


def _refresh(tmp_path, idx, **kw):
    out = tmp_path / "torch_pypi.toml"
    kw.setdefault("since", "2.0.0")
    rep = refresh(
        out,
        fetch=idx.fetch,
        fetch_range=idx.fetch_range if idx else None,
        db_version="2026.11.30",
        date="2026-11-30",
        **kw,
    )
    return out, rep


def _rows(path: Path) -> dict:
    return {r["version"]: r for r in tomllib.loads(path.read_text())["release"]}


def test_refresh_reads_releases_pythons_and_pins_by_range(tmp_path):
    idx = RecordedIndex()
    out, rep = _refresh(tmp_path, idx)
    assert rep.ok and rep.problems == []
    # 1.13.1 is older than `since`, 2.16.0rc1 is a pre-release
    assert rep.releases == ["2.0.0", "2.9.1", "2.14.1", "2.15.0"] == rep.added
    rows = _rows(out)
    r = rows["2.14.1"]
    assert (r["pypi_variant"], r["cuda"], r["cuda_pin"], r["cudnn"], r["nccl"]) == (
        "cu130",
        "13.0",
        "13.0.3",
        "9.24.0.43",
        "2.30.7",
    )
    assert r["python"] == ["3.10", "3.11", "3.12", "3.13", "3.14"] and r["python_freethreaded"] == [
        "3.14"
    ]
    assert r["wheel"] == "torch-2.14.1-cp314-cp314-manylinux_2_28_x86_64.whl"
    assert r["source"].startswith("pypi-metadata")
    r = rows["2.0.0"]
    assert (r["pypi_variant"], r["cuda"], r["cudnn"], r["nccl"]) == (
        "cu117",
        "11.7",
        "8.5.0.96",
        "2.14.3",
    )
    assert r["python"] == ["3.8", "3.9", "3.10", "3.11"]
    assert (rows["2.9.1"]["pypi_variant"], rows["2.9.1"]["cudnn"], rows["2.9.1"]["nccl"]) == (
        "cu128",
        "9.10.2.21",
        "2.27.5",
    )
    assert (rows["2.15.0"]["pypi_variant"], rows["2.15.0"]["cuda_pin"]) == ("cu132", "13.2.2")
    assert rows["2.15.0"]["python"][0] == "3.11"
    # only the picked wheels were read, and only in small ranges (never a whole wheel): each
    # release's x86_64 wheel, and its aarch64 one for the platform check
    assert {u.rsplit("/", 1)[1] for u, _, _ in idx.ranges} == {
        r["wheel"] for r in rows.values()
    } | AARCH64


def test_refresh_uses_pep658_metadata_when_the_index_serves_it(tmp_path):
    idx = RecordedIndex(core_metadata=True)
    out, rep = _refresh(tmp_path, idx)
    assert rep.ok and idx.ranges == []
    assert sum(u.endswith(".metadata") for u in idx.calls) == 8  # 4 releases, x86_64 and aarch64
    other = tmp_path / "by-range"
    other.mkdir()
    assert _rows(out) == _rows(_refresh(other, RecordedIndex())[0])


def test_refresh_is_deterministic_and_reports_no_change_the_second_time(tmp_path):
    out, _ = _refresh(tmp_path, RecordedIndex())
    first = out.read_bytes()
    _, rep = _refresh(tmp_path, RecordedIndex())
    assert out.read_bytes() == first
    assert rep.added == [] and rep.changed == [] and rep.removed == []
    assert first.endswith(b"\n") and b"\r" not in first


def test_refresh_reports_changes(tmp_path):
    out, _ = _refresh(tmp_path, RecordedIndex())
    out.write_text(out.read_text().replace('nccl = "2.30.7"', 'nccl = "2.30.6"', 1))
    _, rep = _refresh(tmp_path, RecordedIndex())
    assert rep.changed == ["2.14.1"]


def test_since_reaches_back_and_keeps_older_rows(tmp_path):
    out, rep = _refresh(tmp_path, RecordedIndex(), since="1.13.0")
    r = _rows(out)["1.13.1"]
    assert (r["pypi_variant"], r["cuda"], r["cudnn"], r["nccl"]) == (
        "cu117",
        "11.7",
        "8.5.0.96",
        "",
    )  # NCCL static
    # a later refresh from 2.0.0 keeps the 1.13.1 row it was not asked to re-read
    _, rep = _refresh(tmp_path, RecordedIndex(), since="2.0.0")
    assert "1.13.1" in _rows(out) and rep.removed == [] and rep.releases[0] == "1.13.1"


def test_unreadable_metadata_is_a_problem_and_the_old_row_stays(tmp_path):
    out, _ = _refresh(tmp_path, RecordedIndex())
    before = _rows(out)["2.9.1"]
    _, rep = _refresh(tmp_path, RecordedIndex(broken={"2.9.1"}))
    assert (
        not rep.ok
        and len(rep.problems) == 1
        and rep.problems[0].startswith("2.9.1: cannot read the metadata")
    )
    assert _rows(out)["2.9.1"] == before


def test_without_range_fetcher_or_pep658_nothing_is_written(tmp_path):
    idx = RecordedIndex()
    out = tmp_path / "torch_pypi.toml"
    rep = refresh(out, fetch=idx.fetch, db_version="2026.11.30", date="2026-11-30")
    assert len(rep.problems) == 4 and "no range fetcher" in rep.problems[0]
    assert not out.exists()


def test_refreshed_file_loads_with_the_curated_data(tmp_path):
    d = tmp_path / "data"
    shutil.copytree(DATA_DIR, d)
    _refresh(d, RecordedIndex())
    db = load_db(d)
    assert [r.version for r in db.torch_releases] == ["2.0.0", "2.9.1", "2.14.1", "2.15.0"]
    v = db.torch_release("2.14.1").variants["cu130"]
    assert v.pypi and v.cudnn == "9.24.0.43" and v.arch_list[-1] == "sm_120"


def test_bundled_generated_file_is_in_canonical_form():
    text = (DATA_DIR / "torch_pypi.toml").read_text()
    data = tomllib.loads(text)
    assert pypi.render(data["release"], data["db_version"], data["date"]) == text


def test_zip64_wheels_are_read(tmp_path, monkeypatch):
    # force zip64 records (EOCD64 and 0xFFFFFFFF fields in the central directory) on a small zip
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 16)
    meta = METADATA["torch-2.14.1-cp314-cp314-manylinux_2_28_x86_64.whl"]
    data = _skeleton("torch-2.14.1-cp314-cp314-manylinux_2_28_x86_64.whl", meta)
    monkeypatch.undo()
    assert b"PK\x06\x06" in data
    got = pypi.read_zip_member(
        "u", len(data), ".dist-info/METADATA", lambda u, s, e: data[s : e + 1]
    )
    assert got == meta


# ---- the pure helpers ---------------------------------------------------------------------------


def test_pins_from_every_metadata_style():
    old = (
        'Requires-Dist: nvidia-cuda-runtime-cu11 (==11.7.99) ; platform_system == "Linux"\n'
        'Requires-Dist: nvidia-cudnn-cu11 (==8.5.0.96) ; platform_system == "Linux"\n'
    )
    mid = (
        'Requires-Dist: nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux" and platform_machine == "x86_64"\n'
        'Requires-Dist: nvidia-nccl-cu12==2.27.5; platform_system == "Linux" and platform_machine == "x86_64"\n'
        'Requires-Dist: nvidia-cudnn-cu12==9.10.2.21; platform_system == "Linux" and platform_machine == "x86_64"\n'
    )
    new = (
        'Requires-Dist: cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"\n'
        'Requires-Dist: nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"\n'
        'Requires-Dist: nvidia-nccl-cu13==2.30.7; platform_system == "Linux"\n'
        'Requires-Dist: nvidia-nccl-cu13==9.9.9; platform_system == "Windows"\n'
    )
    assert pypi.pins_from_metadata(old) == {
        "cuda": "11.7",
        "cuda_pin": "11.7.99",
        "cudnn": "8.5.0.96",
        "nccl": None,
        "variant": "cu117",
    }
    assert pypi.pins_from_metadata(mid)["variant"] == "cu128"
    assert pypi.pins_from_metadata(new) == {
        "cuda": "13.0",
        "cuda_pin": "13.0.3",
        "cudnn": "9.24.0.43",
        "nccl": "2.30.7",
        "variant": "cu130",
    }
    assert pypi.pins_from_metadata("Name: torch\n")["variant"] is None


def test_pythons_from_file_names():
    files = [
        "torch-2.0.0-1-cp38-cp38-manylinux2014_aarch64.whl",
        "torch-2.0.0-cp38-cp38-manylinux1_x86_64.whl",
        "torch-2.0.0-cp311-cp311-win_amd64.whl",
        "torch-2.9.1-cp313-cp313t-manylinux_2_28_x86_64.whl",
        "torch-2.9.1-cp310-cp310-manylinux_2_28_x86_64.whl",
        "torch-2.0.0.tar.gz",
        "garbage.whl",
    ]
    assert pypi.linux_x86_64_pythons(files) == (["3.8", "3.10"], ["3.13"])


# ---- what the report says, and `envspec db refresh` (--json) with its exit codes ----------------


class UnansweringIndex(RecordedIndex):
    """The recorded index, but the wheel of ``silent`` does not answer (as urllib's fetchers fail)."""

    def __init__(self, silent: str, **kw) -> None:
        super().__init__(**kw)
        self.silent = silent

    def fetch_range(self, url: str, start: int, end: int) -> bytes:
        if f"torch-{self.silent}-" in url:
            raise SourceError(f"cannot read {url}: timed out", hint="check the network")
        return super().fetch_range(url, start, end)


def test_report_partitions_the_releases(tmp_path):
    out, rep = _refresh(tmp_path, RecordedIndex(), since="1.13.0")
    assert (
        rep.written and rep.added == rep.releases and rep.unchanged == rep.changed == rep.kept == []
    )
    out.write_text(out.read_text().replace('nccl = "2.30.7"', 'nccl = "2.30.6"', 1))
    _, rep = _refresh(tmp_path, RecordedIndex(broken={"2.9.1"}), since="2.0.0")
    assert (rep.added, rep.changed, rep.unchanged, rep.kept, rep.removed) == (
        [],
        ["2.14.1"],
        ["2.0.0", "2.15.0"],
        ["1.13.1", "2.9.1"],
        [],
    )
    assert sorted(rep.added + rep.changed + rep.unchanged + rep.kept, key=Version) == rep.releases
    assert rep.source_errors == [] and len(rep.problems) == 1
    assert rep.to_json() == {
        "ok": False,
        "output": str(out),
        "written": True,
        "releases": rep.releases,
        "added": [],
        "changed": ["2.14.1"],
        "unchanged": ["2.0.0", "2.15.0"],
        "kept": ["1.13.1", "2.9.1"],
        "removed": [],
        "problems": rep.problems,
        "source_errors": [],
        # 1.13.1 predates the curated rows: no cu117 row covers it, no older release carries one
        "needs_review": {"1.13.1": [rep.needs_review["1.13.1"][0]]},
        "platform_review": {},
    }
    assert rep.needs_review["1.13.1"][0].startswith("no cu117 row in torch_variants.toml")


def test_an_index_that_does_not_answer_is_a_source_error(tmp_path):
    _, rep = _refresh(tmp_path, UnansweringIndex("2.9.1"))
    assert len(rep.problems) == 1 and rep.source_errors == rep.problems
    assert (
        rep.source_errors[0].startswith("2.9.1: cannot read the metadata")
        and "timed out" in rep.source_errors[0]
    )


def _cli(monkeypatch, capsys, idx, out, *extra):
    monkeypatch.setattr(pypi, "default_fetch", idx.fetch)
    monkeypatch.setattr(pypi, "default_fetch_range", idx.fetch_range)
    code = main(["db", "refresh", "-o", str(out), *extra])
    return code, capsys.readouterr()


def test_cli_refresh_json_says_what_it_did(tmp_path, monkeypatch, capsys):
    out = tmp_path / "torch_pypi.toml"
    code, cap = _cli(monkeypatch, capsys, RecordedIndex(), out, "--json")
    rep = json.loads(cap.out)
    assert code == 0 and rep["ok"] is True and rep["written"] is True and rep["output"] == str(out)
    assert rep["added"] == ["2.0.0", "2.9.1", "2.14.1", "2.15.0"] and rep["problems"] == []
    code, cap = _cli(monkeypatch, capsys, RecordedIndex(), out, "--json")
    rep = json.loads(cap.out)
    assert (
        code == 0
        and rep["added"] == []
        and rep["unchanged"] == ["2.0.0", "2.9.1", "2.14.1", "2.15.0"]
    )


def test_cli_refresh_exits_1_when_a_release_cannot_be_read(tmp_path, monkeypatch, capsys):
    out = tmp_path / "torch_pypi.toml"
    _cli(monkeypatch, capsys, RecordedIndex(), out, "--json")
    code, cap = _cli(monkeypatch, capsys, RecordedIndex(broken={"2.9.1"}), out, "--json")
    rep = json.loads(cap.out)
    assert code == EXIT_CHECK_FAILED == 1
    assert (
        rep["ok"] is False
        and rep["kept"] == ["2.9.1"]
        and rep["problems"][0].startswith("2.9.1: cannot read")
    )
    code, cap = _cli(
        monkeypatch, capsys, RecordedIndex(broken={"2.9.1"}), out
    )  # the words, same code
    assert (
        code == 1 and "4 releases (0 added, 0 changed, 3 unchanged, 1 kept, 0 removed)" in cap.out
    )
    assert "problem: 2.9.1: cannot read the metadata" in cap.err and "hint:" in cap.err


def test_cli_refresh_exits_3_when_an_index_does_not_answer(tmp_path, monkeypatch, capsys):
    out = tmp_path / "torch_pypi.toml"
    code, cap = _cli(monkeypatch, capsys, UnansweringIndex("2.9.1"), out, "--json")
    rep = json.loads(cap.out)
    assert code == EXIT_SOURCE == 3
    assert rep["ok"] is False and rep["written"] is True and len(rep["source_errors"]) == 1


def test_cli_refresh_exits_3_when_pypi_does_not_answer_at_all(tmp_path, monkeypatch, capsys):
    def down(url: str) -> bytes:
        raise SourceError(f"cannot read {url}: connection refused")

    monkeypatch.setattr(pypi, "default_fetch", down)
    out = tmp_path / "torch_pypi.toml"
    code = main(["db", "refresh", "-o", str(out), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 3 and rep["ok"] is False and rep["error"]["reference"] == "source-unavailable"
    assert not out.exists()


def test_cli_refresh_words(tmp_path, monkeypatch, capsys):
    code, cap = _cli(monkeypatch, capsys, RecordedIndex(), tmp_path / "torch_pypi.toml")
    assert code == 0 and cap.err == ""
    assert (
        f"wrote {tmp_path / 'torch_pypi.toml'}: 4 releases (4 added, 0 changed, 0 unchanged"
        in cap.out
    )
    assert "added: 2.0.0, 2.9.1, 2.14.1, 2.15.0" in cap.out


# ---- a release the DB does not know yet (tests/data/compat/next: fabricated 2.16.0 on CUDA 13.5,
# 2.17.0 on CUDA 13.6) ---------------------------------------------------------------------------

NEXT = REC / "next"


class NextIndex:
    """The fabricated next releases, served with PEP 658 metadata."""

    def __init__(self) -> None:
        self.simple = json.loads((NEXT / "simple_torch.json").read_text())
        self.meta = {
            p.name[: -len(".metadata")]: p.read_bytes()
            for p in (NEXT / "metadata").glob("*.metadata")
        }
        for f in self.simple["files"]:
            if f["filename"] in self.meta:
                f["core-metadata"] = {"sha256": "0" * 64}

    def fetch(self, url: str) -> bytes:
        if url == pypi.JSON_API:
            return (NEXT / "pypi_torch.json").read_bytes()
        if url == pypi.SIMPLE_API:
            return json.dumps(self.simple).encode()
        if url.endswith(".metadata"):
            return self.meta[url.rsplit("/", 1)[1][: -len(".metadata")]]
        raise AssertionError(f"unexpected fetch {url}")

    def fetch_range(self, url: str, start: int, end: int) -> bytes:
        raise AssertionError("PEP 658 metadata is served: no range requests")


def _data_copy(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(DATA_DIR, d)
    return d


def test_refresh_adds_a_release_on_an_unknown_cuda_and_marks_it_for_review(tmp_path):
    d = _data_copy(tmp_path)
    out, rep = _refresh(d, NextIndex(), since="2.15.0")
    assert rep.written and rep.added == ["2.16.0", "2.17.0"] and rep.problems == []
    assert not rep.ok and sorted(rep.needs_review) == ["2.16.0", "2.17.0"]
    assert any("no cu135 row in torch_variants.toml" in i for i in rep.needs_review["2.16.0"])
    assert not any(
        "cuda.toml" in i for i in rep.needs_review["2.16.0"]
    )  # 13.5 has a (partly estimated) row
    assert any(i.startswith("CUDA 13.6 is not in cuda.toml") for i in rep.needs_review["2.17.0"])
    rows = _rows(out)
    # what could be derived is kept: Python versions, variant, pins
    r = rows["2.16.0"]
    assert (r["pypi_variant"], r["cuda"], r["cuda_pin"], r["cudnn"], r["nccl"]) == (
        "cu135",
        "13.5",
        "13.5.0",
        "9.28.0.30",
        "2.31.2",
    )
    assert (
        r["python"] == ["3.11", "3.12", "3.13", "3.14", "3.15"]
        and r["needs_review"] == rep.needs_review["2.16.0"]
    )
    assert "needs_review" not in rows["2.15.0"] and "2.0.0" in rows  # older rows kept as they were
    # the DB still loads; the releases carry what needs review and offer no build they cannot describe
    db = load_db(d)
    rel = db.torch_release("2.16.0")
    assert rel is not None and rel.needs_review == r["needs_review"] and "cu135" not in rel.variants
    assert db.torch_release("2.17.0").needs_review and db.torch_release("2.15.0").needs_review == []
    # the reviewer adds the missing rows: the next refresh clears the marks
    (d / "torch_variants.toml").write_text(
        (d / "torch_variants.toml").read_text()
        + """
[[build]]
torch = ">=2.16"
variant = "cu135"
cuda = "13.5"
cudnn = "=pypi"
nccl = "=pypi"
arch_list = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
source = "test: curated after review"
"""
    )
    _, rep = _refresh(d, NextIndex(), since="2.15.0")
    assert list(rep.needs_review) == ["2.17.0"] and "needs_review" not in _rows(out)["2.16.0"]


def test_resolution_skips_releases_that_need_review(tmp_path, monkeypatch, capsys):
    from envspec.errors import ResolutionImpossible
    from envspec.resolve import choose
    from envspec.spec import load_spec

    d = _data_copy(tmp_path)
    _refresh(d, NextIndex(), since="2.15.0")
    db = load_db(d)
    spec = tmp_path / "next.toml"
    spec.write_text('name = "next"\n[target]\ngpus = ["B200"]\n[torch]\nversion = ">=2.15"\n')
    choice = choose(load_spec(spec), db)
    assert choice.torch is not None and choice.torch.release.version == "2.15.0"
    assert any(n.startswith("torch 2.17.0 is in the DB but needs review") for n in choice.notes)
    spec.write_text('name = "next"\n[target]\ngpus = ["B200"]\n[torch]\nversion = "2.16.*"\n')
    try:
        choose(load_spec(spec), db)
    except ResolutionImpossible as e:
        assert e.reference == "release-needs-review" and e.exit_code == 2
        assert any(
            isinstance(c, ReleaseNeedsReview) and c.where.startswith("[torch].version")
            for c in e.causes
        )
    else:
        raise AssertionError("a release that needs review was resolved")


def test_cli_refresh_exits_1_and_lists_what_needs_review(tmp_path, monkeypatch, capsys):
    d = _data_copy(tmp_path)
    out = d / "torch_pypi.toml"
    out.unlink()
    code, cap = _cli(monkeypatch, capsys, NextIndex(), out, "--json")
    rep = json.loads(cap.out)
    assert code == EXIT_CHECK_FAILED and rep["ok"] is False and rep["written"] is True
    assert rep["added"] == ["2.15.0", "2.16.0", "2.17.0"] and sorted(rep["needs_review"]) == [
        "2.16.0",
        "2.17.0",
    ]
    code, cap = _cli(monkeypatch, capsys, NextIndex(), out)
    assert code == 1 and "needs review: torch 2.17.0: CUDA 13.6 is not in cuda.toml" in cap.err
    assert "needs review: torch 2.16.0: no cu135 row" in cap.err


def test_the_platform_check_reads_which_build_pypis_aarch64_wheel_is():
    idx = RecordedIndex()
    found, problems = pypi.platform_builds(
        idx.fetch, idx.fetch_range, ["2.0.0", "2.9.1", "2.14.1", "2.15.0"]
    )
    assert problems == []
    # <= 2.9.1: nvidia-* marked platform_machine == "x86_64" (a CPU build); 2.14.1/2.15.0: unmarked (CUDA)
    assert {v: b["variant"] for v, b in found.items()} == {
        "2.0.0": "cpu",
        "2.9.1": "cpu",
        "2.14.1": "cu130",
        "2.15.0": "cu132",
    }
    assert {b["wheel"] for b in found.values()} == AARCH64
    # the bundled torch_platforms.toml agrees with every one
    assert pypi.platform_review(found, DATA_DIR) == {}


def test_refresh_flags_what_torch_platforms_toml_lacks_and_exits_1(tmp_path, monkeypatch, capsys):
    """Yesterday's curated data (aarch64: the CPU build for <= 2.9.1, nothing newer) against PyPI's
    recorded aarch64 wheels: 2.14.1 and 2.15.0 are CUDA builds it has no row for."""
    d = _data_copy(tmp_path)
    rows = (d / "torch_platforms.toml").read_text().split("[[pypi]]")
    (d / "torch_platforms.toml").write_text(rows[0] + "[[pypi]]" + rows[1].rstrip() + "\n")
    out, rep = _refresh(d, RecordedIndex())
    assert not rep.ok and rep.problems == [] and rep.needs_review == {}
    assert sorted(rep.platform_review) == ["2.14.1", "2.15.0"]
    item = rep.platform_review["2.14.1"][0]
    assert (
        "is the cu130 build" in item and "no row for torch 2.14.1" in item and "arch_list" in item
    )
    code, cap = _cli(monkeypatch, capsys, RecordedIndex(), d / "torch_pypi.toml")
    assert code == EXIT_CHECK_FAILED
    assert (
        "needs review: torch 2.15.0: PyPI's linux-aarch64 wheel" in cap.err
        and "is the cu132 build" in cap.err
    )
    # a row that names another build is flagged too
    (d / "torch_platforms.toml").write_text(
        (d / "torch_platforms.toml")
        .read_text()
        .replace('torch = ">=2.0,<=2.9.1"', 'torch = ">=2.0,<=2.14.1"')
    )
    _, rep = _refresh(d, RecordedIndex())
    assert "torch_platforms.toml says cpu" in rep.platform_review["2.14.1"][0]


def test_a_simple_api_file_is_read_into_a_model_where_the_page_is_read():
    """PyPI's JSON simple page becomes PypiFile models at once: PEP 714's core-metadata first,
    PEP 658's name where only that is given, yanked kept as given; a file entry that is not as
    PEP 691 says names the page, the entry and the field."""
    from envspec.compat.pypi import SIMPLE_API, _files_by_version
    from envspec.errors import SourceError

    wheel = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    files = [
        {
            "filename": wheel,
            "url": "https://f/" + wheel,
            "size": 10,
            "core-metadata": False,
            "dist-info-metadata": {"sha256": "ab"},
        },
        {
            "filename": wheel.replace("cp311", "cp312"),
            "url": "u",
            "dist-info-metadata": True,
            "yanked": "broken",
        },
        {"filename": "torch-2.14.1.tar.gz", "url": "u"},
    ]
    (a, b) = _files_by_version({"files": files})["2.14.1"]
    assert (a.filename, a.size, a.metadata_served, a.yanked) == (wheel, 10, False, None)
    assert (b.size, b.metadata_served, b.yanked) == (0, True, "broken")
    with pytest.raises(SourceError, match=rf"{SIMPLE_API}: files\[1\]\.size") as e:
        _files_by_version({"files": [files[0], {"filename": wheel, "size": "big"}]})
    assert e.value.reference == "index-unavailable"
