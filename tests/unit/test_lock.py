"""The lockfile: canonical text, round trip, format versions, atomic writes, freshness."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envspec import lock as lockmod
from envspec.errors import LockError
from envspec.spec import parse_spec

SPEC = """name = "demo"
[python]
version = "3.11"
packages = ["six==1.16.0"]
[torch]
version = "==2.14.1"
"""


def make_lock(**over) -> lockmod.Lockfile:
    spec = parse_spec(SPEC, "demo.toml")
    wheels = over.pop(
        "wheels",
        [
            lockmod.Wheel(
                name="torch",
                version="2.14.1",
                filename="torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                index="https://pypi.org/simple",
                sha256="a" * 64,
                size=10,
                group="torch",
                direct=True,
            ),
            lockmod.Wheel(
                name="six",
                version="1.16.0",
                filename="six-1.16.0-py2.py3-none-any.whl",
                index="https://pypi.org/simple",
                sha256="b" * 64,
                size=5,
                group="team",
                direct=True,
            ),
        ],
    )
    lk = lockmod.Lockfile(
        meta=lockmod.Meta(
            name="demo", spec="demo.toml", spec_hash=spec.spec_hash(), db_version="2026.11.30"
        ),
        platform=lockmod.Platform(
            python="3.11",
            python_tag="cp311",
            platform_tag="manylinux_2_36_x86_64",
            base="debian:bookworm",
        ),
        hardware=lockmod.Hardware(arch_list=["sm_80", "sm_90"], driver_floor="580.65.06"),
        torch=lockmod.TorchPin(
            version="2.14.1", variant="cu130", cuda="13.0", index="https://pypi.org/simple"
        ),
        runtime=lockmod.RuntimeLock(env={"B": "2", "A": "1"}),
        wheels=wheels,
        **over,
    )
    return lk.with_hash()


def test_round_trip_is_byte_identical():
    text = lockmod.dumps(make_lock())
    again = lockmod.dumps(lockmod.loads(text))
    assert text == again
    assert text.startswith("# envspec lockfile")
    assert "version = 1\n" in text


def test_content_hash_covers_body_not_meta():
    a = make_lock()
    b = a.model_copy(update={"meta": a.meta.model_copy(update={"spec": "elsewhere.toml"})})
    assert a.compute_hash() == b.compute_hash()
    c = make_lock(wheels=[])
    assert c.meta.content_hash != a.meta.content_hash


def test_unknown_format_version_is_rejected():
    text = lockmod.dumps(make_lock()).replace("version = 1\n", "version = 3\n", 1)
    with pytest.raises(LockError) as ei:
        lockmod.loads(text, "x.lock")
    assert ei.value.reference == "lock-version" and "x.lock" in ei.value.message


def test_broken_lock_names_the_file():
    with pytest.raises(LockError) as ei:
        lockmod.loads("version = 1\n[meta\n", "y.lock")
    assert "y.lock" in ei.value.message


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    p = tmp_path / "demo.lock"
    p.write_text("old\n")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        lockmod.write_atomic(p, "new\n")
    assert p.read_text() == "old\n"
    assert [x.name for x in tmp_path.iterdir()] == ["demo.lock"], "no temp file left behind"


def test_fresh_lock_has_no_stale_reasons():
    assert lockmod.stale_reasons(make_lock(), parse_spec(SPEC, "demo.toml")) == []


def test_stale_reasons_name_what_changed():
    spec = parse_spec(
        SPEC.replace("six==1.16.0", "six>=1.17").replace("==2.14.1", "==2.13.*"), "demo.toml"
    )
    reasons = lockmod.stale_reasons(make_lock(), spec)
    text = "\n".join(reasons)
    assert "spec changed" in text
    assert "torch 2.14.1 in the lock is outside" in text
    assert "six 1.16.0 in the lock does not satisfy" in text


def test_hand_edit_is_refused_naming_the_field(tmp_path, monkeypatch):
    """issue 43, 1: a lock whose tables no longer hash to its content hash is refused by the reader
    every command uses, naming the first field that differs from the copy envspec's cache kept."""
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    text = lockmod.dumps(make_lock())
    path = tmp_path / "demo.lock"
    path.write_text(text.replace("a" * 64, "c" * 64))
    with pytest.raises(lockmod.LockTampered, match="no copy of it as written") as e:
        lockmod.load(path)
    assert e.value.reference == "lock-tampered" and e.value.exit_code == 2
    assert "envspec lock SPEC" in e.value.hint
    lockmod.remember(text, make_lock().meta.content_hash)  # as `envspec lock` does after writing
    with pytest.raises(lockmod.LockTampered) as e:
        lockmod.load(path)
    assert e.value.first is not None and e.value.first[0].endswith(".sha256")
    assert f'"{"a" * 64}" as written, "{"c" * 64}" now' in e.value.message
    # the edited lock still reads where it is asked not to check (`envspec lock` rewriting it)
    assert lockmod.load(path, check_hash=False).meta.name == make_lock().meta.name


