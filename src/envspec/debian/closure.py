"""Lock time: the closure of the requested Debian packages, resolved by apt itself.

envspec does not solve Debian dependencies. It gives apt a private configuration (its own
sources, an empty dpkg status, its own lists and caches, no host configuration at all), lets
`apt-get update` fill it, asks `apt-get install --print-uris` what it would download for the
requested packages on an empty system, and reads the exact version, archive path, size and
SHA256 of each of those files from the Packages indexes apt downloaded (apt's own output
prints an MD5 or nothing for some pockets, so it only names the files).

Layout under ``cache_dir/debian-apt/<suite>-<arch>-<key>/`` (key: hash of the sources):
``apt.conf``, ``sources.list``, empty ``parts/`` ``preferences.d/`` ``trusted.gpg.d/``,
an empty ``status``, ``lists/``, ``archives/``, ``updated`` (its mtime says when the indexes
were last fetched), ``index.sqlite`` (the Packages indexes, reduced to what a pin needs).
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from envspec.causes import DebianUnsatisfiable, InvalidDebianPackage, UnknownDebianPackage
from envspec.errors import HostError, ResolutionImpossible, SourceError

from .models import CANONICAL_MIRROR, DebPin, sorted_pins
from .reporter import DebianReporter

# one stanza of a Packages file: name, version, architecture, filename, size, sha256
PackageRow = tuple[str, str, str, str, int, str]

DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
MAX_INDEX_AGE_S = 6 * 3600
INDEX_SCHEMA = 1  # bump when index.sqlite's tables change: old ones are rebuilt

_FIELDS_RE = re.compile(
    r"^(Package|Version|Architecture|Filename|Size|SHA256|Provides): *(.*)$", re.M
)
_URI_RE = re.compile(r"^'([^']+)' (\S+) (\d+) ?(\S*)$")
_REQ_RE = re.compile(r"^([a-z0-9][a-z0-9+.\-]+)(?::[a-z0-9]+)?(?:[=/].+)?$")


def security_mirror_for(mirror: str) -> str:
    """The security archive beside a Debian mirror: .../debian -> .../debian-security.

    Works for deb.debian.org and for snapshot.debian.org/archive/debian/<timestamp>; "" when the
    mirror's layout is not one of those (pass ``security_mirror`` explicitly then).
    """
    m = mirror.rstrip("/")
    if m.endswith("/debian"):
        return m + "-security"
    snap = re.match(r"^(.*/archive/)debian(/[0-9TZ]+)$", m)
    if snap:
        return f"{snap.group(1)}debian-security{snap.group(2)}"
    return ""


def pockets(suite: str, with_security: bool) -> list[str]:
    """The pockets envspec resolves from, in order of preference when one file is in several."""
    out = [suite, f"{suite}-updates"]
    if with_security:
        out.append(f"{suite}-security")
    return out


class AptRoot:
    """A private apt configuration for one suite, architecture and set of sources."""

    def __init__(
        self,
        suite: str,
        *,
        mirror: str,
        security_mirror: str,
        architecture: str,
        components: tuple[str, ...],
        cache_dir: Path,
        keyring: Path,
    ) -> None:
        self.suite = suite
        self.mirror = mirror.rstrip("/")
        self.security_mirror = security_mirror.rstrip("/")
        self.architecture = architecture
        self.components = components
        self.keyring = keyring
        ident = "\n".join(
            [suite, self.mirror, self.security_mirror, architecture, " ".join(components)]
        )
        key = hashlib.sha256(ident.encode()).hexdigest()[:12]
        self.root = Path(cache_dir) / "debian-apt" / f"{suite}-{architecture}-{key}"
        self.pockets = pockets(suite, bool(self.security_mirror))

    # -- configuration -------------------------------------------------------------------
    def sources_list(self) -> str:
        comps = " ".join(self.components)
        opts = f"[arch={self.architecture} signed-by={self.keyring}]"
        lines = [
            f"deb {opts} {self.mirror} {self.suite} {comps}",
            f"deb {opts} {self.mirror} {self.suite}-updates {comps}",
        ]
        if self.security_mirror:
            lines.append(f"deb {opts} {self.security_mirror} {self.suite}-security {comps}")
        return "\n".join(lines) + "\n"

    def apt_conf(self) -> str:
        r = self.root
        items = {
            "Dir::State": r / "state",
            "Dir::State::lists": r / "lists",
            "Dir::State::status": r / "status",
            "Dir::State::extended_states": r / "state" / "extended_states",
            "Dir::Cache": r / "cache",
            "Dir::Cache::archives": r / "archives",
            "Dir::Cache::pkgcache": r / "cache" / "pkgcache.bin",
            "Dir::Cache::srcpkgcache": r / "cache" / "srcpkgcache.bin",
            "Dir::Etc::sourcelist": r / "sources.list",
            "Dir::Etc::sourceparts": r / "parts",
            "Dir::Etc::parts": r / "parts",
            "Dir::Etc::preferences": r / "preferences",
            "Dir::Etc::preferencesparts": r / "preferences.d",
            "Dir::Etc::trusted": r / "trusted.gpg",
            "Dir::Etc::trustedparts": r / "trusted.gpg.d",
            "Dir::Log": r / "state",
            "APT::Architecture": self.architecture,
            "APT::Sandbox::User": "root",  # the cache may live where _apt cannot write
            "APT::Install-Recommends": "false",
            "APT::Install-Suggests": "false",
            "APT::Get::AllowUnauthenticated": "false",
            "Acquire::Languages": "none",
            "Acquire::PDiffs": "false",
            "Acquire::GzipIndexes": "false",  # plain Packages files: read by the index builder
            "Acquire::Retries": "2",
            "Acquire::http::Timeout": "20",
            "Acquire::https::Timeout": "20",
            "APT::Update::Error-Mode": "any",  # any failed index makes update exit non-zero
            "Binary::apt-get::Acquire::AllowInsecureRepositories": "false",
        }
        lines = [f'{k} "{v}";' for k, v in items.items()]
        lines.append(f'APT::Architectures {{ "{self.architecture}"; }};')
        return "\n".join(lines) + "\n"

    def prepare(self) -> None:
        for d in (
            "state",
            "lists/partial",
            "cache",
            "archives/partial",
            "parts",
            "preferences.d",
            "trusted.gpg.d",
        ):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        _write_if_changed(self.root / "sources.list", self.sources_list())
        _write_if_changed(self.root / "apt.conf", self.apt_conf())
        status = self.root / "status"
        if not status.exists() or status.stat().st_size:
            status.write_text("")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("APT_")}
        env.update(
            APT_CONFIG=str(self.root / "apt.conf"),
            LC_ALL="C.UTF-8",
            LANG="C.UTF-8",
            DEBIAN_FRONTEND="noninteractive",
        )
        return env

    def run(self, args: list[str], reporter: DebianReporter) -> subprocess.CompletedProcess[str]:
        argv = ["apt-get", *args]
        reporter.command(argv)
        try:
            return subprocess.run(argv, env=self.env(), capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise HostError(
                "apt-get is not installed; envspec resolves Debian packages with apt",
                hint="run envspec on a Debian or Ubuntu host (apt-get install apt)",
                reference="apt-missing",
            ) from None

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "envspec.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- indexes -------------------------------------------------------------------------
    @property
    def stamp(self) -> Path:
        return self.root / "updated"

    @property
    def index_path(self) -> Path:
        return self.root / "index.sqlite"

    def index_age(self) -> float | None:
        if not self.stamp.exists() or not self.index_path.exists():
            return None
        return max(0.0, time.time() - self.stamp.stat().st_mtime)

    def update(self, *, max_age: float, offline: bool, reporter: DebianReporter) -> None:
        """Make the indexes fresh enough, or fall back to cached ones with a warning."""
        if not self.keyring.exists():
            raise HostError(
                f"the Debian archive keyring {self.keyring} is missing",
                hint="apt-get install debian-archive-keyring",
                reference="debian-keyring-missing",
            )
        with self.locked():
            self.prepare()
            if self.stamp.exists() and not _index_schema_ok(self.index_path):
                self.build_index(
                    reporter
                )  # an older envspec's index: rebuilt from the lists on disk
            age = self.index_age()
            if age is not None and _index_schema_ok(self.index_path) and (offline or age < max_age):
                reporter.index_fresh(self.suite, age)
                return
            if offline:
                raise SourceError(
                    f"no cached Debian indexes for {self.suite} under {self.root} and offline mode is on",
                    hint="run once with network access to the Debian mirror",
                    reference="debian-index-unavailable",
                )
            reporter.index_updating(self.suite)
            t0 = time.monotonic()
            proc = self.run(["update", "-q"], reporter)
            if proc.returncode != 0:
                why = _apt_errors(proc.stdout + proc.stderr)
                if age is not None and _index_schema_ok(self.index_path):
                    hours = age / 3600
                    reporter.warning(
                        f"could not refresh the Debian indexes for {self.suite} ({why}); "
                        f"using the cached ones from {hours:.1f} h ago"
                    )
                    return
                raise SourceError(
                    f"cannot download the Debian indexes for {self.suite} from {self.mirror}"
                    + (f" and {self.security_mirror}" if self.security_mirror else "")
                    + f":\n  {why}",
                    hint="check the network or the mirror ([sources] debian_mirror)",
                    reference="debian-index-unavailable",
                )
            self.build_index(reporter)
            self.stamp.touch()
            os.utime(self.stamp)
            reporter.index_updated(self.suite, time.monotonic() - t0)

    def index_files(self, reporter: DebianReporter) -> list[tuple[Path, str, str]]:
        """(local Packages file, pocket, repository URI) for every index apt keeps."""
        proc = self.run(
            ["indextargets", "--format", "$(IDENTIFIER)\t$(FILENAME)\t$(RELEASE)\t$(REPO_URI)"],
            reporter,
        )
        if proc.returncode != 0:
            raise SourceError(
                f"apt-get indextargets failed: {_apt_errors(proc.stdout + proc.stderr)}"
            )
        out = []
        for line in proc.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 4 and parts[0] == "Packages":
                out.append((Path(parts[1]), parts[2], parts[3].rstrip("/")))
        return out

    def build_index(self, reporter: DebianReporter) -> None:
        tmp = self.index_path.with_suffix(f".tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)
        db = sqlite3.connect(tmp)
        try:
            db.executescript(
                "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
                "CREATE TABLE debs (name TEXT, version TEXT, arch TEXT, filename TEXT, size INTEGER,"
                " sha256 TEXT, pocket TEXT, repo TEXT, rank INTEGER);"
                "CREATE TABLE provides (name TEXT, provider TEXT);"
            )
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(INDEX_SCHEMA),))
            files = self.index_files(reporter)
            if not files:
                raise SourceError(
                    f"apt kept no Packages index for {self.suite}",
                    reference="debian-index-unavailable",
                )
            for path, pocket, repo in files:
                if not path.exists():
                    raise SourceError(
                        f"apt's index {path} is missing after `apt-get update`",
                        reference="debian-index-unavailable",
                    )
                rank = self.pockets.index(pocket) if pocket in self.pockets else len(self.pockets)
                debs, provides = parse_packages(path.read_text(encoding="utf-8", errors="replace"))
                db.executemany(
                    "INSERT INTO debs VALUES (?,?,?,?,?,?,?,?,?)",
                    [(*d, pocket, repo, rank) for d in debs],
                )
                db.executemany("INSERT INTO provides VALUES (?,?)", provides)
            db.executescript(
                "CREATE INDEX debs_filename ON debs(filename);"
                "CREATE INDEX debs_name ON debs(name, version, arch);"
                "CREATE INDEX provides_name ON provides(name);"
            )
            db.commit()
        finally:
            db.close()
        os.replace(tmp, self.index_path)


def parse_packages(text: str) -> tuple[list[PackageRow], list[tuple[str, str]]]:
    """The fields of each stanza of a Packages file that a pin needs, and its Provides."""
    debs: list[PackageRow] = []
    provides: list[tuple[str, str]] = []
    for stanza in text.split("\n\n"):
        f = dict(_FIELDS_RE.findall(stanza))
        name = f.get("Package")
        if not name or "Filename" not in f or "SHA256" not in f:
            continue
        debs.append(
            (
                name,
                f.get("Version", ""),
                f.get("Architecture", ""),
                f["Filename"],
                int(f.get("Size") or 0),
                f["SHA256"].strip(),
            )
        )
        if f.get("Provides"):
            for item in f["Provides"].split(","):
                virt = item.strip().split(" ")[0].split(":")[0]
                if virt:
                    provides.append((virt, name))
    return debs, provides


def _index_schema_ok(path: Path) -> bool:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return False
    return bool(row) and row[0] == str(INDEX_SCHEMA)


def _write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _apt_errors(output: str) -> str:
    """apt's E:/Err lines, or its last lines, joined for a message."""
    lines = [ln.strip() for ln in output.splitlines()]
    errs = [ln for ln in lines if ln.startswith(("E:", "W:", "Err:"))]
    picked = errs or [ln for ln in lines if ln][-5:]
    seen: list[str] = []
    for ln in picked:
        if ln not in seen:
            seen.append(ln)
    return "; ".join(seen[:8]) or "no output"


