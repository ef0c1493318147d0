"""Build time: the pinned .debs, fetched into a content-addressed cache and checked.

The cache is ``cache_dir/sha256/<hex>``. A file only ever appears there, read-only, by an atomic
rename of a download whose sha256 was checked, so a file there whose hash is wrong was changed
behind envspec's back: it is removed, with a warning, and fetched again. Only when no source has
the locked bytes does the build stop (HashMismatch, naming every source tried).

Where a file is looked for, in order, for each mirror given (snapshot first when configured):
the mirror itself for pins of the main archive; for pins of the security pocket, the security
archive beside the mirror (.../debian -> .../debian-security), then the mirror itself under
``pool/`` instead of ``pool/updates/`` (where the same file lands once a point release folds
the fix in).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from envspec import settings
from envspec.cache.store import admit
from envspec.errors import HashMismatch, SourceError

from .closure import security_mirror_for
from .models import CANONICAL_MIRROR, DebPin
from .reporter import DebianReporter

_ConnKey = tuple[str, str, int | None]  # (scheme, host, port) of a kept-alive connection

SNAPSHOT_ENV = settings.DEBIAN_SNAPSHOT
USER_AGENT = "envspec (+https://github.com/envspec)"
CHUNK = 1 << 20


class Body(Protocol):
    """What ``_download`` reads a response through."""

    def read(self, n: int, /) -> bytes: ...


Opener = Callable[
    [str, float], AbstractContextManager[Body]
]  # (url, timeout) -> a response to read


def _urlopen(url: str, timeout: float) -> http.client.HTTPResponse:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    resp: http.client.HTTPResponse = urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 (http(s) mirrors only)
    return resp


class _Response:
    """A response on a kept-alive connection: the connection is reused once the body is read."""

    def __init__(
        self,
        resp: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        pool: dict[_ConnKey, http.client.HTTPConnection],
        key: _ConnKey,
    ) -> None:
        self._resp, self._conn, self._pool, self._key = resp, conn, pool, key

    def read(self, n: int = -1) -> bytes:
        return self._resp.read(n)

    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._resp.isclosed() and exc[0] is None:
            self._pool[self._key] = self._conn
        else:
            self._conn.close()


class KeepAliveOpener:
    """GETs over one kept-alive connection per thread and host.

    urllib opens a connection, and resolves the host name, per file; a closure is a hundred or
    more files, and on hosts whose resolver drops a query now and then each lost query costs the
    resolver's 5 s timeout. Proxies from the environment are honoured by handing over to urllib.
    """

    def __init__(self, max_redirects: int = 5) -> None:
        self._local = threading.local()
        self.max_redirects = max_redirects

    def __call__(self, url: str, timeout: float) -> AbstractContextManager[Body]:
        if urllib.request.getproxies():
            return _urlopen(url, timeout)
        pool = self._local.__dict__.setdefault("pool", {})
        for _ in range(self.max_redirects + 1):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https"):
                raise urllib.error.URLError(f"unsupported URL scheme in {url}")
            assert parts.hostname is not None, (
                url
            )  # ("http:///x" has none; http.client needs one too)
            key = (parts.scheme, parts.hostname, parts.port)
            conn = pool.pop(key, None)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
                if conn is None:
                    cls = (
                        http.client.HTTPSConnection
                        if parts.scheme == "https"
                        else http.client.HTTPConnection
                    )
                    conn = cls(parts.hostname, parts.port, timeout=timeout)
                try:
                    conn.request("GET", path or "/", headers={"User-Agent": USER_AGENT})
                    resp = conn.getresponse()
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    conn.close()
                    conn = None
                    if attempt:
                        raise
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                resp.read()
                pool[key] = conn
                url = urllib.parse.urljoin(url, resp.getheader("Location"))
                continue
            if resp.status >= 400:
                resp.read()
                pool[key] = conn
                raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.headers, None)
            return _Response(resp, conn, pool, key)
        raise urllib.error.URLError(f"too many redirects for {url}")


_DEFAULT_OPENER = KeepAliveOpener()


def mirror_list(
    canonical: str = CANONICAL_MIRROR,
    *,
    snapshot: str | None = None,
    mirrors: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The mirrors to try, in order: the snapshot (argument, else $ENVSPEC_DEBIAN_SNAPSHOT),
    then configured mirrors, then the canonical archive; duplicates dropped."""
    env = os.environ if env is None else env
    snap = snapshot if snapshot is not None else settings.read(env).debian_snapshot
    out: list[str] = []
    for m in [snap, *mirrors, canonical]:
        m = (m or "").strip().rstrip("/")
        if m and m not in out:
            out.append(m)
    return out