def test_hand_edit_named_against_git(tmp_path, monkeypatch):
    """Without the cache's copy, the lock as committed (git's index or HEAD) names the field."""
    import subprocess

    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    repo.mkdir()
    text = lockmod.dumps(make_lock())
    (repo / "demo.lock").write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "demo.lock"], check=True)
    subprocess.run([*git, "commit", "-qm", "lock"], check=True)
    lk = make_lock()
    w = lk.wheels[-1]
    at = text.index(f'name = "{w.name}"')
    edited = text[:at] + text[at:].replace(f'version = "{w.version}"', 'version = "99.0"', 1)
    assert edited != text
    (repo / "demo.lock").write_text(edited)
    with pytest.raises(lockmod.LockTampered) as e:
        lockmod.load(repo / "demo.lock")
    assert e.value.first == (f"wheels[{w.name}].version", w.version, "99.0")
    # an entry removed is named too
    first = text.index("[[wheels]]")
    second = text.index("[[wheels]]", first + 1)
    (repo / "demo.lock").write_text(text[:first] + text[second:])
    with pytest.raises(lockmod.LockTampered) as e:
        lockmod.load(repo / "demo.lock")
    assert e.value.first is not None and e.value.first[0].startswith(f"wheels[{lk.wheels[0].name}]")
    assert "absent now" in e.value.message


def test_authorized_keys_are_pinned_by_hash(tmp_path):
    from types import SimpleNamespace

    from envspec.errors import PlanError
    from envspec.services import render_service_files

    pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk2QXJ0ZXN0a2V5Zm9ydGVzdHNvbmx5MDAwMDAwMDAw test\n"
    (tmp_path / "keys.pub").write_text(pub)
    spec_path = tmp_path / "s.toml"
    spec_path.write_text('name = "ws"\n[services.ssh]\nauthorized_keys = "keys.pub"\n')
    spec = parse_spec(spec_path.read_text(), spec_path)
    choice = SimpleNamespace(
        spec=spec,
        torch=None,
        suite=None,
        python="3.11",
        platform_tag="manylinux_2_28_x86_64",
        arch="x86_64",
        debian_arch="amd64",
        base="none",
        gpus=[],
        compute_capabilities=[],
        driver_policy="compat",
        driver_assumed=False,
    )
    res = SimpleNamespace(choice=choice, debs=[], deb_requested=[], wheels=[])
    lk = lockmod.from_resolution(res, spec_path=str(spec_path), db_version="test")
    assert (
        lk.services.ssh is not None
        and lk.services.ssh.authorized_keys_sha256 == lockmod.keys_sha256(pub)
    )
    assert lockmod.stale_reasons(lk, spec) == []
    (tmp_path / "keys.pub").write_text(pub.replace("test", "other"))
    assert any("keys.pub changed" in r for r in lockmod.stale_reasons(lk, spec))
    with pytest.raises(PlanError) as ei:
        render_service_files(lk, spec_dir=tmp_path)
    assert ei.value.reference == "lock-out-of-date"


