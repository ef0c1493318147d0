"""envspec.debian.make_rootfs on small fake packages (tests/data/debian/fakedeb.py): no network."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from envspec.debian import DebPin, RecordingReporter, make_rootfs
from envspec.debian.debfile import DebFile, parse_stanza
from envspec.debian.rootfs import _Tree
from envspec.errors import BuildError, UsageError

DATA = Path(__file__).resolve().parents[1] / "data" / "debian"
sys.path.insert(0, str(DATA))
from fakedeb import Entry, Pkg, make_deb  # noqa: E402

AS_ROOT = os.geteuid() == 0
PASSWD_MASTER = b"""root:*:0:0:root:/root:/bin/bash
daemon:*:1:1:daemon:/usr/sbin:/usr/sbin/nologin
www-data:*:33:33:www-data:/var/www:/usr/sbin/nologin
nobody:*:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
GROUP_MASTER = b"root:*:0:\ndaemon:*:1:\nwww-data:*:33:\nshadow:*:42:\nnogroup:*:65534:\n"


def packages() -> list[Pkg]:
    certs = sorted((DATA / "certs").glob("*.crt"))
    return [
        Pkg(
            "base-files",
            "12.4",
            files=[
                Entry("./etc/issue", b"Debian GNU/Linux 12 \\n \\l\n"),
                Entry("./usr/lib/os-release", b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n'),
                Entry("./etc/os-release", link="../usr/lib/os-release"),
                Entry("./usr/share/base-files/dot.profile", b"# ~/.profile\n"),
                Entry("./usr/share/base-files/dot.bashrc", b"# ~/.bashrc\n"),
                Entry("./usr/share/base-files/profile", b"# /etc/profile\n"),
                Entry("./tmp/", mode=0o1777),
                Entry("./var/"),
            ],
            conffiles=["/etc/issue"],
        ),
        Pkg(
            "base-passwd",
            "3.6.1",
            files=[
                Entry("./usr/share/base-passwd/passwd.master", PASSWD_MASTER),
                Entry("./usr/share/base-passwd/group.master", GROUP_MASTER),
            ],
        ),
        Pkg(
            "dash",
            "0.5.12-2",
            files=[Entry("./bin/dash", b"#!dash\n", mode=0o755), Entry("./bin/sh", link="dash")],
        ),
        Pkg("bash", "5.2.15-2", files=[Entry("./bin/bash", b"#!bash\n", mode=0o755)]),
        Pkg(
            "libfoo1",
            "1.0-1",
            extra_control={"Multi-Arch": "same"},
            files=[
                Entry("./lib/x86_64-linux-gnu/libfoo.so.1.0", b"\x7fELF fake"),
                Entry("./lib/x86_64-linux-gnu/libfoo.so.1", link="libfoo.so.1.0"),
                Entry("./usr/bin/foo", b"foo", mode=0o755),
                Entry("./usr/bin/foo-hard", hardlink="./usr/bin/foo", mode=0o755),
            ],
        ),
        Pkg(
            "gcc",
            "4:12.2.0-3",
            files=[
                Entry("./usr/bin/gcc-12", b"gcc", mode=0o755),
                Entry("./usr/bin/gcc", link="gcc-12"),
            ],
        ),
        Pkg("passwd", "1:4.13", files=[Entry("./usr/bin/chfn", b"chfn", mode=0o4755)]),
        Pkg("overlap", "1.0", files=[Entry("./usr/share/common/file", b"from overlap")]),
        Pkg("overlap2", "1.0", files=[Entry("./usr/share/common/file", b"from overlap2")]),
        Pkg("tzdata", "2026f", arch="all", files=[Entry("./usr/share/zoneinfo/Etc/UTC", b"TZif")]),
        Pkg(
            "openssh-server",
            "1:9.2p1-2",
            files=[
                Entry("./usr/sbin/sshd", b"sshd", mode=0o755),
                Entry(
                    "./usr/share/openssh/sshd_config", b"Include /etc/ssh/sshd_config.d/*.conf\n"
                ),
            ],
        ),
        Pkg(
            "ca-certificates",
            "20250419",
            arch="all",
            files=[
                Entry(f"./usr/share/ca-certificates/mozilla/{c.name}", c.read_bytes())
                for c in certs
            ],
        ),
    ]


def build_debs(directory: Path) -> tuple[list[DebPin], dict[str, Path]]:
    pins, paths = [], {}
    for pkg in packages():
        path = make_deb(directory, pkg)
        body = path.read_bytes()
        pins.append(
            DebPin(
                name=pkg.name,
                version=pkg.version,
                architecture=pkg.arch,
                filename=f"pool/main/{pkg.name[0]}/{pkg.name}/{path.name}",
                size=len(body),
                sha256=hashlib.sha256(body).hexdigest(),
                suite="bookworm",
            )
        )
        paths[pkg.name] = path
    return pins, paths


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    return build_debs(tmp_path_factory.mktemp("debs"))


@pytest.fixture(scope="module")
def tree(debs, tmp_path_factory):
    pins, paths = debs
    dest = tmp_path_factory.mktemp("root") / "rootfs"
    rep = RecordingReporter()
    make_rootfs(pins, paths, dest, user="envspec", uid=1000, reporter=rep, jobs=2)
    return dest, rep


def manifest(root: Path) -> list[tuple]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                what = "-> " + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                what = "dir"
            out.append((rel, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, what))
    return out


def test_merged_usr(tree):
    root, _ = tree
    for d in ("bin", "sbin", "lib", "lib64"):
        assert os.readlink(root / d) == f"usr/{d}"
    assert (root / "usr/bin/dash").read_bytes() == b"#!dash\n"
    assert os.readlink(root / "usr/bin/sh") == "dash"
    assert (root / "usr/lib/x86_64-linux-gnu/libfoo.so.1.0").is_file()
    assert (root / "bin/bash").is_file()  # through the /bin link


def test_file_kinds_and_modes(tree):
    root, _ = tree
    assert os.path.samefile(root / "usr/bin/foo", root / "usr/bin/foo-hard")
    assert stat.S_IMODE((root / "usr/bin/foo").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "usr/bin/chfn").stat().st_mode) == 0o4755  # set-uid kept
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    assert stat.S_IMODE((root / "var/tmp").stat().st_mode) == 0o1777
    assert stat.S_IMODE((root / "root").stat().st_mode) == 0o700


