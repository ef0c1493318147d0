"""Where package files come from: canonical indexes, and the mirrors that serve the same files.

A lock names files by canonical index, filename and sha256, never by a mirror's address. The
mirrors of one machine are found here, from (in order) the spec's ``[sources].mirrors``, the
``ENVSPEC_MIRRORS`` variable (whitespace- or comma-separated) and pip's configuration (its
``index-url``, ``extra-index-url`` and ``find-links`` from the usual files and ``PIP_*``
variables), so a team shares one lock while each machine fetches from what it can reach.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from envspec import settings
from envspec.errors import SourceError

if TYPE_CHECKING:
    from envspec.spec import Sources as SpecSources

PYPI = "https://pypi.org/simple"


Origin = Literal["spec", "env", "pip"]  # where a mirror was named


@dataclass(frozen=True)
class Mirror:
    """A place serving copies of index files: a simple index ('index') or a flat folder/page ('links')."""

    url: str
    kind: Literal["index", "links"]
    origin: Origin

    @property
    def path(self) -> Path | None:
        """The local folder behind a file:// or plain-path mirror."""
        if self.url.startswith("file://"):
            return Path(urllib.parse.unquote(urllib.parse.urlparse(self.url).path))
        if "://" not in self.url:
            return Path(self.url)
        return None


@dataclass(frozen=True)
class ResolvedSources:
    index: str = PYPI
    extra_indexes: tuple[str, ...] = ()
    torch_index: str = "https://download.pytorch.org/whl"
    mirrors: tuple[Mirror, ...] = ()
    debian_mirror: str = "http://deb.debian.org/debian"
    debian_security_mirror: str = "http://deb.debian.org/debian-security"
    debian_snapshot: str = ""
    notes: tuple[str, ...] = field(default=())
    # the files the lock being re-locked names, (filename, sha256) -> index: confirmed on that index
    # when it was locked, and taken as its own where the index cannot be read now (``credit``)
    confirmed: tuple[tuple[str, str, str], ...] = ()


def _split(value: str) -> list[str]:
    return [v for v in re.split(r"[\s,]+", value.strip()) if v]


def _pip_config_files(env: dict[str, str]) -> list[Path]:
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    files = [Path("/etc/pip.conf")]
    xdg_dirs = env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files += [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d]
    home = Path(env.get("HOME", str(Path.home())))
    files += [
        home / ".pip" / "pip.conf",
        Path(env.get("XDG_CONFIG_HOME", str(home / ".config"))) / "pip" / "pip.conf",
    ]
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    if env.get("VIRTUAL_ENV"):
        files.append(Path(env["VIRTUAL_ENV"]) / "pip.conf")
    return files


def pip_mirrors(env: dict[str, str] | None = None) -> list[Mirror]:
    """Indexes and find-links that pip on this machine is configured with (files, then PIP_* env)."""
    env = dict(os.environ) if env is None else env
    values: dict[str, list[str]] = {"index-url": [], "extra-index-url": [], "find-links": []}
    for f in _pip_config_files(env):
        if not f.is_file():
            continue
        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read(f)
        except configparser.Error:
            continue
        for section in ("global", "install", "download"):
            if cp.has_section(section):
                for key in values:
                    if cp.has_option(section, key):
                        values[key] = _split(cp.get(section, key))
    for key in values:
        envkey = "PIP_" + key.upper().replace("-", "_")
        if env.get(envkey):
            values[key] = _split(env[envkey])
    out = [Mirror(u, "index", "pip") for u in values["index-url"] + values["extra-index-url"]]
    out += [Mirror(u, "links", "pip") for u in values["find-links"]]
    return out


def flat_folder(url: str) -> bool:
    """Whether ``url`` is a local folder of files (find-links' layout), not a simple index: a team's
    wheelhouse can be its canonical index (``[sources].index = "file:///srv/wheels"``)."""
    p = Mirror(url, "index", "spec").path
    return (
        p is not None
        and p.is_dir()
        and not (p / "index.html").exists()
        and not any(p.glob("*/index.html"))
    )