def test_a_changed_debian_base_set_makes_the_lock_stale():
    lk = make_lock(
        debian=lockmod.DebianLock(
            suite="bookworm", mirror="http://deb.debian.org/debian", requested=["bash", "python3"]
        )
    )
    spec = parse_spec(SPEC, "demo.toml")
    assert lockmod.stale_reasons(lk, spec, debian_requested=["python3", "bash"]) == []
    reasons = lockmod.stale_reasons(lk, spec, debian_requested=["bash", "g++", "python3"])
    assert reasons == ["the Debian packages asked for changed: + g++"]


def test_pins_come_from_the_resolved_wheels_and_a_db_disagreement_is_recorded():
    from types import SimpleNamespace

    from envspec.compat import load_db
    from envspec.lock import torch_pin, wheel_pins

    rel = load_db().torch_release("2.14.1")
    t = SimpleNamespace(release=rel, variant=rel.variants["cu130"])
    W = lambda n, v: SimpleNamespace(name=n, version=v)  # noqa: E731
    same = [
        W("nvidia-cuda-runtime", "13.0.96"),
        W("nvidia-cudnn-cu13", "9.24.0.43"),
        W("nvidia-nccl-cu13", "2.30.7"),
        W("nvidia-cublas", "13.1.0.3"),
    ]
    assert wheel_pins(same) == {
        "cuda": ("13.0", "nvidia-cuda-runtime"),
        "cudnn": ("9.24.0.43", "nvidia-cudnn-cu13"),
        "nccl": ("2.30.7", "nvidia-nccl-cu13"),
    }
    pin = torch_pin(t, same, "https://pypi.org/simple")
    assert (pin.cuda, pin.cudnn, pin.nccl, pin.db_mismatch) == ("13.0", "9.24.0.43", "2.30.7", None)
    # the DB row is wrong about NCCL: the lock pins what the image will load, and says so
    other = [w if w.name != "nvidia-nccl-cu13" else W("nvidia-nccl-cu13", "2.30.4") for w in same]
    pin = torch_pin(t, other, "https://pypi.org/simple")
    assert pin.nccl == "2.30.4" and pin.cudnn == "9.24.0.43"
    assert pin.db_mismatch == [
        "nccl: the compatibility DB says 2.30.7 for torch 2.14.1 cu130, "
        "the resolved wheel nvidia-nccl-cu13 is 2.30.4"
    ]
    # CUDA 12 wheel names, and a build without an NCCL wheel keeps the DB's value
    rel = load_db().torch_release("2.9.1")
    t = SimpleNamespace(release=rel, variant=rel.variants["cu128"])
    pin = torch_pin(
        t, [W("nvidia-cuda-runtime-cu12", "12.8.90"), W("nvidia-cudnn-cu12", "9.10.2.21")], "x"
    )
    assert (pin.cuda, pin.cudnn, pin.nccl, pin.db_mismatch) == ("12.8", "9.10.2.21", "2.27.5", None)


def test_a_lock_with_a_db_mismatch_is_revision_1_and_reads_back():
    from pathlib import Path

    from envspec.lock import dumps, loads

    lock = loads((Path(__file__).parents[2] / "lockfiles" / "h100-train.lock").read_text())
    assert lock.revision == 0 and lock.torch is not None and lock.torch.db_mismatch is None
    assert "db_mismatch" not in dumps(lock)
    bumped = (
        lock.replace_part(
            torch=lock.torch.model_copy(
                update={
                    "nccl": "2.30.4",
                    "db_mismatch": ["nccl: the compatibility DB says 2.30.7 ..."],
                }
            )
        )
        .model_copy(update={"revision": 1})
        .with_hash()
    )
    text = dumps(bumped)
    assert "revision = 1" in text and "db_mismatch = [" in text
    again = loads(text)
    assert again == bumped and again.torch.db_mismatch == [
        "nccl: the compatibility DB says 2.30.7 ..."
    ]