def _unmet(output: str) -> list[str]:
    """apt's reasons: the indented lines under "The following packages have unmet dependencies:"
    and "Package X is a virtual package provided by:", and its E: lines."""
    out: list[str] = []
    grab = False
    for ln in output.splitlines():
        if "have unmet dependencies" in ln:
            grab = True
            continue
        if "is a virtual package provided by" in ln:
            out.append(ln.strip())
            grab = True
            continue
        if grab and ln.startswith(" ") and ln.strip():
            out.append(ln.strip())
            continue
        grab = False
        if ln.startswith("E:") and ln not in out:
            out.append(ln)
    return out or [_apt_errors(output)]


def _requested_name(req: str) -> str:
    m = _REQ_RE.match(req.strip())
    if not m:
        raise ResolutionImpossible(
            f"{req!r} is not a Debian package name (NAME, NAME=VERSION or NAME/POCKET)",
            causes=[InvalidDebianPackage(requested=req)],
            reference="invalid-debian-package",
        )
    return m.group(1)


def _did_you_mean(db: sqlite3.Connection, name: str) -> list[str]:
    rows = db.execute(
        "SELECT DISTINCT name FROM debs WHERE name LIKE ? UNION "
        "SELECT DISTINCT name FROM provides WHERE name LIKE ?",
        (name[:1] + "%", name[:1] + "%"),
    ).fetchall()
    return difflib.get_close_matches(name, [r[0] for r in rows], n=3, cutoff=0.75)