def _as_mirror(url: str, origin: Origin) -> Mirror:
    if flat_folder(url):
        return Mirror(url, "links", origin)  # a flat folder of files
    return Mirror(url, "index", origin)


def discover(
    spec_sources: SpecSources | None = None, env: dict[str, str] | None = None
) -> ResolvedSources:
    """Combine the spec's ``[sources]`` with this machine's mirrors."""
    env = dict(os.environ) if env is None else env
    s = spec_sources
    mirrors: list[Mirror] = []
    if s is not None:
        mirrors += [_as_mirror(u, "spec") for u in s.mirrors]
    conf = settings.read(env)
    mirrors += [_as_mirror(u, "env") for u in _split(conf.mirrors)]
    if s is None or s.use_pip_config:
        canon = {(s.index if s else PYPI).rstrip("/")}
        mirrors += [m for m in pip_mirrors(env) if m.url.rstrip("/") not in canon]
    seen: set[str] = set()
    unique = []
    for m in mirrors:
        if m.url not in seen:
            seen.add(m.url)
            unique.append(m)
    out = ResolvedSources(mirrors=tuple(unique))
    if s is not None:
        out = dataclasses.replace(
            out,
            index=s.index,
            extra_indexes=tuple(s.extra_indexes),
            torch_index=s.torch_index,
            debian_mirror=s.debian_mirror,
            debian_security_mirror=s.debian_security_mirror,
            debian_snapshot=s.debian_snapshot,
        )
    if conf.debian_snapshot:
        out = dataclasses.replace(out, debian_snapshot=conf.debian_snapshot)
    if conf.debian_mirror:
        out = dataclasses.replace(out, debian_mirror=conf.debian_mirror)
    return out


@lru_cache(maxsize=64)
def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether the host of ``url`` accepts a TCP connection (file:// URLs: whether the path exists)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        return Path(urllib.parse.unquote(parsed.path)).exists()
    if settings.read().offline:
        return False
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


# --- reading simple indexes (used by wheels/fetch.py to find a pinned file by its name) ---------

PEP691_ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
    "text/html;q=0.1"
)