def test_a_lock_made_for_another_platform_is_stale():
    from pathlib import Path

    from envspec.lock import loads, stale_reasons
    from envspec.spec import load_spec

    root = Path(__file__).parents[2]
    lock = loads((root / "lockfiles" / "h100-train.lock").read_text())
    spec = load_spec(root / "specs" / "h100.toml")
    assert stale_reasons(lock, spec, platforms=["linux-x86_64"]) == []
    assert stale_reasons(lock, spec, platforms=["linux-aarch64"]) == [
        "the spec resolves for linux-aarch64 hosts ([target].platforms, else its GPUs), the lock was made for linux-x86_64"
    ]


# ---- one lock with a section per platform (version 2) ----------------------------------------------


def _repo():
    from pathlib import Path

    return Path(__file__).parents[2]


def test_a_multi_platform_lock_reads_back_to_its_own_bytes():
    text = (_repo() / "lockfiles" / "smoke-multi.lock").read_text()
    lock = lockmod.loads(text)
    assert (lock.version, lock.multi, lock.platform_names) == (
        2,
        True,
        ["linux-x86_64", "linux-aarch64"],
    )
    assert lockmod.dumps(lock) == text
    assert "[platforms.linux-aarch64.platform]" in text and "\n[platform]\n" not in text
    assert lock.compute_hash() == lock.meta.content_hash
    assert lock.parts[1].debian is not None and lock.parts[1].debian.architecture == "arm64"
    assert {p.architecture for p in lock.parts[1].debian.packages} <= {"arm64", "all"}


def test_one_content_hash_covers_every_section():
    lock = lockmod.load(_repo() / "lockfiles" / "smoke-multi.lock")
    arm = lock.parts[1]
    wheels = [
        w.model_copy(update={"sha256": "c" * 64}) if w.name == "six" else w for w in arm.wheels
    ]
    edited = lock.model_copy(
        update={"parts": [lock.parts[0], arm.model_copy(update={"wheels": wheels})]}
    )
    assert edited.compute_hash() != lock.meta.content_hash
    from envspec.spec import load_spec

    spec = load_spec(_repo() / "specs" / "smoke-multi.toml")
    assert lockmod.stale_reasons(lock, spec, platforms=["linux-x86_64", "linux-aarch64"]) == []
    assert any("edited by hand" in r for r in lockmod.stale_reasons(edited, spec))
    with pytest.raises(
        lockmod.LockTampered, match="platforms.linux-aarch64"
    ):  # as written (git), so named
        lockmod.loads(
            lockmod.dumps(edited.model_copy(update={"meta": lock.meta})),
            str(_repo() / "lockfiles" / "smoke-multi.lock"),
        )
    # the platforms the spec resolves to now, against the lock's sections
    assert lockmod.stale_reasons(lock, spec, platforms=["linux-x86_64"]) == [
        "the spec resolves for linux-x86_64 hosts ([target].platforms, else its GPUs), the lock was made for "
        "linux-x86_64 and linux-aarch64"
    ]


def test_a_section_that_lacks_a_package_is_named_by_its_platform():
    lock = lockmod.load(_repo() / "lockfiles" / "smoke-multi.lock")
    arm = lock.parts[1]
    cut = lock.model_copy(
        update={
            "parts": [
                lock.parts[0],
                arm.model_copy(update={"wheels": [w for w in arm.wheels if w.name != "idna"]}),
            ]
        }
    ).with_hash()
    from envspec.spec import load_spec

    reasons = lockmod.stale_reasons(cut, load_spec(_repo() / "specs" / "smoke-multi.toml"))
    assert reasons == ["linux-aarch64: idna is asked for in [python].packages but not in the lock"]