@dataclass(frozen=True, kw_only=True)
class DebianArchive:
    """Where a closure is resolved from: the mirror, its security mirror (None: derived from
    ``mirror``, .../debian -> .../debian-security; "": the security pocket left out), the
    architecture, the components, the keyring the Release files are checked with."""

    mirror: str = CANONICAL_MIRROR
    security_mirror: str | None = None
    architecture: str = "amd64"
    components: tuple[str, ...] = ("main",)
    keyring: Path = DEFAULT_KEYRING


def resolve_closure(
    suite: str,
    requested: list[str],
    *,
    archive: DebianArchive = DebianArchive(),
    cache_dir: Path,
    max_index_age: float = MAX_INDEX_AGE_S,
    offline: bool = False,
    reporter: DebianReporter | None = None,
) -> list[DebPin]:
    """Every .deb an empty system needs to have ``requested`` installed, sorted by name.

    Essential packages are *not* implied: pass the base set (``base_packages``) in ``requested``.
    Indexes younger than ``max_index_age`` seconds are not fetched again; when the mirror is
    unreachable, cached ones are used with a warning.
    """
    reporter = reporter or DebianReporter()
    if not requested:
        return []
    a = archive
    root = AptRoot(
        suite,
        mirror=a.mirror,
        security_mirror=security_mirror_for(a.mirror)
        if a.security_mirror is None
        else a.security_mirror,
        architecture=a.architecture,
        components=tuple(a.components),
        cache_dir=Path(cache_dir),
        keyring=Path(a.keyring),
    )
    root.update(max_age=max_index_age, offline=offline, reporter=reporter)
    db = sqlite3.connect(f"file:{root.index_path}?mode=ro", uri=True)
    try:
        _refuse_unknown(db, root, suite, requested)
        with root.locked():
            proc = root.run(
                ["install", "--print-uris", "-y", "-q", "--no-install-recommends", "--"]
                + sorted(requested),
                reporter,
            )
        if proc.returncode != 0:
            reasons = _unmet(proc.stdout + proc.stderr)
            raise ResolutionImpossible(
                f"apt cannot install {', '.join(sorted(requested))} on Debian {suite}:\n"
                + "\n".join(f"  {r}" for r in reasons),
                causes=[
                    DebianUnsatisfiable(
                        suite=suite, requested=tuple(sorted(requested)), apt=tuple(reasons)
                    )
                ],
                hint="drop or change the package in [system].packages",
                reference="debian-unsatisfiable",
            )
        return _pins_from_uris(db, proc.stdout, suite)
    finally:
        db.close()


