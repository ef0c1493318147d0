"""Images of another CPU architecture on this host: binfmt_misc facts (a fake /proc tree),
`envspec run` (podman --arch, or arch-not-runnable), doctor's arch line; and debian/ldcache.py,
the ld.so.cache writer for a foreign tree (its agreement with ldconfig is in
tests/e2e/test_arm64_e2e.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from envspec.cli import main
from envspec.debian import ldcache
from envspec.doctor import check_arch
from envspec.errors import UsageError
from envspec.host import Host, Tool, _binfmt
from envspec.lock import load
from envspec.run import RunOptions, plan_run

ROOT = Path(__file__).resolve().parents[2]
ARM_LOCK = ROOT / "lockfiles" / "smoke-arm64.lock"
X86_LOCK = ROOT / "lockfiles" / "smoke.lock"
QEMU = (
    "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: {flags}\noffset 0\n"
    "magic 7f454c460201010000000000000000000200b700\n"
)


def proc(tmp_path: Path, status: str | None = "enabled", entry: str | None = None) -> Path:
    d = tmp_path / "proc/sys/fs/binfmt_misc"
    d.mkdir(parents=True)
    if status is not None:
        (d / "status").write_text(status + "\n")
    if entry is not None:
        (d / "qemu-aarch64").write_text(entry)
    return tmp_path


def test_binfmt_with_qemu_aarch64_and_the_f_flag(tmp_path):
    # on an x86_64 host only the aarch64 entry matters (qemu-x86_64 would be the host's own)
    assert _binfmt(proc(tmp_path, entry=QEMU.format(flags="PF")), "x86_64") == (("aarch64",), "")


@pytest.mark.parametrize(
    "status, entry, says",
    [
        (None, None, "mount -t binfmt_misc"),
        ("enabled", None, "apt-get install -y qemu-user-static"),
        (
            "enabled",
            QEMU.format(flags="PF").replace("enabled", "disabled", 1),
            "update-binfmts --enable qemu-aarch64",
        ),
        ("enabled", QEMU.format(flags="P"), "lacks the F flag"),
    ],
)
def test_binfmt_missing_says_what_to_do(tmp_path, status, entry, says):
    found, note = _binfmt(proc(tmp_path, status, entry), "x86_64")
    assert found == () and says in note


AMD64 = Host(
    tools={"podman": Tool("/usr/bin/podman"), "runc": Tool("/usr/bin/runc")},
    machine="x86_64",
    cwd="/srv/p",
    cwd_uid=0,
)


def test_run_refuses_an_arm64_image_without_emulation():
    with pytest.raises(UsageError) as e:
        plan_run(
            load(ARM_LOCK),
            ["true"],
            host=replace(AMD64, binfmt_note="binfmt_misc is not mounted"),
            options=RunOptions(emulate=True),
        )
    assert e.value.reference == "arch-not-runnable" and e.value.exit_code == 2
    assert "linux-aarch64" in e.value.message and "binfmt_misc is not mounted" in e.value.hint


def test_run_refuses_an_arm64_image_unless_emulation_is_asked_for():
    for host in (
        replace(AMD64, binfmt=("aarch64",)),
        replace(AMD64, binfmt_note="binfmt_misc is not mounted"),
    ):
        with pytest.raises(UsageError) as e:
            plan_run(load(ARM_LOCK), ["true"], host=host)
        assert e.value.reference == "emulation-not-asked" and e.value.exit_code == 2
        assert "linux-aarch64" in e.value.message and "--emulate" in e.value.hint


def test_run_starts_an_arm64_image_under_emulation_with_the_arch_flag():
    cmd = plan_run(
        load(ARM_LOCK),
        ["true"],
        host=replace(AMD64, binfmt=("aarch64",)),
        options=RunOptions(emulate=True),
    )
    i = cmd.argv.index("--arch")
    assert cmd.argv[i + 1] == "arm64" and cmd.argv.index("run") < i < cmd.argv.index(cmd.image)
    assert any("emulation" in w for w in cmd.warnings)
    docker = plan_run(
        load(ARM_LOCK),
        ["true"],
        host=replace(AMD64, binfmt=("aarch64",), docker="daemon"),
        options=RunOptions(engine="docker", emulate=True),
    )
    assert (
        "--platform" in docker.argv
        and docker.argv[docker.argv.index("--platform") + 1] == "linux/arm64"
    )


def test_run_under_emulation_mounts_a_cpu_tree_with_graces_cpu_id(tmp_path):
    from envspec.host import emulated_cpu_dir

    cmd = plan_run(
        load(ARM_LOCK),
        ["true"],
        host=replace(AMD64, binfmt=("aarch64",), cache_dir=tmp_path),
        options=RunOptions(emulate=True),
    )
    mount = f"{emulated_cpu_dir(tmp_path, 'aarch64')}:/sys/devices/system/cpu:ro"
    assert cmd.emulated_cpu == str(emulated_cpu_dir(tmp_path, "aarch64"))
    i = cmd.argv.index(mount)
    assert cmd.argv[i - 1] == "-v" and i < cmd.argv.index(cmd.image)
    assert any("MIDR_EL1" in n for n in cmd.notes)
    assert not any(p.exists() for p in tmp_path.iterdir())  # planning writes nothing
    bare = cmd.without_emulated_cpu()
    assert (
        mount not in bare.argv
        and "-v" not in bare.argv[i - 1 : i]
        and len(bare.argv) == len(cmd.argv) - 2
    )
    assert not any("MIDR_EL1" in n for n in bare.notes) and any(
        "segfault" in w for w in bare.warnings
    )
    native = plan_run(load(X86_LOCK), ["true"], host=replace(AMD64, cache_dir=tmp_path))
    assert native.emulated_cpu == "" and not any(
        a.endswith("/sys/devices/system/cpu:ro") for a in native.argv
    )


def test_the_emulated_cpu_tree_is_the_hosts_with_cpu_ids_added(tmp_path):
    from envspec.host import GRACE_MIDR_EL1, write_emulated_cpu_dir

    src = tmp_path / "sys"
    (src / "cpu0" / "topology").mkdir(parents=True)
    (src / "cpu1" / "cache" / "index0").mkdir(parents=True)
    (src / "online").write_text("0-1\n")
    (src / "cpu0" / "topology" / "core_id").write_text("0\n")
    (src / "cpu1" / "cache" / "index0" / "size").write_text("32K\n")
    (src / "cpu0" / "subsystem").symlink_to(src)  # sysfs links are not followed
    (src / "cpufreq").mkdir()
    dest = tmp_path / "cache" / "emulation" / "cpu"
    assert write_emulated_cpu_dir(dest, source=src)
    assert (dest / "online").read_text() == "0-1\n"
    assert (dest / "cpu0" / "topology" / "core_id").read_text() == "0\n"
    assert not (
        dest / "cpu1" / "cache"
    ).exists()  # the x86_64 caches: torch's aarch64 probe dies of them
    assert not (dest / "cpu0" / "subsystem").exists()
    for cpu in ("cpu0", "cpu1"):
        assert (
            dest / cpu / "regs" / "identification" / "midr_el1"
        ).read_text() == GRACE_MIDR_EL1 + "\n"
    assert not (dest / "cpufreq" / "regs").exists()
    (src / "online").write_text("0\n")  # made again each time, whole
    assert write_emulated_cpu_dir(dest, source=src) and (dest / "online").read_text() == "0\n"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["cpu"]  # nothing left beside it
    assert not write_emulated_cpu_dir(tmp_path / "x", source=tmp_path / "missing")


def test_run_of_a_native_image_has_no_arch_flag():
    cmd = plan_run(load(X86_LOCK), ["true"], host=replace(AMD64, binfmt=("aarch64",)))
    assert "--arch" not in cmd.argv and not any("emulation" in w for w in cmd.warnings)
    arm_host = replace(AMD64, machine="aarch64")
    assert "--arch" not in plan_run(load(ARM_LOCK), ["true"], host=arm_host).argv


def test_cli_run_exits_2_for_an_image_it_cannot_start(monkeypatch, capsys):
    import envspec.host

    real = envspec.host.detect_host
    monkeypatch.setattr(
        envspec.host,
        "detect_host",
        lambda *a, **k: replace(real(*a, **k), binfmt=(), binfmt_note="no qemu here"),
    )
    assert main(["run", "--print", str(ARM_LOCK), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "error[emulation-not-asked]" in err and "--emulate" in err
    assert main(["run", "--print", "--emulate", str(ARM_LOCK), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "arch-not-runnable" in err and "no qemu here" in err


MULTI_LOCK = ARM_LOCK.parent / "smoke-multi.lock"


def test_run_of_a_multi_platform_lock_takes_the_hosts_platform():
    lock = load(MULTI_LOCK)
    here = plan_run(lock, ["true"], host=replace(AMD64, binfmt=("aarch64",)))
    assert here.image == lock.for_platform("linux-x86_64").image_tag and "--arch" not in here.argv
    arm_host = replace(AMD64, machine="aarch64")
    there = plan_run(lock, ["true"], host=arm_host)
    assert there.image == lock.for_platform("linux-aarch64").image_tag and there.image.endswith(
        "-arm64"
    )
    # another platform's section: by name, and under emulation only when asked
    with pytest.raises(UsageError) as e:
        plan_run(
            lock,
            ["true"],
            host=replace(AMD64, binfmt=("aarch64",)),
            options=RunOptions(platform="linux-aarch64"),
        )
    assert e.value.reference == "emulation-not-asked"
    emu = plan_run(
        lock,
        ["true"],
        host=replace(AMD64, binfmt=("aarch64",)),
        options=RunOptions(platform="linux-aarch64", emulate=True),
    )
    assert emu.image.endswith("-arm64") and emu.argv[emu.argv.index("--arch") + 1] == "arm64"


def test_run_of_a_lock_without_the_hosts_platform_names_the_way():
    with pytest.raises(UsageError) as e:
        plan_run(load(MULTI_LOCK), ["true"], host=replace(AMD64, machine="riscv64"))
    assert (
        e.value.reference == "platform-not-in-lock"
        and "--platform linux-aarch64 --emulate" in e.value.hint
    )


def test_doctor_names_the_architecture_and_emulation():
    plain = check_arch(AMD64, None)[0]
    assert plain.status == "info" and plain.what.startswith(
        "linux-x86_64; no emulation for linux-aarch64"
    )
    emu = check_arch(replace(AMD64, binfmt=("aarch64",)), load(ARM_LOCK))[0]
    assert (
        emu.status == "warn"
        and "emulation" in emu.what
        and emu.detail == {"machine": "x86_64", "emulation": ["aarch64"]}
    )
    blocked = check_arch(replace(AMD64, binfmt_note="mount it"), load(ARM_LOCK))[0]
    assert blocked.status == "fail" and blocked.fix == "mount it"
    assert check_arch(AMD64, load(X86_LOCK))[0].status == "info"


# --- ld.so.cache ----------------------------------------------------------------------------------


def test_libcmp_is_glibcs_order():
    # digit runs compare as numbers: libfoo.so.10 after libfoo.so.9; a digit sorts after a letter
    assert ldcache.libcmp("libfoo.so.10", "libfoo.so.9") > 0
    assert ldcache.libcmp("libfoo.so.1", "libfoo.so.1") == 0
    assert ldcache.libcmp("libz.so.1", "libzstd.so.1") < 0
    assert ldcache.libcmp("lib1.so", "liba.so") > 0 and ldcache.libcmp("liba.so", "lib1.so") < 0
    assert ldcache.libcmp("libc.so", "libc.so.6") < 0 and ldcache.libcmp("libc.so.6", "libc.so") > 0


def test_render_and_parse_round_trip_with_the_new_format_header():
    entries = [
        (0x0A03, "libz.so.1", "/lib/aarch64-linux-gnu/libz.so.1"),
        (0x0A03, "libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"),
    ]
    data = ldcache.render(entries)
    assert data.startswith(b"glibc-ld.so.cache1.1") and data[28] == 2  # little-endian flag
    assert ldcache.parse(data) == entries
    assert len(data) == 48 + 24 * 2 + sum(len(k) + len(v) + 2 for _, k, v in entries)


def test_soname_of_the_hosts_own_libc():
    libc = next(
        (
            p
            for p in (
                Path("/lib/x86_64-linux-gnu/libc.so.6"),
                Path("/lib/aarch64-linux-gnu/libc.so.6"),
            )
            if p.exists()
        ),
        None,
    )
    if libc is None:
        pytest.skip("no Debian libc.so.6 on this host")
    machine = 62 if "x86_64" in str(libc) else 183
    data = libc.read_bytes()
    assert ldcache.elf_soname(data, machine) == "libc.so.6"
    assert ldcache.elf_soname(data, 183 if machine == 62 else 62) is None  # another architecture's
    assert ldcache.elf_soname(b"not an elf", machine) is None