def test_a_platforms_view_is_a_version_1_lock_the_build_takes():
    lock = lockmod.load(_repo() / "lockfiles" / "smoke-multi.lock")
    with pytest.raises(LockError) as e:
        lock.platform
    assert e.value.reference == "multi-platform-lock"
    view = lock.for_platform("linux-aarch64")
    assert (view.version, view.revision, view.multi, view.platform.arch) == (1, 2, False, "aarch64")
    assert (
        view.meta.part_of == lock.meta.content_hash
        and view.compute_hash() == view.meta.content_hash
    )
    assert view.image_tag == f"localhost/envspec/smoke-multi:{lock.short_hash}-arm64"
    assert lock.for_platform("arm64") == view and lock.for_platform("aarch64") == view
    again = lockmod.loads(lockmod.dumps(view))
    assert again == view and "part_of = " in lockmod.dumps(view)
    assert [v.platform.oci_arch for v in lock.views()] == ["amd64", "arm64"]
    single = lockmod.load(_repo() / "lockfiles" / "smoke.lock")
    assert single.for_platform("linux-x86_64") is single and single.views() == [single]
    with pytest.raises(LockError) as e:
        single.for_platform("linux-aarch64")
    assert e.value.reference == "platform-not-in-lock"


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            lambda t: t.replace("version = 2\n", "version = 1\n", 1),
            "version 1 lock is for one platform",
        ),
        (
            lambda t: t.replace(
                "[platforms.linux-aarch64.platform]", "[platforms.linux-arm.platform]"
            ).replace("[platforms.linux-aarch64.", "[platforms.linux-arm."),
            "not linux-arm",
        ),
    ],
)
def test_a_malformed_multi_platform_lock_is_refused(edit, words):
    text = edit((_repo() / "lockfiles" / "smoke-multi.lock").read_text())
    with pytest.raises(LockError) as e:
        lockmod.loads(text, "m.lock")
    assert e.value.reference == "invalid-lock" and words in e.value.message, e.value.message


def test_a_version_2_lock_of_one_platform_is_refused():
    text = lockmod.dumps(make_lock()).replace("version = 1\n", "version = 2\n", 1)
    with pytest.raises(LockError) as e:
        lockmod.loads(text, "x.lock")
    assert e.value.reference == "invalid-lock" and "section per platform" in e.value.message


def test_lock_check_covers_both_platforms(tmp_path, capsys, monkeypatch):
    from envspec.cli import main

    monkeypatch.chdir(_repo())
    assert main(["lock", "--check", "specs/smoke-multi.toml"]) == 0
    lock = lockmod.load("lockfiles/smoke-multi.lock")
    arm = lock.parts[1]
    old = lock.model_copy(
        update={
            "parts": [
                lock.parts[0],
                arm.model_copy(
                    update={
                        "wheels": [
                            w.model_copy(update={"version": "3.6"}) if w.name == "idna" else w
                            for w in arm.wheels
                        ]
                    }
                ),
            ]
        }
    )
    out = tmp_path / "old.lock"
    lockmod.write_atomic(out, lockmod.dumps(old.with_hash()))
    capsys.readouterr()
    assert main(["lock", "--check", "specs/smoke-multi.toml", "-o", str(out), "--json"]) == 1
    import json

    reasons = json.loads(capsys.readouterr().out)["reasons"]
    assert reasons == ["linux-aarch64: idna 3.6 in the lock does not satisfy 'idna==3.7'"]


def test_model_copy_of_a_part_field_changes_the_one_part():
    lock = make_lock()
    wheels = lock.wheels[:1]
    copied = lock.model_copy(update={"wheels": wheels, "revision": 1})
    assert copied.wheels == wheels and copied.revision == 1 and len(copied.parts) == 1
    assert copied == lock.replace_part(wheels=wheels).model_copy(update={"revision": 1})
    multi = lockmod.load(_repo() / "lockfiles" / "smoke-multi.lock")
    with pytest.raises(LockError) as e:
        multi.model_copy(update={"wheels": []})
    assert e.value.reference == "multi-platform-lock"


