"""Torch and the packages the spec names, chosen together (resolve.with_packages): the cases of
tests/data/resolve_packages/, each resolved offline against tiny wheels made from its index.toml."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from envspec.causes import PythonMissing, Said
from envspec.compat import load_db
from envspec.resolve import choose, held_back, resolve_python, with_packages
from envspec.sources import ResolvedSources
from envspec.spec import load_spec

CASES = Path(__file__).resolve().parents[1] / "data" / "resolve_packages"


def make_wheel(
    dest: Path, name: str, version: str, requires: list[str], python: str = "", empty: bool = False
) -> Path:
    """``{name}-{version}-py3-none-any.whl`` with ``Requires-Dist`` lines (and ``Requires-Python``),
    fixed bytes; ``empty``: its metadata alone (a placeholder release)."""
    mod = name.replace("-", "_")
    di = f"{mod}-{version}.dist-info"
    meta = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + (f"Requires-Python: {python}\n" if python else "")
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    files = {
        **({} if empty else {f"{mod}/__init__.py": b""}),
        f"{di}/METADATA": meta.encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: envspec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rec = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).decode().rstrip('=')},{len(d)}\n"
        for p, d in sorted(files.items())
    )
    files[f"{di}/RECORD"] = (rec + f"{di}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p in sorted(files):
            z.writestr(zipfile.ZipInfo(p, date_time=(1980, 1, 1, 0, 0, 0)), files[p])
    out = dest / f"{mod}-{version}-py3-none-any.whl"
    out.write_bytes(buf.getvalue())
    return out


def make_sdist(dest: Path, name: str, version: str, requires: list[str]) -> None:
    """``{name}-{version}.tar.gz`` with a static PKG-INFO (metadata 2.2: nothing dynamic)."""
    meta = (
        f"Metadata-Version: 2.2\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data in (
            (f"{name}-{version}/PKG-INFO", meta),
            (f"{name}-{version}/pyproject.toml", b'[build-system]\nrequires = ["setuptools"]\n'),
        ):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (dest / f"{name}-{version}.tar.gz").write_bytes(buf.getvalue())


def offline_sources(case: Path, tmp: Path) -> ResolvedSources:
    index = tmp / "index"
    index.mkdir()
    listed = tomllib.loads((case / "index.toml").read_text())
    if any("yanked" in w for w in listed["wheel"]):
        return ResolvedSources(index=simple_index(index, listed["wheel"]))
    for w in listed["wheel"]:
        make_wheel(
            index,
            w["name"],
            w["version"],
            w.get("requires", []),
            w.get("python", ""),
            w.get("empty", False),
        )
    for s in listed.get("sdist", []):
        make_sdist(index, s["name"], s["version"], s.get("requires", []))
    return ResolvedSources(index=index.as_uri())  # a wheelhouse as the canonical index


def simple_index(root: Path, wheels: list[dict]) -> str:
    """A PEP 503 simple index of the wheels in ``root`` (a folder per project), where a release can
    be yanked (PEP 592's ``data-yanked``): a find-links folder cannot say that."""
    import html

    pages: dict[str, list[str]] = {}
    for w in wheels:
        project = root / w["name"]
        project.mkdir(exist_ok=True)
        f = make_wheel(project, w["name"], w["version"], w.get("requires", []), w.get("python", ""))
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        yanked = f' data-yanked="{html.escape(w["yanked"])}"' if "yanked" in w else ""
        pages.setdefault(w["name"], []).append(
            f'<a href="{f.name}#sha256={digest}"{yanked}>{f.name}</a>'
        )
    for name, links in pages.items():
        (root / name / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    (root / "index.html").write_text(
        "<html><body>" + "".join(f'<a href="{n}/">{n}</a>' for n in pages) + "</body></html>"
    )
    return root.as_uri()


def cli_spec(case: str, tmp: Path, monkeypatch, *, edit: tuple[str, str] = ("", "")) -> Path:
    """The case's spec for the command line: offline, its index as the only mirror, a cache of its own."""
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp / "cache"))
    index = offline_sources(CASES / case, tmp).index
    spec = tmp / f"{case}.toml"
    spec.write_text(
        (CASES / case / "spec.toml").read_text().replace(*edit)
        + f'\n[sources]\nindex = "{index}"\nuse_pip_config = false\n'
    )
    return spec


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_case(case, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")  # no socket: the find-links folder is the index
    d = CASES / case
    want = tomllib.loads((d / "expected.toml").read_text())
    db = load_db()
    first = choose(load_spec(d / "spec.toml"), db)
    sources = offline_sources(d, tmp_path)
    choice = with_packages(first, db, sources, workdir=tmp_path / "work")
    assert choice.torch is not None and choice.torch.release.version == want["torch"], want["note"]
    assert [h.to_json() for h in choice.passed_over] == want["passed_over"], want["note"]
    wheels = resolve_python(choice, sources, workdir=tmp_path / "work")
    pins = {w.name: w.version for w in wheels}
    assert pins["torch"] == want["torch"]
    assert {k: pins.get(k) for k in want["packages"]} == want["packages"], want["note"]
    assert held_back(choice, wheels, sources, workdir=tmp_path / "work") == want.get(
        "packages_held_back", {}
    ), want["note"]
    # the build follows the release: the same as choosing that release outright
    assert (
        choice.torch.variant
        == choose(load_spec(d / "spec.toml"), db, torch_version=want["torch"]).torch.variant
    )


def test_without_with_packages_the_old_order_locks_an_ancient_release(tmp_path, monkeypatch):
    """What the cases guard against: torch first, then the packages around it."""
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    d = CASES / "newest-package-decides-torch"
    sources = offline_sources(d, tmp_path)
    first = choose(load_spec(d / "spec.toml"), load_db())
    pins = {w.name: w.version for w in resolve_python(first, sources, workdir=tmp_path / "work")}
    assert (pins["torch"], pins["vllm"]) == ("2.15.0", "0.2.2")


def test_lock_says_which_package_held_torch_back(tmp_path, monkeypatch, capsys):
    import json

    from envspec import lock as lockmod
    from envspec.cli import main

    spec = cli_spec("newest-package-decides-torch", tmp_path, monkeypatch)
    out = tmp_path / "vllm.lock"
    assert main(["lock", str(spec), "-o", str(out), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["torch"] == [
        {
            "platform": "linux-x86_64",
            "version": "2.14.0",
            "passed_over": [
                {
                    "torch": "2.15.0",
                    "package": "vllm",
                    "version": "0.34.0",
                    "requires": "torch==2.14.0",
                },
                {
                    "torch": "2.14.1",
                    "package": "vllm",
                    "version": "0.34.0",
                    "requires": "torch==2.14.0",
                },
            ],
        }
    ]
    lock = lockmod.load(out)
    assert {w.name: w.version for w in lock.wheels if w.name in ("torch", "vllm")} == {
        "torch": "2.14.0",
        "vllm": "0.34.0",
    }
    out.unlink()
    assert main(["lock", str(spec), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "torch 2.14.0 was chosen together with the packages the spec names" in err
    assert "torch 2.15.0: vllm 0.34.0 requires torch==2.14.0" in err
    assert main(["lock", str(spec), "-o", str(out), "--check"]) == 0  # the lock is true to its spec


def _spec_with(tmp: Path, case: str, **changes: str) -> Path:
    text = (CASES / case / "spec.toml").read_text()
    for old, new in changes.items():
        text = text.replace(old, new)
    out = tmp / "spec.toml"
    out.write_text(text)
    return out


def test_a_conflict_names_the_package_whose_pin_binds_torch(tmp_path, monkeypatch):
    from envspec.errors import ResolutionImpossible

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = "newest-package-decides-torch"
    spec = load_spec(
        _spec_with(tmp_path, case, **{'"2.*"': '"2.15.*"', '["vllm"]': '["vllm>=0.30"]'})
    )
    sources = offline_sources(CASES / case, tmp_path)
    choice = with_packages(
        choose(spec, load_db()), load_db(), sources, workdir=tmp_path / "w"
    )  # one release fits
    with pytest.raises(ResolutionImpossible) as e:
        resolve_python(choice, sources, workdir=tmp_path / "w")
    err = e.value
    assert err.reference == "python-conflict"
    assert err.hint.startswith(
        'vllm>=0.34.0 requires torch==2.14.0, and [torch].version = "==2.15.*" gives torch 2.15.0: '
        'set [torch].version = "2.14.*"'
    ), err.hint
    said = " ".join(c.text for c in err.causes if isinstance(c, Said))
    assert "envspec chose torch==2.15.0" in said and "you require torch==2.15.0" not in said


def test_a_conflict_over_another_pin_is_named_not_blamed_on_torch(tmp_path, monkeypatch):
    """Issue 57, 4: vllm==0.33.0 pins torch==2.14.0 and xgrammar==0.2.8, the spec asks for
    xgrammar==0.1.10. Each installs beside torch 2.14.0, so torch is no side: the lock resolves at
    that release and says the xgrammar conflict, where it used to keep the newest torch and hint at
    [torch].version (which would then fail over xgrammar)."""
    from envspec.errors import ResolutionImpossible

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = tmp_path / "case"
    case.mkdir()
    (case / "index.toml").write_text(
        "".join(
            f'[[wheel]]\nname = "{n}"\nversion = "{v}"\nrequires = {r!r}\n'.replace("'", '"')
            for n, v, r in (
                ("torch", "2.14.0", []),
                ("torch", "2.14.1", []),
                ("torch", "2.15.0", []),
                ("vlm", "0.33.0", ["torch==2.14.0", "gram==0.2.8"]),
                ("gram", "0.1.10", ["torch"]),
                ("gram", "0.2.8", ["torch"]),
            )
        )
    )
    spec = load_spec(
        _spec_with(
            tmp_path,
            "newest-package-decides-torch",
            **{'["vllm"]': '["vlm==0.33.0", "gram==0.1.10"]'},
        )
    )
    sources = offline_sources(case, tmp_path)
    choice = with_packages(choose(spec, load_db()), load_db(), sources, workdir=tmp_path / "w")
    assert choice.torch is not None and choice.torch.release.version == "2.14.0"
    with pytest.raises(ResolutionImpossible) as e:
        resolve_python(choice, sources, workdir=tmp_path / "w")
    said = " ".join(c.text for c in e.value.causes if isinstance(c, Said))
    assert e.value.reference == "python-conflict"
    assert "gram==0.2.8" in said and "gram==0.1.10" in said and "torch" not in e.value.hint


def test_the_torch_builds_index_not_answering_is_exit_3_with_what_pypi_offers(
    tmp_path, monkeypatch
):
    from envspec.errors import EXIT_SOURCE, SourceError

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")  # download.pytorch.org does not answer
    spec = load_spec(
        _spec_with(
            tmp_path,
            "no-pin-keeps-newest-torch",
            **{'"H100"': '"A100", "H100"', '"580.65.06"': '"535.104.05"'},
        )
    )
    choice = choose(spec, load_db())
    assert choice.torch is not None and choice.torch.variant.local  # a build of the PyTorch index
    with pytest.raises(SourceError) as e:
        resolve_python(
            choice,
            offline_sources(CASES / "no-pin-keeps-newest-torch", tmp_path),
            workdir=tmp_path / "w",
        )
    err = e.value
    assert (err.reference, err.exit_code) == ("index-unavailable", EXIT_SOURCE)
    assert f"torch {choice.torch.release.version}+{choice.torch.variant.local}" in err.message
    assert choice.torch.variant.index in err.message and "which does not answer" in err.message
    assert "PyPI serves torch" in err.message and "mirror" in err.hint


def test_a_misspelled_package_gets_did_you_mean_at_its_place_in_the_spec(tmp_path, monkeypatch):
    from envspec.errors import ResolutionImpossible

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    case = "no-pin-keeps-newest-torch"
    sources = offline_sources(CASES / case, tmp_path)
    make_wheel(tmp_path / "index", "transformers", "5.16.1", [])
    spec_path = _spec_with(tmp_path, case, **{'["accelerate"]': '["accelerate", "transfomers>=5"]'})
    with pytest.raises(ResolutionImpossible) as e:
        resolve_python(choose(load_spec(spec_path), load_db()), sources, workdir=tmp_path / "w")
    err = e.value
    assert err.reference == "unknown-python-package"
    assert err.hint == "'transfomers': did you mean 'transformers'?"
    assert err.causes == [
        PythonMissing(
            where=f"[python].packages[1] ({spec_path}:9)",
            text="no configured index has a package named 'transfomers'; did you mean 'transformers'?",
        )
    ]


def test_close_names_takes_one_or_two_edits_fewest_first():
    from envspec.sources import close_names

    names = {
        "transformers",
        "ctransformers",
        "pytorch",
        "vllm",
        "llmm",
        "xformers",
        "exformer",
        "numpy",
    }
    assert close_names("transfomers", names) == ["transformers", "ctransformers"]
    assert close_names("pytroch", names) == ["pytorch"]  # an adjacent swap is one edit
    assert close_names("vllmm", names) == ["vllm", "llmm"]  # the same first letter first
    assert close_names("xformer", names)[0] == "xformers"
    assert close_names("Flash_Atn", {"flash-attn"}) == [
        "flash-attn"
    ]  # names are compared normalized
    assert close_names("tensorflow", names) == []


def test_a_held_back_package_is_a_warning_in_the_lock_and_an_error_where_the_spec_says(
    tmp_path, monkeypatch, capsys
):
    import json

    from envspec import lock as lockmod
    from envspec.cli import main
    from envspec.errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED

    case = "held-back-by-a-torch-pin"
    why = tomllib.loads((CASES / case / "expected.toml").read_text())["packages_held_back"]["vllm"]
    spec = cli_spec(case, tmp_path, monkeypatch)
    out = tmp_path / "vllm.lock"
    assert main(["lock", str(spec), "-o", str(out)]) == 0
    assert f"warning: {why}" in capsys.readouterr().err
    lock = lockmod.load(out)
    assert lock.revision == 3 and [(w.name, w.held_back) for w in lock.wheels if w.held_back] == [
        ("vllm", why)
    ]
    assert (
        main(["lock", str(spec), "-o", str(out), "--check"]) == 0
    )  # a warning, the lock is true to its spec
    assert f"warning: {why}" in capsys.readouterr().err
    # for CI: the spec refuses it, and the setting is no input of the resolution (the same spec hash)
    (tmp_path / "index").rename(tmp_path / "index-first")
    spec = cli_spec(
        case,
        tmp_path,
        monkeypatch,
        edit=('packages = ["vllm"]', 'packages = ["vllm"]\nheld_back = "error"'),
    )
    assert main(["lock", str(spec), "-o", str(out), "--check", "--json"]) == EXIT_CHECK_FAILED
    said = json.loads(capsys.readouterr().out)
    assert said["held_back"] == [
        {"platform": "linux-x86_64", "name": "vllm", "version": "0.34.0", "why": why}
    ]
    assert said["reasons"] == [f'held back ([python].held_back = "error"): {why}']
    before = out.read_bytes()
    out.unlink()
    assert main(["lock", str(spec), "-o", str(out)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "error[package-held-back]" in err and why in err and not out.exists()
    out.write_bytes(before)


def test_a_yanked_release_is_warned_in_the_lock_and_refused_where_the_spec_says(
    tmp_path, monkeypatch, capsys
):
    """Issue 57, 6: an exact pin on a yanked release locks it with the index's reason and the
    newest release that is not yanked, as a warning; refused under ``held_back = "error"``."""
    from envspec import lock as lockmod
    from envspec.cli import main
    from envspec.errors import EXIT_BAD_INPUT

    case = "yanked-release-is-held-back"
    why = tomllib.loads((CASES / case / "expected.toml").read_text())["packages_held_back"]
    spec = cli_spec(case, tmp_path, monkeypatch)
    out = tmp_path / "yanked.lock"
    assert main(["lock", str(spec), "-o", str(out)]) == 0
    assert f"warning: {why['widget']}" in capsys.readouterr().err
    assert {w.name: w.held_back for w in lockmod.load(out).wheels if w.held_back} == why
    (tmp_path / "index").rename(tmp_path / "index-first")
    out.unlink()
    spec = cli_spec(
        case,
        tmp_path,
        monkeypatch,
        edit=('packages = ["widget==1.2.0"]', 'packages = ["widget==1.2.0"]\nheld_back = "error"'),
    )
    assert main(["lock", str(spec), "-o", str(out)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "error[package-held-back]" in err and "yanked on its index" in err and not out.exists()


def test_a_newest_release_that_cannot_be_installed_alone_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = "no-pin-keeps-newest-torch"
    sources = offline_sources(CASES / case, tmp_path)
    make_wheel(
        tmp_path / "index", "accelerate", "1.13.0", ["torch>=2.0.0", "flashinfer==9.9"]
    )  # no such flashinfer
    choice = choose(load_spec(CASES / case / "spec.toml"), load_db())
    wheels = resolve_python(choice, sources, workdir=tmp_path / "w")
    assert {w.name: w.version for w in wheels}["accelerate"] == "1.12.0"
    why = held_back(choice, wheels, sources, workdir=tmp_path / "w")["accelerate"]
    assert why.startswith(
        "accelerate 1.13.0 is the newest release with a wheel for linux-x86_64 and Python 3.11; "
        "it cannot be installed even alone, its own requirements conflict ("
    ), why
    assert "flashinfer" in why


def test_explain_says_which_index_each_candidate_comes_from():
    from envspec import explain

    choice = choose(load_spec(CASES / "no-pin-keeps-newest-torch" / "spec.toml"), load_db())
    assert choice.torch is not None
    rows = {c["variant"]: c["index"] for c in explain.choice_json(choice)["candidates"]}
    pypi = choice.torch.release.pypi_variant
    assert rows[pypi] == "https://pypi.org/simple"
    assert all(
        url == f"https://download.pytorch.org/whl/{v}" for v, url in rows.items() if v != pypi
    )
    lines = explain.choice_lines(choice)
    assert any(ln.startswith(f"  * {pypi}") and ln.endswith("[PyPI]") for ln in lines)
    assert any(ln.endswith("[download.pytorch.org/whl/cpu]") for ln in lines)


def test_explain_packages_makes_the_choice_lock_makes(tmp_path, monkeypatch, capsys):
    import json

    from envspec.cli import main

    spec = cli_spec("newest-package-decides-torch", tmp_path, monkeypatch)
    assert main(["explain", str(spec)]) == 0  # offline: the newest release that fits, and a note
    out = capsys.readouterr().out
    assert (
        out.startswith("spec vllm-team") and "torch 2.15.0" in out and "explain --packages" in out
    )
    assert main(["explain", str(spec), "--packages", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["torch"] == "2.14.0" and [h["torch"] for h in said["passed_over"]] == [
        "2.15.0",
        "2.14.1",
    ]
    assert main(["explain", str(spec), "--packages"]) == 0
    assert "  torch 2.15.0: vllm 0.34.0 requires torch==2.14.0" in capsys.readouterr().out


def test_a_package_with_no_wheel_says_so_and_what_a_source_build_would_take(tmp_path, monkeypatch):
    """Wheels only ([python].from_source = "never"): no-wheel at the package's place in the spec."""
    from envspec.errors import ResolutionImpossible

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = "no-pin-keeps-newest-torch"
    sources = offline_sources(CASES / case, tmp_path)
    make_sdist(tmp_path / "index", "flash-attn", "2.8.3", ["torch"])
    spec_path = _spec_with(
        tmp_path, case, **{'["accelerate"]': '["accelerate", "flash-attn"]\nfrom_source = "never"'}
    )
    with pytest.raises(ResolutionImpossible) as e:
        resolve_python(choose(load_spec(spec_path), load_db()), sources, workdir=tmp_path / "w")
    err = e.value
    assert (
        err.reference == "no-wheel"
        and err.message == "flash-attn has no wheel for linux-x86_64 and Python 3.11"
    )
    c = err.causes[0]
    assert isinstance(c, Said) and c.where == f"[python].packages[1] ({spec_path}:9)"
    assert c.text.endswith(
        'source builds are off ([python].from_source = "never") (with a build '
        "from source the lock would take flash-attn 2.8.3)"
    )
    assert '[python].from_source = "auto"' in err.hint


def test_a_package_with_no_wheel_is_taken_as_its_sdist(tmp_path, monkeypatch):
    """By default a package with no wheel at all, named or pulled in, is locked by its sdist."""
    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = "no-pin-keeps-newest-torch"
    sources = offline_sources(CASES / case, tmp_path)
    make_sdist(tmp_path / "index", "flash-attn", "2.8.3", ["torch", "einops-lite"])
    make_sdist(tmp_path / "index", "einops-lite", "0.1.0", [])
    spec_path = _spec_with(tmp_path, case, **{'["accelerate"]': '["accelerate", "flash-attn"]'})
    wheels = {
        w.name: w
        for w in resolve_python(
            choose(load_spec(spec_path), load_db()), sources, workdir=tmp_path / "w"
        )
    }
    fa, dep = wheels["flash-attn"], wheels["einops-lite"]
    assert (fa.version, fa.filename, fa.is_sdist, fa.group, fa.direct) == (
        "2.8.3",
        "flash-attn-2.8.3.tar.gz",
        True,
        "team",
        True,
    )
    assert (
        fa.sha256
        == hashlib.sha256((tmp_path / "index" / "flash-attn-2.8.3.tar.gz").read_bytes()).hexdigest()
    )
    assert (
        fa.size == (tmp_path / "index" / "flash-attn-2.8.3.tar.gz").stat().st_size
        and fa.source is None
    )
    assert (dep.is_sdist, dep.group) == (
        True,
        "deps",
    )  # found by uv's no-wheel error, then taken as its sdist
    assert not wheels["accelerate"].is_sdist


def test_lock_and_explain_say_which_packages_are_built_from_source(tmp_path, monkeypatch, capsys):
    import json

    from envspec import lock as lockmod
    from envspec.cli import main

    spec = cli_spec("newest-release-sdist-only-is-built", tmp_path, monkeypatch)
    out = tmp_path / "ds.lock"
    assert main(["lock", str(spec), "-o", str(out), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    [f] = said["from_source"]
    assert (f["name"], f["version"], f["sdist"], f["build"]) == (
        "deepspeed",
        "0.19.8",
        "deepspeed-0.19.8.tar.gz",
        ["setuptools 80.9.0"],
    )
    assert said["held_back"] == []  # taken at its newest release: nothing held back
    # issue 58, point 6: the cost before it is paid (this sdist has no source to compile)
    assert f["estimate_s"] == 30 and f["estimate"].startswith("about 30 s here (from its sdist")
    pin = next(w for w in lockmod.load(out).wheels if w.name == "deepspeed")
    assert pin.source is not None and pin.source.key == f["key"] and lockmod.load(out).revision == 4
    out.unlink()
    assert main(["lock", str(spec), "-o", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())  # as printed, wrapped to the terminal
    assert (
        "from source: deepspeed 0.19.8 (deepspeed-0.19.8.tar.gz; setuptools.build_meta:__legacy__ with setuptools 80.9.0)"
        in err
    )
    assert "built by `envspec build`: about 30 s here" in err and "--cache-to REPO" in err
    assert main(["lock", str(spec), "-o", str(out), "--check"]) == 0
    capsys.readouterr()
    assert main(["explain", str(spec), "--packages", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["from_source"] == ["deepspeed"]
    assert main(["explain", str(spec), "--packages"]) == 0
    assert "`envspec build` builds each from its sdist): deepspeed" in " ".join(
        capsys.readouterr().out.split()
    )


def test_uvs_pylock_is_read_into_models_and_a_package_without_a_version_is_refused(tmp_path):
    """uv's pylock.toml becomes PylockPackage models where it is read; one envspec cannot read
    names the file, the package and the field."""
    from envspec.errors import SourceError
    from envspec.resolve.model import PylockFile
    from envspec.resolve.uv import _pylock_packages

    good = tmp_path / "pylock.ok.toml"
    good.write_text(
        'lock-version = "1.0"\n[[packages]]\nname = "Numpy"\nversion = "2.1.0"\n'
        'index = "https://pypi.org/simple"\n'
        '[[packages.wheels]]\nurl = "https://files.example/numpy-2.1.0-cp311-cp311-x.whl"\n'
        'size = 10\nhashes = {sha256 = "ab"}\n'
    )
    (p,) = _pylock_packages(good)
    assert (p.name, p.version, p.sdist) == ("Numpy", "2.1.0", None)
    assert p.wheels == (
        PylockFile(
            url="https://files.example/numpy-2.1.0-cp311-cp311-x.whl",
            size=10,
            hashes={"sha256": "ab"},
        ),
    )
    bad = tmp_path / "pylock.bad.toml"
    bad.write_text('[[packages]]\nname = "numpy"\n')
    with pytest.raises(
        SourceError, match=r"pylock\.bad\.toml.*packages\[0\]\.version: Field required"
    ) as e:
        _pylock_packages(bad)
    assert e.value.reference == "uv-output"


def test_a_metadata_build_that_fails_is_said_as_such_never_as_an_unreachable_index():
    """issue 57, 5: torch-scatter's sdist imports torch in setup.py to say its metadata; uv's
    failure (recorded, tests/data/uv_errors/) is `sdist-metadata-failed` naming the package, that
    its build imports torch, and the log's tail, not `index-unavailable`."""
    from envspec.errors import ResolutionImpossible
    from envspec.resolve.failures import _metadata_build_error

    stderr = (CASES.parent / "uv_errors" / "torch-scatter-metadata.txt").read_text()
    choice = choose(load_spec(CASES / "no-pin-keeps-newest-torch" / "spec.toml"), load_db())
    err = _metadata_build_error(stderr, choice)
    assert isinstance(err, ResolutionImpossible) and err.reference == "sdist-metadata-failed"
    assert err.exit_code == 2
    assert err.message.startswith("torch-scatter 2.1.2 is taken from its sdist")
    assert "its setup imports torch" in err.message
    assert err.causes[-1].text == "ModuleNotFoundError: No module named 'torch'"
    assert not any(c.text.startswith("hint:") for c in err.causes)
    assert "a release of torch-scatter with a wheel for linux-x86_64" in err.hint
    assert _metadata_build_error("error: No solution found when resolving", choice) is None


def _torch_importing_sdist(
    dest: Path, name: str, version: str, requires: list[str], build: str = "[]"
) -> None:
    """torch-scatter 2.1.2's way, with an in-tree backend: its metadata build imports torch, which
    its [build-system] does not declare, and its PKG-INFO (metadata 2.1) cannot be trusted.
    ``requires``: its Requires-Dist, where "{torch}" is the version of the torch its build has (as
    transformer-engine-torch names its core after its build's torch); ``build``: its
    [build-system].requires."""
    backend = (
        "import os\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
        "def prepare_metadata_for_build_wheel(directory, config_settings=None):\n"
        "    import torch  # undeclared, as a setup.py that imports it\n"
        "    from importlib.metadata import version\n"
        f"    d = os.path.join(directory, '{name}-{version}.dist-info')\n"
        "    os.makedirs(d)\n"
        "    with open(os.path.join(d, 'METADATA'), 'w') as f:\n"
        f"        f.write('Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n"
        + "".join(f"Requires-Dist: {r}\\n" for r in requires)
        + "'.replace('{torch}', version('torch')))\n"
        f"    return '{name}-{version}.dist-info'\n"
    )
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        "pyproject.toml": f'[build-system]\nrequires = {build}\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n'.encode(),
        "backend.py": backend.encode(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(f"{name}-{version}/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (dest / f"{name}-{version}.tar.gz").write_bytes(buf.getvalue())


def _locked_case(tmp_path: Path, monkeypatch, packages: str, fill) -> tuple[dict, Path]:
    """The newest-release-sdist-only-is-built case, offline, with ``packages`` (a TOML list) named
    and ``fill(index)`` adding its packages to the index: the resolved wheels by name, and the
    spec's path."""
    from envspec.compat import load_db
    from envspec.resolve import choose, resolve_python
    from envspec.spec import load_spec

    monkeypatch.setenv("ENVSPEC_OFFLINE", "1")
    case = CASES / "newest-release-sdist-only-is-built"
    sources = offline_sources(case, tmp_path)
    fill(tmp_path / "index")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        (case / "spec.toml").read_text().replace('["deepspeed"]', packages)
        + f'\n[sources]\nindex = "{sources.index}"\n'
    )
    choice = choose(load_spec(spec_path), load_db())
    wheels = {w.name: w for w in resolve_python(choice, sources, workdir=tmp_path / "w")}
    return wheels, spec_path


def test_a_metadata_build_that_imports_torch_is_given_the_locks_torch(tmp_path, monkeypatch):
    """Issue 58, point 1: an sdist whose metadata build fails on `import torch` (undeclared) is
    asked again with the choice's torch in its build (uv's extra-build-dependencies, as
    match-runtime gives it); its dependencies are then known, and the lock says what it needed."""

    def fill(index: Path) -> None:
        _torch_importing_sdist(index, "scatterish", "2.1.2", ["helper>=1"])
        make_wheel(index, "helper", "1.0", [])

    wheels, _ = _locked_case(tmp_path, monkeypatch, '["scatterish"]', fill)
    assert wheels["scatterish"].is_sdist and wheels["scatterish"].build_needs == ("torch",)
    assert "helper" in wheels  # its metadata was built: its dependency is in the lock
    assert not wheels["helper"].build_needs and wheels["torch"].version == "2.15.0"
    given = [tomllib.loads(p.read_text()) for p in (tmp_path / "w").glob("*.uv.toml")]
    assert given and all(
        g == {"extra-build-dependencies": {"scatterish": ["torch==2.15.0"]}} for g in given
    )


def test_an_undeclared_import_is_read_from_uvs_words():
    from envspec.resolve.uv import _undeclared_import

    said = (
        "  × Failed to build `torch-scatter==2.1.2`\n  ├─▶ The build backend returned an error\n"
        "  File \"<string>\", line 8, in <module>\nModuleNotFoundError: No module named 'torch'\n"
    )
    assert _undeclared_import(said) == ("torch-scatter", "torch")
    assert _undeclared_import(said.replace("'torch'", "'numpy.core'")) == ("torch-scatter", "numpy")
    assert _undeclared_import(said.replace("'torch'", "'op_builder'")) is None  # its own module
    assert _undeclared_import("No module named 'torch'") is None  # not a failed build


def test_a_named_package_held_by_a_dependency_without_a_wheel_takes_its_sdist(
    tmp_path, monkeypatch, capsys
):
    """transformer-engine[pytorch] (issue 58): its newest release has a wheel, and its extra needs
    transformer-engine-torch, an sdist only; wheels only, uv took the placeholder 0.0.0 (no such
    extra) without failing. The lock finds the dependency with no wheel and builds it instead."""

    def fill(index: Path) -> None:
        make_wheel(index, "meta", "0.0.0", [])
        make_wheel(index, "meta", "2.20.2", ['meta-torch==2.20.2; extra == "pytorch"'])
        make_sdist(index, "meta-torch", "2.20.2", ["torch"])

    wheels, spec_path = _locked_case(tmp_path, monkeypatch, '["meta[pytorch]"]', fill)
    assert wheels["meta"].version == "2.20.2" and not wheels["meta"].is_sdist
    assert wheels["meta-torch"].is_sdist and wheels["meta-torch"].version == "2.20.2"
    assert wheels["meta-torch"].group == "deps"
    # `explain --packages` says so, as the lock will take it
    import json

    from envspec.cli import main

    assert main(["explain", str(spec_path), "--packages", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["from_source"], said["from_source_deps"]) == ([], ["meta-torch 2.20.2"])
    assert main(["explain", str(spec_path), "--packages"]) == 0
    assert "built from source as dependencies of the named packages" in capsys.readouterr().out


def test_a_metadata_build_that_declares_torch_gets_the_locks_torch(tmp_path, monkeypatch):
    """transformer-engine-torch's way (issue 58): it declares `torch>=2.1` and names its core after
    its build's torch. Isolated, its metadata build took the newest torch on the index; it gets
    the choice's (uv's build constraints), so its metadata is what the locked torch gives."""

    def fill(index: Path) -> None:
        make_wheel(index, "torch", "2.16.0", [])  # newer than the spec's 2.15.*
        for v in ("2.15.0", "2.16.0"):
            make_wheel(index, "core", v, [])
        _torch_importing_sdist(index, "ext", "1.0", ["core=={torch}"], build='["torch>=2.1"]')

    wheels, _ = _locked_case(tmp_path, monkeypatch, '["ext"]', fill)
    assert (wheels["torch"].version, wheels["core"].version) == ("2.15.0", "2.15.0")
    assert wheels["ext"].is_sdist and not wheels["ext"].build_needs  # declared: nothing added
