"""The ABI check of compiled packages against the locked torch (src/envspec/wheels/abi.py), on
small shared objects compiled here: a fake torch library exporting mangled c10::/at:: symbols and
stable-ABI C functions, and extensions importing them."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from envspec.errors import EXIT_BAD_INPUT, AbiMismatch
from envspec.lock import Lockfile, Wheel
from envspec.wheels import abi

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs g++ (scripts/dev.sh setup installs it)"
)

TORCH_OLD = r"""
#include <optional>
namespace c10 { struct Opt {}; int add(int a, int b) { return a + b; } }
namespace at { int scale(const c10::Opt&, int x) { return 2 * x; } }
extern "C" int aoti_torch_version(void) { return 1; }
"""
# the next release: at::scale's signature changed (as c10::optional became std::optional), a
# stable-ABI function was added
TORCH_NEW = r"""
#include <optional>
namespace c10 { struct Opt {}; int add(int a, int b) { return a + b; } }
namespace at { int scale(std::optional<int>, int x) { return 2 * x; } }
extern "C" int aoti_torch_version(void) { return 2; }
extern "C" int aoti_torch_new_thing(void) { return 3; }
"""
EXT_CPP = r"""
#include <optional>
namespace c10 { struct Opt {}; int add(int a, int b); }
namespace at { int scale(const c10::Opt&, int x); }
int helper(int);
extern "C" int run(int x) { c10::Opt o; return at::scale(o, c10::add(x, helper(x))); }
"""
EXT_HELPER = "int helper(int x) { return x + 1; }\n"
EXT_STABLE = r"""
extern "C" int aoti_torch_version(void);
extern "C" int aoti_torch_new_thing(void);
extern "C" int run(void) { return aoti_torch_version() + aoti_torch_new_thing(); }
"""
EXT_WEAK = r"""
namespace c10 { int add(int a, int b); int gone(int) __attribute__((weak)); }
extern "C" int run(int x) { return c10::gone ? c10::gone(x) : c10::add(x, x); }
"""


def _cc(
    tmp: Path, name: str, src: str, *, links: tuple[str, ...] = (), libdir: Path | None = None
) -> Path:
    c = tmp / f"{name}.cpp"
    c.write_text(src)
    out = tmp / f"{name}.so"
    cmd = ["g++", "-std=c++17", "-shared", "-fPIC", "-o", str(out), str(c)]
    if libdir is not None:
        cmd += [
            f"-L{libdir}",
            f"-L{tmp}",
            *(f"-l{x}" for x in links),
            "-Wl,--allow-shlib-undefined",
        ]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def _wheel(
    path: Path, name: str, version: str, files: dict[str, Path | bytes], requires: str = ""
) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        if requires:
            meta += f"Requires-Dist: {requires}\n"
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        for arc, src in files.items():
            z.writestr(arc, src if isinstance(src, bytes) else src.read_bytes())
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("abi")
    old, new = tmp / "old", tmp / "new"
    old.mkdir()
    new.mkdir()
    lib_old = _cc(old, "libc10", TORCH_OLD)
    lib_new = _cc(new, "libc10", TORCH_NEW)
    helper = _cc(tmp, "libhelper", EXT_HELPER)
    ext = _cc(tmp, "ext", EXT_CPP, links=("c10", "helper"), libdir=old)
    stable = _cc(tmp, "stable", EXT_STABLE, links=("c10",), libdir=new)
    weak = _cc(tmp, "weak", EXT_WEAK, links=("c10",), libdir=old)
    wheels = {
        "torch-old": _wheel(
            tmp / "torch-2.1.0-cp311-cp311-linux_x86_64.whl",
            "torch",
            "2.1.0",
            {"torch/lib/libc10.so": lib_old},
        ),
        "torch-new": _wheel(
            tmp / "torch-2.2.0-cp311-cp311-linux_x86_64.whl",
            "torch",
            "2.2.0",
            {"torch/lib/libc10.so": lib_new},
        ),
        "cxx": _wheel(
            tmp / "cxxpkg-1.0-cp311-cp311-linux_x86_64.whl",
            "cxxpkg",
            "1.0",
            {"cxxpkg/_C.so": ext, "cxxpkg.libs/libhelper.so": helper},
            "torch==2.1.0",
        ),
        "cxx-loose": _wheel(
            tmp / "cxxpkg-1.1-cp311-cp311-linux_x86_64.whl",
            "cxxpkg",
            "1.1",
            {"cxxpkg/_C.so": ext, "cxxpkg.libs/libhelper.so": helper},
            "torch>=2.0",
        ),
        "cxx-local": _wheel(
            tmp / "cxxpkg-1.2+cu12torch2.1-cp311-cp311-linux_x86_64.whl",
            "cxxpkg",
            "1.2+cu12torch2.1",
            {"cxxpkg/_C.so": ext, "cxxpkg.libs/libhelper.so": helper},
            "torch",
        ),
        "stable": _wheel(
            tmp / "stablepkg-0.3-cp311-abi3-linux_x86_64.whl",
            "stablepkg",
            "0.3",
            {"stablepkg/_C_stable.so": stable},
            "torch>=2.2.0",
        ),
        "weak": _wheel(
            tmp / "weakpkg-1.0-cp311-cp311-linux_x86_64.whl",
            "weakpkg",
            "1.0",
            {"weakpkg/_C.so": weak},
            "torch",
        ),
        "no-torch": _wheel(
            tmp / "other-1.0-cp311-cp311-linux_x86_64.whl", "other", "1.0", {"other/_C.so": ext}
        ),
    }
    return wheels


def _pin(path: Path, name: str, version: str, group: str = "deps") -> Wheel:
    import hashlib

    return Wheel(
        name=name,
        version=version,
        filename=path.name,
        index="https://pypi.org/simple",
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        size=path.stat().st_size,
        group=group,
    )


def test_wheel_needs_reads_the_torch_symbols_an_extension_leaves_undefined(built):
    needs = abi.wheel_needs(built["cxx"])
    assert needs.torch_requirement == "torch==2.1.0"
    [ext] = needs.extensions  # libhelper.so links no torch library: not an extension to judge
    assert ext.path == "cxxpkg/_C.so" and ext.libs == ("libc10.so",)
    names = [abi.demangle(s) for s in ext.symbols]
    assert "c10::add(int, int)" in names
    assert "at::scale(c10::Opt const&, int)" in names
    assert not any("helper" in n for n in names)  # the wheel's own library defines it
    assert ext.kind == "c++"


def test_weak_references_are_not_needs_and_a_wheel_without_torch_in_its_metadata_is_not_read(built):
    [ext] = abi.wheel_needs(built["weak"]).extensions
    assert [abi.demangle(s) for s in ext.symbols] == ["c10::add(int, int)"]
    assert abi.wheel_needs(built["no-torch"]) == abi.WheelNeeds()


def test_the_extension_fits_the_torch_it_was_built_with_and_not_the_next(built):
    old = abi.torch_exports(built["torch-old"], "2.1.0")
    new = abi.torch_exports(built["torch-new"], "2.2.0")
    pin = _pin(built["cxx"], "cxxpkg", "1.0")
    [ext] = abi.wheel_needs(built["cxx"]).extensions
    assert abi.mismatch(pin, ext, old) is None
    m = abi.mismatch(pin, ext, new)
    assert m is not None and m.torch == "2.2.0" and m.needed == 2
    assert m.demangled() == ["at::scale(c10::Opt const&, int)"]
    assert (
        "needs 1 of its 2 torch symbols that torch 2.2.0 does not export (at::scale(c10::Opt const&, int))"
        in m.sentence()
    )


def test_a_stable_abi_extension_fits_its_torch_and_later_not_earlier(built):
    old = abi.torch_exports(built["torch-old"], "2.1.0")
    new = abi.torch_exports(built["torch-new"], "2.2.0")
    pin = _pin(built["stable"], "stablepkg", "0.3")
    [ext] = abi.wheel_needs(built["stable"]).extensions
    assert ext.kind == "stable"
    assert abi.mismatch(pin, ext, new) is None
    m = abi.mismatch(pin, ext, old)
    assert m is not None and m.missing == ("aoti_torch_new_thing",)
    rel, why = abi.built_for(pin, abi.wheel_needs(built["stable"]), [])
    assert rel == "2.2.0 or later" and "stable ABI" in why


def test_a_library_torch_does_not_have_is_named(built, tmp_path):
    other = _wheel(
        tmp_path / "torch-2.2.0-cp311-cp311-linux_x86_64.whl",
        "torch",
        "2.2.0",
        {"torch/lib/libc10_cuda.so": built["torch-new"].parent / "new" / "libc10.so"},
    )
    ex = abi.torch_exports(other, "2.2.0+cpu")
    [ext] = abi.wheel_needs(built["stable"]).extensions
    m = abi.mismatch(_pin(built["stable"], "stablepkg", "0.3"), ext, ex)
    assert m is not None and m.missing_libs == ("libc10.so",)
    assert "links libc10.so, which torch 2.2.0+cpu does not have" in m.sentence()


def test_built_for_comes_from_the_metadata_the_local_label_the_table_or_an_earlier_read(built):
    rows = abi.companion_table(
        '[[build]]\npackage = "CxxPkg"\nversions = "==1.1"\ntorch = "==2.1.*"\n'
        'built_for = "2.1"\nsource = "its release notes"\n'
    )
    assert (
        abi.built_for(_pin(built["cxx"], "cxxpkg", "1.0"), abi.wheel_needs(built["cxx"]), rows)[0]
        == "2.1.0"
    )
    local = _pin(built["cxx-local"], "cxxpkg", "1.2+cu12torch2.1")
    assert abi.built_for(local, abi.wheel_needs(built["cxx-local"]), [])[0] == "2.1"
    loose = _pin(built["cxx-loose"], "cxxpkg", "1.1")
    needs = abi.wheel_needs(built["cxx-loose"])
    assert abi.built_for(loose, needs, rows) == ("2.1", "companion table: its release notes")
    assert abi.built_for(loose, needs, []) == ("", "")
    old = abi.torch_exports(built["torch-old"], "2.1.0")
    new = abi.torch_exports(built["torch-new"], "2.2.0")
    assert abi.built_for(loose, needs, [], [new, old])[0] == "2.1.0"


def test_the_bundled_companion_table_has_a_source_for_every_row():
    rows = abi.companion_table()
    assert rows and all(r.source and r.built_for for r in rows)


def _lockfile(pins: list[Wheel]) -> Lockfile:
    from envspec import lock as lockmod

    base = lockmod.load(Path(__file__).parents[2] / "lockfiles" / "h100-train.lock")
    return base.model_copy(update={"wheels": pins})


def test_the_check_raises_with_the_hint_and_keeps_its_verdict(built, tmp_path):
    torch = _pin(built["torch-new"], "torch", "2.2.0", group="torch")
    pkg = _pin(built["cxx"], "cxxpkg", "1.0")
    lock = _lockfile([torch, pkg, _pin(built["weak"], "weakpkg", "1.0")])
    check = abi.AbiCheck(tmp_path / "abi", rows=[])
    assert {w.name for w in check.unread(lock)} == {"cxxpkg", "weakpkg"}
    assert check.torch_unread(lock) is None  # until a candidate's extensions are known
    paths = {
        w.sha256: built[k]
        for w, k in ((torch, "torch-new"), (pkg, "cxx"), (lock.wheels[2], "weak"))
    }
    found = check.check(lock, paths)
    assert [(m.package, m.module) for m in found] == [("cxxpkg", "cxxpkg/_C.so")]
    assert found[0].built_for.startswith("2.1.0; its metadata says torch==2.1.0")
    assert 'set [torch] version = "==2.1.0"' in found[0].hint
    with pytest.raises(AbiMismatch) as e:
        abi.raise_for(found, "h100.lock")
    assert e.value.exit_code == EXIT_BAD_INPUT == 2
    assert "at::scale(c10::Opt const&, int)" in e.value.message
    assert e.value.to_json()["mismatches"][0]["missing_demangled"] == [
        "at::scale(c10::Opt const&, int)"
    ]
    # warm: no file is read, the same verdict comes back
    warm = abi.AbiCheck(tmp_path / "abi", rows=[])
    assert warm.unread(lock) == [] and warm.torch_unread(lock) is None
    assert warm.check(lock, {}) == found and warm.read_cold == []


def test_a_torch_that_fits_passes(built, tmp_path):
    torch = _pin(built["torch-old"], "torch", "2.1.0", group="torch")
    pkg = _pin(built["cxx"], "cxxpkg", "1.0")
    found = abi.AbiCheck(tmp_path, rows=[]).check(
        _lockfile([torch, pkg]), {torch.sha256: built["torch-old"], pkg.sha256: built["cxx"]}
    )
    assert found == []


def test_the_companion_table_refuses_a_lock_without_its_wheels(built, tmp_path):
    rows = abi.companion_table(
        '[[build]]\npackage = "cxxpkg"\nversions = "==1.1"\ntorch = "==2.1.*"\n'
        'built_for = "2.1"\nsource = "its release notes"\n'
    )
    torch = _pin(built["torch-new"], "torch", "2.2.0", group="torch")
    lock = _lockfile([torch, _pin(built["cxx-loose"], "cxxpkg", "1.1")])
    [m] = abi.table_mismatches(lock, rows)
    assert m.package == "cxxpkg" and "companion table: its release notes" in m.built_for
    assert m.sentence() == (
        "cxxpkg 1.1: (every extension module) (torch's C++ ABI; built for torch 2.1; "
        "companion table: its release notes) is not built for torch 2.2.0"
    )
    assert abi.AbiCheck(tmp_path, rows=rows).check(lock, {}) == [m]  # no wheel read


def test_check_lock_fetches_the_candidates_then_torch_only_where_one_links_it(built, tmp_path):
    torch = _pin(built["torch-new"], "torch", "2.2.0", group="torch")
    pkg = _pin(built["stable"], "stablepkg", "0.3")
    other = _pin(built["no-torch"], "other", "1.0")
    files = {
        torch.sha256: built["torch-new"],
        pkg.sha256: built["stable"],
        other.sha256: built["no-torch"],
    }
    asked: list[list[str]] = []

    def fetch(pins):
        asked.append(sorted(p.name for p in pins))
        return {p.sha256: files[p.sha256] for p in pins}

    assert abi.check_lock(_lockfile([torch, other]), tmp_path, fetch) == ["other"]
    assert asked == [["other"]]  # nothing links torch: the torch wheel is not fetched
    asked.clear()
    assert abi.check_lock(_lockfile([torch, pkg, other]), tmp_path, fetch) == ["stablepkg", "torch"]
    assert asked == [["stablepkg"], ["torch"]]
    asked.clear()
    assert abi.check_lock(_lockfile([torch, pkg, other]), tmp_path, fetch) == [] and asked == []
    old = _pin(built["torch-old"], "torch", "2.1.0", group="torch")
    files[old.sha256] = built["torch-old"]
    with pytest.raises(AbiMismatch) as e:
        abi.check_lock(_lockfile([old, pkg]), tmp_path, fetch, lock_name="cpu.lock")
    assert e.value.message.startswith(
        "cpu.lock: 1 extension module(s) cannot load beside torch 2.1.0"
    )
    assert "aoti_torch_new_thing" in e.value.message and "2.2.0 or later" in e.value.message


def test_of_modules_built_for_several_torch_releases_only_the_one_for_the_locked_torch_is_judged():
    ext = [
        abi.Extension(f"pkg/addon_torch{t}-cuda.so", ("libc10.so",), ("_ZN3c104gone",))
        for t in ("24", "29", "214")
    ]
    plain = abi.Extension("pkg/_C.so", ("libc10.so",), ("aoti_torch_x",))
    assert [x.path for x in abi.loaded_beside([*ext, plain], "2.14.1+cu130")] == [
        "pkg/addon_torch214-cuda.so",
        "pkg/_C.so",
    ]
    assert [x.path for x in abi.loaded_beside([*ext[:2], plain], "2.14.1")] == [
        "pkg/_C.so"
    ]  # none for 2.14: none loads
    one = [abi.Extension("pkg/ext_torch24.so", ("libc10.so",), ())]
    assert (
        abi.loaded_beside(one, "2.14.1") == one
    )  # a single module is judged, whatever its name says


def test_a_library_the_extensions_wheel_or_another_locked_wheel_ships_is_not_judged_against_torch(
    built, tmp_path
):
    """torchaudio's _torchaudio.so links libtorchaudio.so, which torchaudio's own wheel ships
    (torchaudio/lib/): named like torch's libraries, it is not torch's to have (issue 57)."""
    old = built["torch-old"].parent / "old"
    helper = shutil.copy(built["cxx"].parent / "libhelper.so", tmp_path / "libhelper.so")
    own = _cc(tmp_path, "libtorchaudio", EXT_HELPER)
    ext = _cc(tmp_path, "_audio", EXT_CPP, links=("c10", "torchaudio", "helper"), libdir=old)
    audio = _wheel(
        tmp_path / "audiopkg-2.1.0-cp311-cp311-linux_x86_64.whl",
        "audiopkg",
        "2.1.0",
        {
            "audiopkg/_audio.so": ext,
            "audiopkg/lib/libtorchaudio.so": own,
            "a.libs/libhelper.so": helper,
        },
        "torch==2.1.0",
    )
    needs = abi.wheel_needs(audio)
    assert needs.ships == ("libtorchaudio.so",)
    assert [x.libs for x in needs.extensions] == [("libc10.so",)]
    torch = _pin(built["torch-old"], "torch", "2.1.0", group="torch")
    pin = _pin(audio, "audiopkg", "2.1.0")
    paths = {torch.sha256: built["torch-old"], pin.sha256: audio}
    assert abi.AbiCheck(tmp_path / "abi", rows=[]).check(_lockfile([torch, pin]), paths) == []
    # a module linking a library that another locked wheel ships finds it there
    user = _cc(tmp_path, "_user", EXT_CPP, links=("c10", "torchaudio", "helper"), libdir=old)
    other = _wheel(
        tmp_path / "userpkg-1.0-cp311-cp311-linux_x86_64.whl",
        "userpkg",
        "1.0",
        {"userpkg/_user.so": user, "u.libs/libhelper.so": helper},
        "torch==2.1.0",
    )
    [x] = abi.wheel_needs(other).extensions
    assert x.libs == ("libc10.so", "libtorchaudio.so")
    upin = _pin(other, "userpkg", "1.0")
    paths[upin.sha256] = other
    check = abi.AbiCheck(tmp_path / "abi2", rows=[])
    assert check.check(_lockfile([torch, pin, upin]), paths) == []
    # alone, it cannot load: the library is named, and the hint never proposes the locked torch
    [m] = abi.AbiCheck(tmp_path / "abi3", rows=[]).check(_lockfile([torch, upin]), paths)
    assert m.missing_libs == ("libtorchaudio.so",)
    assert m.hint and 'version = "==2.1.0"' not in m.hint