def test_a_new_lock_gets_the_umask_mode_and_a_rewritten_one_keeps_its_mode(tmp_path):
    """issue 43, 8: mkstemp's 0600 leaked into every new lock (and the `db show --html` page)."""
    from envspec.lock import write_atomic

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "new.lock", "x")
        assert (tmp_path / "new.lock").stat().st_mode & 0o777 == 0o644
        (tmp_path / "new.lock").chmod(0o664)
        write_atomic(tmp_path / "new.lock", "y")
        assert (tmp_path / "new.lock").stat().st_mode & 0o777 == 0o664 and (
            tmp_path / "new.lock"
        ).read_text() == "y"
        os.umask(0o077)
        write_atomic(tmp_path / "private.lock", "z")
        assert (tmp_path / "private.lock").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_a_specs_lock_is_found_from_the_spec_not_the_current_directory(tmp_path, monkeypatch):
    """issue 43, 7: the default lock path and the lock's [meta].spec do not depend on where
    `envspec lock` runs."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    # specs/x.toml -> lockfiles/x.lock beside specs/ (the repository's layout), made or not
    (tmp_path / "a" / "specs").mkdir(parents=True)
    assert (
        lockmod.default_path(tmp_path / "a" / "specs" / "x.toml", "x")
        == tmp_path / "a" / "lockfiles" / "x.lock"
    )
    # a spec on its own: lockfiles/ in its folder
    assert (
        lockmod.default_path(tmp_path / "b" / "x.toml", "x")
        == tmp_path / "b" / "lockfiles" / "x.lock"
    )
    # in a git work tree: the nearest lockfiles/ up to its top
    proj = tmp_path / "proj"
    (proj / ".git").mkdir(parents=True)
    (proj / "lockfiles").mkdir()
    (proj / "conf" / "deep").mkdir(parents=True)
    lock = lockmod.default_path(proj / "conf" / "deep" / "x.toml", "x")
    assert lock == proj / "lockfiles" / "x.lock"
    assert (
        lockmod.spec_relative_to_lock(proj / "conf" / "deep" / "x.toml", lock) == "conf/deep/x.toml"
    )
    monkeypatch.chdir(proj)  # relative to the current directory where it is under it
    assert lockmod.default_path(Path("conf/deep/x.toml"), "x") == Path("lockfiles/x.lock")
    assert (
        lockmod.spec_relative_to_lock("conf/deep/x.toml", "lockfiles/x.lock") == "conf/deep/x.toml"
    )


def test_a_gpu_spec_without_a_driver_says_the_floor_it_assumes():
    """issue 43, 2: a spec that sets no [target].driver gets the floor of the build chosen, and says
    so: a note in explain's choice, [hardware].driver_assumed in the lock (revision 5), a note in
    the build's summary; a spec that sets it keeps revision 0 and no such key."""
    from envspec.compat import load_db
    from envspec.explain import driver_assumed_lines as _driver_lines
    from envspec.resolve import Resolution, choose

    text = """name = "nodriver"
[target]
gpus = ["H100"]
[python]
version = "3.11"
[torch]
version = "2.14.*"
"""
    db = load_db()
    for spec_text, assumed in (
        (text, True),
        (text.replace('gpus = ["H100"]', 'gpus = ["H100"]\ndriver = "580.95.05"'), False),
    ):
        choice = choose(parse_spec(spec_text, "nodriver.toml"), db)
        assert choice.driver_assumed is assumed
        notes = [n for n in choice.notes if "[target].driver is not set" in n]
        lk = lockmod.from_resolutions(
            [Resolution(choice=choice, wheels=[], debs=[], deb_requested=[])],
            spec_path="nodriver.toml",
            db_version=db.version,
        )
        if assumed:
            assert (
                notes and f">= {choice.torch.min_driver}" in notes[0] and "nvidia-smi" in notes[0]
            )
            assert lk.hardware.driver_assumed is True and lk.revision == 5
            assert "driver_assumed = true" in lockmod.dumps(lk)
            assert _driver_lines(lk) and f">= {lk.hardware.driver_floor}" in _driver_lines(lk)[0]
        else:
            assert not notes and lk.hardware.driver_assumed is None and lk.revision == 0
            assert "driver_assumed" not in lockmod.dumps(lk) and _driver_lines(lk) == []
        assert lockmod.loads(lockmod.dumps(lk)) == lk