def candidate_urls(pin: DebPin, mirrors: list[str]) -> list[str]:
    """Every URL that may serve ``pin``'s file, in the order they are tried."""
    out: list[str] = []

    def add(u: str) -> None:
        if u not in out:
            out.append(u)

    for m in mirrors:
        m = m.rstrip("/")
        if pin.is_security:
            sec = (
                m
                if m.endswith("-security") or "/debian-security/" in m + "/"
                else security_mirror_for(m)
            )
            if sec:
                add(f"{sec}/{pin.filename}")
        elif m.endswith("-security"):
            continue  # a security archive does not carry the main pool
        if not m.endswith("-security"):
            add(f"{m}/{pin.filename}")
            if pin.filename.startswith("pool/updates/"):
                add(f"{m}/pool/{pin.filename[len('pool/updates/') :]}")
    return out


def cache_path(cache_dir: Path, sha256: str) -> Path:
    return Path(cache_dir) / "sha256" / sha256


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _gone_hint(pin: DebPin) -> str:
    return (
        "Debian removes superseded versions from its mirrors. Either fetch from a snapshot of the "
        "archive taken when the lock was made: set [sources] debian_snapshot = "
        '"https://snapshot.debian.org/archive/debian/<timestamp>" in the spec (or '
        f"{SNAPSHOT_ENV}=https://snapshot.debian.org/archive/debian/<timestamp>; timestamps look "
        f"like 20261130T000000Z), or re-lock to the current version: envspec lock --upgrade-package {pin.name}"
    )


class _Gone(Exception):
    pass


class _Mismatch(Exception):
    """A source's bytes under the pinned name are not the pinned ones (what it gave)."""


def _cached_whole(pin: DebPin, dest: Path, reporter: DebianReporter) -> bool:
    """Whether the cache holds ``pin``'s bytes at ``dest``; a file changed behind envspec's back
    is dropped (a link: only the link), with a warning, to be fetched again."""
    if not dest.exists():
        return False
    got = _sha256_file(dest)
    if got == pin.sha256:
        return True
    dest.unlink(missing_ok=True)
    reporter.warning(
        f"the cached {pin.filename} ({dest}) no longer matched its sha256 (sha256 {got}); "
        "it was removed and is fetched again"
    )
    return False


def fetch_deb(
    pin: DebPin,
    *,
    mirrors: list[str],
    cache_dir: Path,
    opener: Opener | None = None,
    reporter: DebianReporter | None = None,
    timeout: float = 60.0,
    retries: int = 2,
) -> Path:
    """The checked cache file of ``pin``, downloading it from the first mirror that has it.

    Raises HashMismatch when the cached or downloaded bytes are not the pinned ones, and
    SourceError ``deb-gone`` when every mirror answered 404 (the version left the archive).
    ``$ENVSPEC_DEBIAN_SNAPSHOT``, when set, is tried before ``mirrors``.
    """
    reporter = reporter or DebianReporter()
    opener = opener or _DEFAULT_OPENER
    dest = cache_path(cache_dir, pin.sha256)
    if _cached_whole(pin, dest, reporter):
        reporter.fetched(pin, dest, True)
        return dest

    # The caller's order, with the environment's snapshot (the documented way out) first.
    env_snap = settings.read().debian_snapshot.strip().rstrip("/")
    ordered = [m for m in dict.fromkeys([env_snap, *(m.strip().rstrip("/") for m in mirrors)]) if m]
    ordered = ordered or [CANONICAL_MIRROR]
    dest.parent.mkdir(parents=True, exist_ok=True)

    failures: list[str] = []
    mismatches: list[str] = []
    gone = 0
    urls = candidate_urls(pin, ordered)
    for url in urls:
        try:
            path = _download(
                pin, url, dest, opener=opener, reporter=reporter, timeout=timeout, retries=retries
            )
        except (
            _Mismatch
        ) as e:  # other bytes under this name: the next source may have the right ones
            mismatches.append(f"{url} gave {e}")
            continue
        except _Gone as e:
            gone += 1
            failures.append(f"{url}: {e}")
            continue
        except (
            OSError,
            http.client.HTTPException,
        ) as e:  # URLError, timeouts, resets, truncated bodies, 5xx
            failures.append(f"{url}: {_reason(e)}")
            continue
        reporter.fetched(pin, path, False)
        return path

    raise _not_fetched(pin, mismatches, failures, gone)