def normalize_name(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links += [v for k, v in attrs if k == "href" and v]


def _read_url(url: str, *, timeout: float) -> tuple[bytes, str, str]:
    """(body, content type, final URL); a file:// or plain-path directory reads its index.html."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        p = Path(urllib.parse.unquote(parsed.path))
        if p.is_dir():
            p = p / "index.html"
        return p.read_bytes(), "text/html", p.absolute().as_uri()
    req = urllib.request.Request(url, headers={"Accept": PEP691_ACCEPT, "User-Agent": "envspec"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (URLs from config/lock)
        return resp.read(), resp.headers.get("Content-Type", ""), resp.geturl()


def _links_to_files(body: bytes, base: str) -> dict[str, str]:
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    files: dict[str, str] = {}
    for href in parser.links:
        absolute = urllib.parse.urljoin(base, href).split("#", 1)[0]
        name = urllib.parse.unquote(urllib.parse.urlparse(absolute).path.rsplit("/", 1)[-1])
        if name:
            files.setdefault(name, absolute)
    return files


def project_files(index_url: str, project: str, *, timeout: float = 60) -> dict[str, str]:
    """{filename: absolute URL} of one project's files on a simple index: PEP 691 JSON when the
    server offers it, PEP 503 HTML otherwise (a folder of files: its files). Raises OSError (URLError)
    when unreachable."""
    if flat_folder(index_url):
        return links_files(index_url, timeout=timeout)
    page = index_url.rstrip("/") + "/" + normalize_name(project) + "/"
    body, ctype, final = _read_url(page, timeout=timeout)
    if "json" in ctype:
        data = json.loads(body)
        return {f["filename"]: urllib.parse.urljoin(final, f["url"]) for f in data.get("files", [])}
    return _links_to_files(body, final)


def listed_hashes(index_url: str, project: str, *, timeout: float = 60) -> dict[str, str]:
    """{filename: sha256} of one project's files on a simple index (PEP 691 JSON's ``hashes``, or a
    PEP 503 link's ``#sha256=`` fragment; "" where the index gives no hash). Raises OSError
    (URLError) when unreachable; an index with no page for the project lists nothing."""
    page = index_url.rstrip("/") + "/" + normalize_name(project) + "/"
    try:
        body, ctype, final = _read_url(page, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return {}
        raise
    except FileNotFoundError:
        return {}
    if "json" in ctype:
        data = json.loads(body)
        return {
            f["filename"]: str((f.get("hashes") or {}).get("sha256", ""))
            for f in data.get("files", [])
        }
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    out: dict[str, str] = {}
    for href in parser.links:
        absolute, _, fragment = urllib.parse.urljoin(final, href).partition("#")
        name = urllib.parse.unquote(urllib.parse.urlparse(absolute).path.rsplit("/", 1)[-1])
        if name:
            digest = fragment[len("sha256=") :] if fragment.startswith("sha256=") else ""
            out.setdefault(name, digest)
    return out


def links_files(mirror_url: str, *, timeout: float = 60) -> dict[str, str]:
    """{filename: URL} offered by a find-links location: a local folder, or an HTML page of links."""
    parsed = urllib.parse.urlparse(mirror_url)
    if parsed.scheme in ("", "file"):
        p = Path(urllib.parse.unquote(parsed.path))
        if p.is_dir():
            return {c.name: c.absolute().as_uri() for c in sorted(p.iterdir()) if c.is_file()}
    body, _ctype, final = _read_url(mirror_url, timeout=timeout)
    return _links_to_files(body, final)


# --- a file a mirror served, credited to the canonical index that serves it -------------------------


def mirror_of(url: str, sources: ResolvedSources) -> str:
    """The mirror (and where it was named) that serves ``url``; the URL's folder where none does."""
    named = {"spec": "[sources].mirrors", "env": "ENVSPEC_MIRRORS", "pip": "pip's configuration"}
    for m in sources.mirrors:
        base = m.url if "://" in m.url else Path(m.url).absolute().as_uri()
        if url.startswith((base.rstrip("/") + "/", m.url.rstrip("/") + "/")):
            return f"{m.url} ({named.get(m.origin, m.origin)})"
    return url.rsplit("/", 1)[0]


def credit(
    url: str,
    filename: str,
    sha256: str,
    project: str,
    where: list[str],
    sources: ResolvedSources,
) -> str:
    """The canonical index of ``where`` (in order) that lists ``filename`` with this ``sha256``: the
    index a file a mirror served (``url``) is credited to. A file a mirror alone has is never
    credited to a canonical index (issue 57): ``mirror-only-file`` where every index of ``where``
    answered without it, ``mirror-file-differs`` where one lists the name with another sha256. Where
    an index cannot be read, the lock being re-locked is the record (``sources.confirmed``); a file
    it does not name is ``unconfirmed-file``."""
    unread: list[str] = []
    for index in where:
        try:
            files = listed_hashes(index, project, timeout=30) if reachable(index) else None
        except (OSError, ValueError):
            files = None
        if files is None:
            unread.append(index)
            continue
        if filename in files:
            if files[filename] in ("", sha256):
                return index
            raise SourceError(
                f"{filename} from {mirror_of(url, sources)} has sha256 {sha256}, and {index} serves "
                f"that file with sha256 {files[filename]}: the mirror's copy is not the index's file",
                hint="refresh or remove the mirror's copy; a lock names only the files its canonical "
                "index serves",
                reference="mirror-file-differs",
            )
    kept = next(
        (i for f, h, i in sources.confirmed if f == filename and h == sha256 and i in where), None
    )
    if kept is not None:
        return kept
    if not unread:
        raise SourceError(
            f"{project}: {filename} came from {mirror_of(url, sources)}, and "
            f"{' nor '.join(where)} does not serve it: a lock names only files its canonical index "
            "serves, and a mirror serves copies of those",
            hint="take the file off the mirror, or leave the mirror out of this lock "
            "([sources].use_pip_config = false for pip's own find-links and indexes; "
            "ENVSPEC_MIRRORS); a build of your own belongs on an index named in [sources]",
            reference="mirror-only-file",
        )
    raise SourceError(
        f"{project}: {filename} came from {mirror_of(url, sources)}, and {', '.join(unread)} "
        "cannot be read here to confirm that it serves that file with sha256 "
        f"{sha256[:12]}...: a lock names only files its canonical index serves",
        hint="lock where the index answers (a build then fetches the file from the mirror by its "
        "sha256), or name an index you reach in [sources] (index, extra_indexes, torch_index): "
        "the lock then credits the file to it",
        reference="unconfirmed-file",
    )


# --- what the indexes serve, for a did-you-mean -----------------------------------------------------

NAMES_TTL_S = (
    24 * 3600
)  # a remote index's project list is kept this long (PyPI's: 40 MB, 900,000 names)
_ANCHOR_TEXT = re.compile(r">([^<>]+)</a>")
_DIST_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._]*?)-[0-9]")