def _cpu_torch_under_cu130(tmp_path: Path) -> Path:
    """lockfiles/h100-train.lock with its torch wheel swapped for 2.13.0+cpu, credited to PyPI, its
    content hash made anew: what a lock looked like where pip's find-links offered the CPU build."""
    lk = lockmod.load(_repo() / "lockfiles" / "h100-train.lock")
    assert lk.torch is not None and lk.torch.variant == "cu130" and lk.torch.local == ""
    wheels = [
        w
        if w.name != "torch"
        else w.model_copy(
            update={
                "version": "2.13.0+cpu",
                "filename": "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                "sha256": "6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b",
            }
        )
        for w in lk.wheels
    ]
    bad = lk.replace_part(wheels=wheels).with_hash()
    path = tmp_path / "bad.lock"
    path.write_text(lockmod.dumps(bad))
    return path


def test_a_lock_whose_torch_wheel_is_not_its_variant_is_refused_naming_both(tmp_path):
    """issue 57, 2: `[torch] variant = "cu130"` (PyPI's build) with a +cpu torch wheel, its content
    hash consistent: refused by the reader every command uses, and by the verifier's own."""
    from envspec.verify.lockfile import LockReadError, load_lock

    path = _cpu_torch_under_cu130(tmp_path)
    with pytest.raises(LockError) as e:
        lockmod.load(path)
    assert e.value.reference == "lock-torch-variant" and e.value.exit_code == 2
    assert "[torch] variant = 'cu130' (no local label: PyPI's build)" in e.value.message
    assert "torch wheel is 2.13.0+cpu (torch-2.13.0+cpu-cp311" in e.value.message
    assert "lock-index-mismatch" not in e.value.message
    with pytest.raises(LockReadError, match=r"torch wheel is 2\.13\.0\+cpu .*lock-torch-variant"):
        load_lock(path)
    # the same label credited to PyPI on a package outside torch's family
    lk = lockmod.load(_repo() / "lockfiles" / "h100-train.lock")
    w = next(w for w in lk.wheels if w.name not in lockmod.VARIANT_FAMILY and w.group != "cuda")
    odd = w.model_copy(
        update={
            "version": w.version + "+local",
            "filename": w.filename.replace(f"-{w.version}-", f"-{w.version}+local-"),
        }
    )
    bad = lk.replace_part(wheels=[odd if x is w else x for x in lk.wheels]).with_hash()
    (tmp_path / "odd.lock").write_text(lockmod.dumps(bad))
    with pytest.raises(LockError) as e:
        lockmod.load(tmp_path / "odd.lock")
    assert e.value.reference == "lock-index-mismatch"
    assert "which serves no version with a local label" in e.value.message
    for committed in sorted((_repo() / "lockfiles").glob("*.lock")):
        assert lockmod.variant_problems(lockmod.load(committed)) == [], committed


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "--dry-run", "{lock}"],
        ["verify", "--lock", "{lock}", "--mode", "host"],
        ["doctor", "{lock}"],
        ["diff", "{lock}", "{good}"],
        ["lock", "--check", "{spec}", "-o", "{lock}"],
    ],
)
def test_every_reader_refuses_it_with_exit_2(argv, tmp_path, capsys):
    from envspec.cli import main

    path = _cpu_torch_under_cu130(tmp_path)
    good = _repo() / "lockfiles" / "h100-train.lock"
    spec = _repo() / "specs" / "h100.toml"
    args = [a.format(lock=path, good=good, spec=spec) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "lock-torch-variant" in err and "2.13.0+cpu" in err and "'cu130'" in err, err
