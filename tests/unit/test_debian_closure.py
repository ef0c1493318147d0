"""envspec.debian.closure with a recorded apt: real apt-get outputs and Packages stanzas from
tests/data/debian (regenerate with tests/data/debian/record.py); no network."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envspec.causes import DebianUnsatisfiable, UnknownDebianPackage
from envspec.debian import DebianArchive, RecordingReporter, resolve_closure, security_mirror_for
from envspec.debian.closure import AptRoot, _unmet, parse_packages
from envspec.errors import EXIT_BAD_INPUT, EXIT_SOURCE, HostError, ResolutionImpossible, SourceError

DATA = Path(__file__).resolve().parents[1] / "data" / "debian"
MAIN = "http://deb.debian.org/debian"
SEC = "http://deb.debian.org/debian-security"
CASES = {
    ("liblzma5", "tini"): ("print-uris-tini", 0),
    ("exim4-daemon-heavy", "exim4-daemon-light"): ("unmet-exim", 100),
    ("awk",): ("virtual-awk", 100),
    ("python3=0.1-1",): ("version-missing", 100),
}


class FakeApt:
    """Stands in for AptRoot.run: answers update, indextargets and install from recorded data."""

    def __init__(self, lists: Path) -> None:
        self.lists = lists
        self.calls: list[list[str]] = []
        self.update_rc = 0

    def __call__(self, root: AptRoot, args: list[str], reporter) -> subprocess.CompletedProcess:
        self.calls.append(list(args))
        if args[0] == "update":
            err = (
                ""
                if self.update_rc == 0
                else "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Could not connect"
            )
            return subprocess.CompletedProcess(args, self.update_rc, "", err)
        if args[0] == "indextargets":
            lines = []
            for pocket in root.pockets:
                repo = SEC if pocket.endswith("-security") else MAIN
                lines.append(f"Packages\t{self.lists / (pocket + '_Packages')}\t{pocket}\t{repo}/")
            return subprocess.CompletedProcess(args, 0, "\n".join(lines) + "\n", "")
        if args[0] == "install":
            req = tuple(sorted(args[args.index("--") + 1 :]))
            case, rc = CASES[req]
            return subprocess.CompletedProcess(
                args, rc, (DATA / "apt" / f"{case}.txt").read_text(), ""
            )
        raise AssertionError(args)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def keyring(tmp_path):
    k = tmp_path / "keyring.gpg"
    k.write_bytes(b"fake")
    return k


@pytest.fixture
def fake_apt(monkeypatch):
    fake = FakeApt(DATA / "lists")
    monkeypatch.setattr(AptRoot, "run", lambda self, args, reporter: fake(self, args, reporter))
    return fake


def resolve(req, tmp_path, keyring, **kw):
    return resolve_closure(
        "bookworm", req, cache_dir=tmp_path / "cache", **kw, archive=DebianArchive(keyring=keyring)
    )


def test_closure_from_recorded_apt(tmp_path, keyring, fake_apt):
    pins = resolve(["tini", "liblzma5"], tmp_path, keyring)
    assert [p.name for p in pins] == ["gcc-12-base", "libc6", "libgcc-s1", "liblzma5", "tini"]
    by = {p.name: p for p in pins}
    libc = by["libc6"]
    assert libc.version == "2.36-9+deb12u14"
    assert libc.filename == "pool/main/g/glibc/libc6_2.36-9+deb12u14_amd64.deb"
    assert libc.size == 2759320 and libc.suite == "bookworm" and len(libc.sha256) == 64
    lz = by["liblzma5"]
    assert lz.suite == "bookworm-security" and lz.filename.startswith(
        "pool/updates/main/x/xz-utils/"
    )
    # the sha256 comes from the index (apt printed an MD5 or nothing)
    stanza = next(
        s
        for s in (DATA / "lists" / "bookworm-security_Packages").read_text().split("\n\n")
        if s.startswith("Package: liblzma5\n")
    )
    assert f"SHA256: {lz.sha256}" in stanza


def test_same_file_in_two_pockets_records_the_release(tmp_path, keyring, fake_apt):
    lists = tmp_path / "lists"
    shutil.copytree(DATA / "lists", lists)
    sec = (lists / "bookworm-security_Packages").read_text()
    stanza = next(s for s in sec.split("\n\n") if s.startswith("Package: liblzma5\n"))
    # a point release folds the security fix into the release: same bytes, pool/ path
    folded = stanza.replace("Filename: pool/updates/main/", "Filename: pool/main/")
    with open(lists / "bookworm_Packages", "a") as fh:
        fh.write("\n" + folded + "\n")
    fake_apt.lists = lists
    lz = {p.name: p for p in resolve(["tini", "liblzma5"], tmp_path, keyring)}["liblzma5"]
    assert lz.suite == "bookworm" and lz.filename.startswith("pool/main/x/xz-utils/")


def test_unknown_names_all_reported_with_did_you_mean(tmp_path, keyring, fake_apt):
    with pytest.raises(ResolutionImpossible) as ei:
        resolve(["pyton3", "tini", "mawkk"], tmp_path, keyring)
    e = ei.value
    assert e.reference == "unknown-debian-package" and e.exit_code == EXIT_BAD_INPUT
    assert "'pyton3' (did you mean 'python3'?)" in e.message and "'mawkk'" in e.message
    assert [c.name for c in e.causes if isinstance(c, UnknownDebianPackage)] == ["mawkk", "pyton3"]
    c = e.causes[1]
    assert isinstance(c, UnknownDebianPackage) and "python3" in c.did_you_mean
    assert "install" not in fake_apt.names()  # apt is not asked to install unknown names


def test_virtual_package_is_known_but_apt_says_why(tmp_path, keyring, fake_apt):
    with pytest.raises(ResolutionImpossible) as ei:
        resolve(["awk"], tmp_path, keyring)
    assert ei.value.reference == "debian-unsatisfiable"
    assert "virtual package provided by" in ei.value.message and "mawk" in ei.value.message


def test_unsatisfiable_carries_apts_reason(tmp_path, keyring, fake_apt):
    with pytest.raises(ResolutionImpossible) as ei:
        resolve(["exim4-daemon-light", "exim4-daemon-heavy"], tmp_path, keyring)
    assert ei.value.reference == "debian-unsatisfiable"
    assert "exim4-daemon-heavy : Conflicts: mail-transport-agent" in ei.value.message
    c = ei.value.causes[0]
    assert isinstance(c, DebianUnsatisfiable) and c.apt


def test_missing_version(tmp_path, keyring, fake_apt):
    with pytest.raises(ResolutionImpossible, match="Version '0.1-1' for 'python3' was not found"):
        resolve(["python3=0.1-1"], tmp_path, keyring)


def test_bad_request_syntax(tmp_path, keyring, fake_apt):
    with pytest.raises(ResolutionImpossible) as ei:
        resolve(["Bad Name"], tmp_path, keyring)
    assert ei.value.reference == "invalid-debian-package"


def test_fresh_indexes_are_not_fetched_again(tmp_path, keyring, fake_apt):
    rep = RecordingReporter()
    a = resolve(["tini", "liblzma5"], tmp_path, keyring, reporter=rep)
    assert fake_apt.names().count("update") == 1 and "index_updated" in rep.names()
    rep2 = RecordingReporter()
    b = resolve(["tini", "liblzma5"], tmp_path, keyring, reporter=rep2)
    assert a == b
    assert fake_apt.names().count("update") == 1 and "index_fresh" in rep2.names()
    resolve(["tini", "liblzma5"], tmp_path, keyring, max_index_age=0)
    assert fake_apt.names().count("update") == 2


def test_unreachable_mirror_falls_back_to_cache_with_warning(tmp_path, keyring, fake_apt):
    a = resolve(["tini", "liblzma5"], tmp_path, keyring)
    fake_apt.update_rc = 100
    rep = RecordingReporter()
    b = resolve(["tini", "liblzma5"], tmp_path, keyring, max_index_age=0, reporter=rep)
    assert a == b
    (warning,) = [args[0] for name, args in rep.events if name == "warning"]
    assert (
        "could not refresh the Debian indexes for bookworm" in warning
        and "Could not connect" in warning
    )


def test_unreachable_mirror_without_cache(tmp_path, keyring, fake_apt):
    fake_apt.update_rc = 100
    with pytest.raises(SourceError) as ei:
        resolve(["tini"], tmp_path, keyring)
    assert ei.value.reference == "debian-index-unavailable" and ei.value.exit_code == EXIT_SOURCE
    assert "Could not connect" in ei.value.message


def test_offline_mode(tmp_path, keyring, fake_apt):
    with pytest.raises(SourceError, match="offline"):
        resolve(["tini"], tmp_path, keyring, offline=True)
    resolve(["tini", "liblzma5"], tmp_path, keyring)
    n = len(fake_apt.calls)
    resolve(["tini", "liblzma5"], tmp_path, keyring, offline=True, max_index_age=0)
    assert "update" not in fake_apt.names()[n:]


def test_empty_request_is_empty(tmp_path, keyring, fake_apt):
    assert resolve([], tmp_path, keyring) == []
    assert fake_apt.calls == []


def test_missing_keyring(tmp_path, fake_apt):
    with pytest.raises(HostError) as ei:
        resolve(["tini"], tmp_path, tmp_path / "nope.gpg")
    assert ei.value.reference == "debian-keyring-missing"


def test_missing_apt(tmp_path, keyring, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HostError) as ei:
        resolve(["tini"], tmp_path, keyring)
    assert ei.value.reference == "apt-missing"


def test_index_not_matching_apt(tmp_path, keyring, fake_apt):
    lists = tmp_path / "lists"
    shutil.copytree(DATA / "lists", lists)
    text = (lists / "bookworm_Packages").read_text()
    (lists / "bookworm_Packages").write_text(
        "\n\n".join(s for s in text.split("\n\n") if not s.startswith("Package: libgcc-s1\n"))
    )
    fake_apt.lists = lists
    with pytest.raises(SourceError) as ei:
        resolve(["tini", "liblzma5"], tmp_path, keyring)
    assert ei.value.reference == "debian-index-inconsistent"


def test_private_configuration(tmp_path, keyring):
    root = AptRoot(
        "bookworm",
        mirror=MAIN + "/",
        security_mirror=SEC,
        architecture="arm64",
        components=("main", "contrib"),
        cache_dir=tmp_path,
        keyring=keyring,
    )
    src = root.sources_list().splitlines()
    assert src == [
        f"deb [arch=arm64 signed-by={keyring}] {MAIN} bookworm main contrib",
        f"deb [arch=arm64 signed-by={keyring}] {MAIN} bookworm-updates main contrib",
        f"deb [arch=arm64 signed-by={keyring}] {SEC} bookworm-security main contrib",
    ]
    conf = root.apt_conf()
    for key in (
        "Dir::State::status",
        "Dir::Etc::parts",
        "Dir::Etc::sourceparts",
        "Dir::Etc::preferencesparts",
        "Dir::Cache::archives",
        "Dir::State::lists",
    ):
        assert f'{key} "{root.root}' in conf
    assert 'APT::Architecture "arm64";' in conf and 'APT::Architectures { "arm64"; };' in conf
    assert root.pockets == ["bookworm", "bookworm-updates", "bookworm-security"]
    no_sec = AptRoot(
        "bookworm",
        mirror=MAIN,
        security_mirror="",
        architecture="amd64",
        components=("main",),
        cache_dir=tmp_path,
        keyring=keyring,
    )
    assert len(no_sec.sources_list().splitlines()) == 2 and no_sec.root != root.root


@pytest.mark.skipif(shutil.which("apt-config") is None, reason="apt-config not installed")
def test_private_configuration_ignores_the_hosts(tmp_path, keyring):
    root = AptRoot(
        "bookworm",
        mirror=MAIN,
        security_mirror=SEC,
        architecture="amd64",
        components=("main",),
        cache_dir=tmp_path,
        keyring=keyring,
    )
    root.prepare()
    dump = subprocess.run(
        ["apt-config", "dump"], env=root.env(), capture_output=True, text=True, check=True
    ).stdout
    assert f'Dir::Etc::sourcelist "{root.root}/sources.list";' in dump
    assert f'Dir::State::status "{root.root}/status";' in dump
    assert "Post-Invoke" not in dump  # nothing from /etc/apt/apt.conf.d
    assert (root.root / "status").read_text() == ""


@pytest.mark.parametrize(
    "mirror,sec",
    [
        ("http://deb.debian.org/debian", "http://deb.debian.org/debian-security"),
        ("http://deb.debian.org/debian/", "http://deb.debian.org/debian-security"),
        (
            "https://snapshot.debian.org/archive/debian/20261130T000000Z",
            "https://snapshot.debian.org/archive/debian-security/20261130T000000Z",
        ),
        ("http://mirror.example/ubuntu", ""),
    ],
)
def test_security_mirror_for(mirror, sec):
    assert security_mirror_for(mirror) == sec


def test_parse_packages_reads_provides():
    debs, provides = parse_packages((DATA / "lists" / "bookworm_Packages").read_text())
    names = {d[0] for d in debs}
    assert {"tini", "libc6", "mawk", "python3"} <= names
    assert ("awk", "mawk") in provides


def test_unmet_parsing():
    text = (DATA / "apt" / "unmet-exim.txt").read_text()
    assert _unmet(text)[:2] == [
        "exim4-daemon-heavy : Conflicts: mail-transport-agent",
        "exim4-daemon-light : Conflicts: mail-transport-agent",
    ]


def test_index_of_an_older_format_is_rebuilt_without_network(tmp_path, keyring, fake_apt):
    import sqlite3

    a = resolve(["tini", "liblzma5"], tmp_path, keyring)
    root = next((tmp_path / "cache" / "debian-apt").iterdir())
    db = sqlite3.connect(root / "index.sqlite")
    db.execute("UPDATE meta SET value='0' WHERE key='schema'")
    db.commit()
    db.close()
    fake_apt.update_rc = 100  # the mirror is down
    assert resolve(["tini", "liblzma5"], tmp_path, keyring) == a
    assert fake_apt.names().count("update") == 1