def project_names(sources: ResolvedSources, *, cache_dir: Path, timeout: float = 30) -> set[str]:
    """The normalized names of the projects the configured indexes and mirrors serve: a find-links
    folder's files, a local simple index's folders, a remote index's root page (kept in
    ``cache_dir`` for a day). What cannot be read is left out: this serves a did-you-mean."""
    names: set[str] = set()
    for m in sources.mirrors:
        try:
            if m.kind == "links":
                names |= {
                    normalize_name(d.group(1))
                    for f in links_files(m.url, timeout=timeout)
                    if (d := _DIST_NAME.match(f))
                }
            elif m.path is not None and m.path.is_dir():
                names |= {normalize_name(c.name) for c in m.path.iterdir() if c.is_dir()}
            else:
                names |= _remote_names(m.url, cache_dir, timeout)
        except (OSError, ValueError):
            continue
    for url in (sources.index, *sources.extra_indexes):
        if flat_folder(url):
            names |= {
                normalize_name(d.group(1)) for f in links_files(url) if (d := _DIST_NAME.match(f))
            }
        elif reachable(url):
            try:
                names |= _remote_names(url, cache_dir, timeout)
            except (OSError, ValueError):
                continue
    return names


def _remote_names(index_url: str, cache_dir: Path, timeout: float) -> set[str]:
    import hashlib
    import time

    kept = (
        cache_dir / "index-names" / (hashlib.sha256(index_url.encode()).hexdigest()[:16] + ".txt")
    )
    try:
        if time.time() - kept.stat().st_mtime < NAMES_TTL_S:
            return set(kept.read_text(encoding="utf-8").split())
    except OSError:
        pass
    body, ctype, _final = _read_url(index_url.rstrip("/") + "/", timeout=timeout)
    if "json" in ctype:
        names = {normalize_name(p["name"]) for p in json.loads(body).get("projects", [])}
    else:
        names = {
            normalize_name(n.strip()) for n in _ANCHOR_TEXT.findall(body.decode("utf-8", "replace"))
        }
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("\n".join(sorted(names)) + "\n", encoding="utf-8")
    os.replace(tmp, kept)
    return names


def close_names(name: str, names: set[str], n: int = 3) -> list[str]:
    """The names in ``names`` closest to ``name`` (a misspelling: a letter missed, doubled, swapped
    or wrong), best first: at most two edits away (an adjacent swap is one), fewer edits first, then
    the same first letter, then difflib's ratio; none when nothing is that close."""
    import difflib

    want = normalize_name(name)
    sm = difflib.SequenceMatcher()
    sm.set_seq2(want)
    scored = []
    for c in names:  # 900,000 names on PyPI: the cheap tests first
        if abs(len(c) - len(want)) > 2 or c == want or (c[:2] != want[:2] and c[-2:] != want[-2:]):
            continue
        sm.set_seq1(c)
        if sm.real_quick_ratio() >= 0.75 and sm.quick_ratio() >= 0.75 and sm.ratio() >= 0.75:
            d = _edits(c, want)
            if d <= 2:
                scored.append((d, c[0] != want[0], -sm.ratio(), c))
    return [c for *_, c in sorted(scored)[:n]]


def _edits(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]