def _refuse_unknown(
    db: sqlite3.Connection, root: AptRoot, suite: str, requested: list[str]
) -> None:
    """``ResolutionImpossible`` naming every requested package the archive does not have (by
    name or as a virtual package), each with the names it may have meant."""
    names = {req: _requested_name(req) for req in requested}
    unknown: list[UnknownDebianPackage] = []
    for _req, name in sorted(names.items()):
        hit = db.execute(
            "SELECT 1 FROM debs WHERE name=? UNION SELECT 1 FROM provides WHERE name=? LIMIT 1",
            (name, name),
        ).fetchone()
        if not hit:
            unknown.append(
                UnknownDebianPackage(
                    name=name,
                    suite=suite,
                    pockets=tuple(root.pockets),
                    did_you_mean=tuple(_did_you_mean(db, name)),
                )
            )
    if not unknown:
        return
    words = []
    for c in unknown:
        w = f"{c.name!r}"
        if c.did_you_mean:
            w += f" (did you mean {' or '.join(repr(x) for x in c.did_you_mean)}?)"
        words.append(w)
    n = len(unknown)
    raise ResolutionImpossible(
        f"Debian {suite} ({', '.join(root.components)}) has no package{'s' if n > 1 else ''} "
        f"named {', '.join(words)}",
        causes=unknown,
        hint="check the name at https://packages.debian.org/" + suite,
        reference="unknown-debian-package",
    )