def test_later_package_wins_an_overlap_and_is_reported(tree):
    root, rep = tree
    assert (root / "usr/share/common/file").read_bytes() == b"from overlap2"
    warnings = [a[0] for n, a in rep.events if n == "warning"]
    assert any("overlap -> overlap2" in w for w in warnings)


def test_dpkg_database(tree):
    root, _ = tree
    status = (root / "var/lib/dpkg/status").read_text()
    stanzas = [parse_stanza(s) for s in status.strip().split("\n\n")]
    names = [dict(s)["Package"] for s in stanzas]
    assert names == sorted(names) and len(names) == len(packages())
    for s in stanzas:
        assert s[0][0] == "Package" and s[1] == ("Status", "install ok installed")
    base = dict(stanzas[names.index("base-files")])
    md5 = hashlib.md5(b"Debian GNU/Linux 12 \\n \\l\n").hexdigest()
    assert base["Conffiles"].strip() == f"/etc/issue {md5}"
    info = root / "var/lib/dpkg/info"
    assert (info / "format").read_text() == "1\n"
    assert (info / "libfoo1:amd64.list").read_text().splitlines()[:3] == [
        "/.",
        "/lib",
        "/lib/x86_64-linux-gnu",
    ]
    assert "/bin/dash" in (info / "dash.list").read_text().splitlines()
    assert (info / "base-files.conffiles").read_text() == "/etc/issue\n"
    assert (info / "dash.md5sums").read_text().endswith("  bin/dash\n")


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg not installed")
def test_dpkg_reads_the_database(tree):
    root, _ = tree
    admin = str(root / "var/lib/dpkg")
    audit = subprocess.run(
        ["dpkg", f"--admindir={admin}", "--audit"], capture_output=True, text=True
    )
    assert audit.returncode == 0 and audit.stdout == ""
    q = subprocess.run(
        ["dpkg-query", f"--admindir={admin}", "-W", "-f", "${Package} ${Status}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "libfoo1 install ok installed" in q and len(q) == len(packages())
    owner = subprocess.run(
        ["dpkg-query", f"--admindir={admin}", "-S", "/bin/dash"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert owner.startswith("dash:")


def test_users(tree):
    root, _ = tree
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert passwd[0] == "root:x:0:0:root:/root:/bin/bash"
    assert "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin" in passwd
    assert passwd[-1] == "envspec:x:1000:1000::/workspace:/bin/bash"
    assert (root / "etc/group").read_text().splitlines()[-1] == "envspec:x:1000:"
    shadow = (root / "etc/shadow").read_text().splitlines()
    assert "envspec:*::0:99999:7:::" in shadow and len(shadow) == len(passwd)
    assert stat.S_IMODE((root / "etc/shadow").stat().st_mode) == 0o640
    assert (root / "run/sshd").is_dir()
    if AS_ROOT:
        assert (root / "workspace").stat().st_uid == 1000 and (
            root / "workspace"
        ).stat().st_gid == 1000
        assert (root / "etc/shadow").stat().st_gid == 42


def test_certificates(tree):
    root, _ = tree
    certs = sorted((DATA / "certs").glob("*.crt"))
    bundle = (root / "etc/ssl/certs/ca-certificates.crt").read_bytes()
    assert bundle == b"".join(c.read_bytes() for c in certs)
    assert (
        os.readlink(root / "etc/ssl/certs/ISRG_Root_X1.pem")
        == "/usr/share/ca-certificates/mozilla/ISRG_Root_X1.crt"
    )
    assert (
        os.readlink(root / "etc/ssl/certs/4042bcee.0") == "ISRG_Root_X1.pem"
    )  # openssl x509 -subject_hash
    assert (root / "etc/ca-certificates.conf").read_text().splitlines()[1:] == [
        f"mozilla/{c.name}" for c in certs
    ]


def test_maintainer_script_fixups(tree):
    root, _ = tree
    assert os.readlink(root / "usr/bin/cc") == "gcc"
    assert os.readlink(root / "etc/localtime") == "/usr/share/zoneinfo/Etc/UTC"
    assert (root / "etc/timezone").read_text() == "Etc/UTC\n"
    assert (root / "root/.profile").read_text() == "# ~/.profile\n"
    assert (root / "etc/profile").read_text() == "# /etc/profile\n"
    assert (root / "etc/ssh/sshd_config").read_text().startswith("Include")
    assert "/bin/bash" in (root / "etc/shells").read_text().splitlines()
    assert os.readlink(root / "var/run") == "/run"
    assert (root / "workspace").is_dir()


@pytest.mark.skipif(not AS_ROOT, reason="ldconfig -r chroots: needs root")
def test_ld_so_cache(tree):
    root, _ = tree
    assert (root / "etc/ld.so.cache").is_file()
    assert not (root / "var/cache/ldconfig/aux-cache").exists()


def test_same_input_same_tree(debs, tree, tmp_path):
    root, _ = tree
    pins, paths = debs
    again = tmp_path / "again"
    make_rootfs(list(reversed(pins)), paths, again, user="envspec", uid=1000, jobs=1)
    assert manifest(again) == manifest(root)


def test_no_host_facts_in_generated_files(tree):
    root, _ = tree
    host = os.uname().nodename
    for rel in (
        "etc/passwd",
        "etc/group",
        "etc/shadow",
        "var/lib/dpkg/status",
        "etc/ca-certificates.conf",
        "etc/shells",
        "etc/timezone",
    ):
        assert host not in (root / rel).read_text()


def test_refuses_non_empty_destination(debs, tmp_path):
    pins, paths = debs
    (tmp_path / "x").write_text("x")
    with pytest.raises(BuildError, match="not empty"):
        make_rootfs(pins, paths, tmp_path)


def test_missing_deb(debs, tmp_path):
    pins, paths = debs
    with pytest.raises(BuildError, match="no .deb given for: dash"):
        make_rootfs(pins, {k: v for k, v in paths.items() if k != "dash"}, tmp_path / "r")


@pytest.mark.parametrize(
    "user,uid",
    [
        ("root", 1000),
        ("Bad User", 1000),
        ("envspec", 0),
        ("envspec", 70000),
        ("www-data", 1000),
        ("envspec", 33),
    ],
)
def test_bad_image_user(debs, tmp_path, user, uid):
    pins, paths = debs
    with pytest.raises(UsageError) as ei:
        make_rootfs(pins, paths, tmp_path / "r", user=user, uid=uid)
    assert ei.value.reference == "bad-image-user"


def test_deb_that_is_not_the_pin(debs, tmp_path):
    pins, paths = debs
    swapped = dict(paths, dash=paths["bash"])
    with pytest.raises(BuildError, match="holds bash"):
        make_rootfs(pins, swapped, tmp_path / "r", jobs=1)


def test_path_escape_refused():
    with pytest.raises(BuildError, match=r"'\.\.'"):
        _Tree.canonical("./usr/../../etc/passwd")
    assert _Tree.canonical("./lib64/ld-linux-x86-64.so.2") == "usr/lib64/ld-linux-x86-64.so.2"
    assert _Tree.canonical("./etc/") == "etc"


def test_debfile_reads_gz_and_plain_members(tmp_path):
    for comp in ("gz", "bz2", ""):
        path = make_deb(
            tmp_path, Pkg(f"p{comp or 'plain'}", "1", files=[Entry("./usr/bin/x", b"x")]), comp=comp
        )
        deb = DebFile(path)
        assert dict(deb.control())["Package"] == f"p{comp or 'plain'}"
        with deb.open_tar(deb.data_tar_bytes()) as tf:
            assert "./usr/bin/x" in tf.getnames()


def test_debfile_rejects_garbage(tmp_path):
    bad = tmp_path / "bad.deb"
    bad.write_bytes(b"not an ar archive")
    with pytest.raises(BuildError, match="not a Debian package"):
        DebFile(bad)


def test_trixie_base_files_ships_the_merged_links(tmp_path):
    """trixie's base-files carries bin -> usr/bin itself; bookworm's packages ship into /bin."""
    pkgs = [
        Pkg(
            "base-files",
            "13.8",
            files=[
                Entry("./bin", link="usr/bin"),
                Entry("./lib", link="usr/lib"),
                Entry("./usr/lib/os-release", b"ID=debian\n"),
            ],
        ),
        Pkg(
            "old-style",
            "1",
            files=[Entry("./bin/tool", b"t", mode=0o755), Entry("./lib/libx.so", b"x")],
        ),
    ]
    pins, paths = [], {}
    for pkg in pkgs:
        path = make_deb(tmp_path, pkg)
        body = path.read_bytes()
        pins.append(
            DebPin(
                name=pkg.name,
                version=pkg.version,
                architecture="amd64",
                filename=f"pool/main/x/{path.name}",
                size=len(body),
                sha256=hashlib.sha256(body).hexdigest(),
                suite="trixie",
            )
        )
        paths[pkg.name] = path
    root = tmp_path / "root"
    make_rootfs(pins, paths, root, jobs=1)
    assert os.readlink(root / "bin") == "usr/bin" and os.readlink(root / "lib") == "usr/lib"
    assert (root / "usr/bin/tool").is_file() and (root / "usr/lib/libx.so").is_file()
    assert "/bin" in (root / "var/lib/dpkg/info/base-files.list").read_text().splitlines()