def _not_fetched(
    pin: DebPin, mismatches: list[str], failures: list[str], gone: int
) -> HashMismatch | SourceError:
    """Why no mirror gave ``pin``: other bytes, the version gone from the archive (``gone``
    mirrors said 404), or no mirror reached."""
    detail = "\n".join(f"  {f}" for f in failures)
    if mismatches:  # no source has the locked bytes: every one tried is named
        return HashMismatch(
            f"no source has the locked bytes of {pin.label()} (sha256 {pin.sha256}, {pin.size} bytes):\n"
            + "\n".join(f"  {m}" for m in [*mismatches, *failures]),
            step="fetch",
            hint="a mirror serves other bytes under this name; check the mirrors, or re-lock "
            "(`envspec lock`) if the archive itself changed",
        )
    if gone:
        return SourceError(
            f"{pin.label()} is pinned by the lock but no mirror has it any more:\n{detail}",
            hint=_gone_hint(pin),
            reference="deb-gone",
        )
    return SourceError(
        f"cannot download {pin.label()}:\n{detail}",
        hint="check the network, or set a mirror that serves the Debian archive",
        reference="debian-mirror-unreachable",
    )


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)
    return f"{type(e).__name__}: {e}"


def _download(
    pin: DebPin,
    url: str,
    dest: Path,
    *,
    opener: Opener,
    reporter: DebianReporter,
    timeout: float,
    retries: int,
) -> Path:
    attempt = 0
    while True:
        attempt += 1
        tmp = (
            dest.parent
            / f".{dest.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.part"
        )
        try:
            reporter.fetching(pin, url)
            h = hashlib.sha256()
            size = 0
            with opener(url, timeout) as resp, open(tmp, "wb") as out:
                while chunk := resp.read(CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            got = h.hexdigest()
            if got != pin.sha256:
                raise _Mismatch(f"sha256 {got}, {size} bytes")
            # Another process may have renamed the same checked bytes here first: same content.
            return admit(tmp, dest)
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                raise _Gone(f"HTTP {e.code}") from None
            if attempt > retries or e.code < 500:
                raise
        except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException):
            if attempt > retries:  # a dropped connection, a truncated body: try again, then give up
                raise
        finally:
            tmp.unlink(missing_ok=True)
        time.sleep(0.5 * attempt)


def fetch_debs(
    pins: list[DebPin],
    *,
    mirrors: list[str],
    cache_dir: Path,
    jobs: int = 4,
    opener: Opener | None = None,
    reporter: DebianReporter | None = None,
) -> dict[str, Path]:
    """fetch_deb for many pins on a small thread pool; {pin name: cache path}.

    Every pin is attempted; the failures are reported together (a hash mismatch first, since it
    is the more serious).
    """
    results: dict[str, Path] = {}
    errors: list[tuple[DebPin, SourceError | HashMismatch]] = []

    def one(pin: DebPin) -> None:
        try:
            results[pin.name] = fetch_deb(
                pin, mirrors=mirrors, cache_dir=cache_dir, opener=opener, reporter=reporter
            )
        except (SourceError, HashMismatch) as e:
            errors.append((pin, e))

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, sorted(pins, key=DebPin.sort_key)))
    if errors:
        errors.sort(key=lambda pe: (not isinstance(pe[1], HashMismatch), pe[0].name))
        if len(errors) == 1 or isinstance(errors[0][1], HashMismatch):
            raise errors[0][1]
        first = errors[0][1]
        ref = (
            "deb-gone"
            if any(getattr(e, "reference", "") == "deb-gone" for _, e in errors)
            else first.reference
        )
        gone = [p for p, e in errors if getattr(e, "reference", "") == "deb-gone"]
        hint = first.hint
        if gone:
            hint = _gone_hint(gone[0]).replace(
                f"--upgrade-package {gone[0].name}",
                " ".join(f"--upgrade-package {p.name}" for p in gone),
            )
        raise SourceError(
            f"{len(errors)} .debs could not be fetched:\n" + "\n".join(str(e) for _, e in errors),
            hint=hint,
            reference=ref,
        )
    return results