def _pins_from_uris(db: sqlite3.Connection, output: str, suite: str) -> list[DebPin]:
    repos = [r[0] for r in db.execute("SELECT DISTINCT repo FROM debs")]
    pins: dict[tuple[str, str], DebPin] = {}
    for line in output.splitlines():
        m = _URI_RE.match(line.strip())
        if not m:
            continue
        uri = unquote(m.group(1))
        repo = next(
            (r for r in sorted(repos, key=len, reverse=True) if uri.startswith(r + "/")), None
        )
        path = uri[len(repo) + 1 :] if repo else ""
        row = (
            db.execute(
                "SELECT name, version, arch FROM debs WHERE repo=? AND filename=? LIMIT 1",
                (repo, path),
            ).fetchone()
            if repo
            else None
        )
        if not row:
            raise SourceError(
                f"apt would download {uri}, which the cached indexes do not list",
                hint="the indexes changed under envspec; run the lock again",
                reference="debian-index-inconsistent",
            )
        # The same file can sit in several pockets (a security fix folded into a point release):
        # record the most durable one, deterministically.
        best = db.execute(
            "SELECT name, version, arch, filename, size, sha256, pocket FROM debs "
            "WHERE name=? AND version=? AND arch=? ORDER BY rank, pocket, filename LIMIT 1",
            row,
        ).fetchone()
        pin = DebPin(
            name=best[0],
            version=best[1],
            architecture=best[2],
            filename=best[3],
            size=best[4],
            sha256=best[5],
            suite=best[6],
        )
        pins[(pin.name, pin.architecture)] = pin
    return sorted_pins(pins.values())
