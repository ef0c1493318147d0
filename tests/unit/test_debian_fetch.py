"""envspec.debian.fetch with an injected opener: no network."""

from __future__ import annotations

import hashlib
import io
import threading
import urllib.error

import pytest

from envspec.debian import (
    DebPin,
    RecordingReporter,
    candidate_urls,
    fetch_deb,
    fetch_debs,
    mirror_list,
)
from envspec.debian.fetch import SNAPSHOT_ENV, cache_path
from envspec.errors import EXIT_BUILD, EXIT_SOURCE, HashMismatch, SourceError

MAIN = "http://deb.debian.org/debian"
SNAP = "https://snapshot.debian.org/archive/debian/20261130T000000Z"


def make_pin(name: str, body: bytes, *, suite="bookworm", filename=None, version="1.0-1") -> DebPin:
    return DebPin(
        name=name,
        version=version,
        architecture="amd64",
        filename=filename or f"pool/main/{name[0]}/{name}/{name}_{version}_amd64.deb",
        size=len(body),
        sha256=hashlib.sha256(body).hexdigest(),
        suite=suite,
    )


class FakeOpener:
    """Serves bytes by URL; anything else is a 404 (or a connection error for hosts in `down`)."""

    def __init__(self, files: dict[str, bytes], down: tuple[str, ...] = ()) -> None:
        self.files, self.down = files, down
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, url: str, timeout: float):
        with self.lock:
            self.calls.append(url)
        if any(url.startswith(d) for d in self.down):
            raise urllib.error.URLError("[Errno 111] Connection refused")
        if url not in self.files:
            raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)
        return io.BytesIO(self.files[url])


@pytest.fixture(autouse=True)
def no_snapshot_env(monkeypatch):
    monkeypatch.delenv(SNAPSHOT_ENV, raising=False)


def test_fetch_then_cache_hit_without_network(tmp_path):
    body = b"deb bytes" * 1000
    pin = make_pin("tini", body)
    opener = FakeOpener({f"{MAIN}/{pin.filename}": body})
    rep = RecordingReporter()
    path = fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=opener, reporter=rep)
    assert path == tmp_path / "sha256" / pin.sha256 and path.read_bytes() == body
    assert len(opener.calls) == 1
    again = fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=opener, reporter=rep)
    assert again == path and len(opener.calls) == 1  # no second download
    assert [e for e in rep.events if e[0] == "fetched"][-1][1][2] is True  # reported as cached
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".part")]


def test_a_tampered_cache_file_is_fetched_again(tmp_path):
    body = b"original"
    pin = make_pin("tini", body)
    opener = FakeOpener({f"{MAIN}/{pin.filename}": body})
    path = fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=opener)
    assert path.stat().st_mode & 0o777 == 0o444  # entries are read-only
    path.chmod(0o644)
    path.write_bytes(b"evil")
    rep = RecordingReporter()
    again = fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=opener, reporter=rep)
    assert again == path and path.read_bytes() == body and len(opener.calls) == 2
    warned = [e[1][0] for e in rep.events if e[0] == "warning"]
    assert (
        len(warned) == 1
        and str(path) in warned[0]
        and hashlib.sha256(b"evil").hexdigest() in warned[0]
    )


def test_a_tampered_cache_file_no_source_can_heal_stops_naming_every_source(tmp_path):
    pin = make_pin("tini", b"original")
    other = "http://mirror.example/debian"
    path = cache_path(tmp_path, pin.sha256)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"evil")
    opener = FakeOpener({f"{MAIN}/{pin.filename}": b"other", f"{other}/{pin.filename}": b"third"})
    with pytest.raises(HashMismatch) as ei:
        fetch_deb(pin, mirrors=[MAIN, other], cache_dir=tmp_path, opener=opener)
    e = ei.value
    assert e.exit_code == EXIT_BUILD and e.reference == "hash-mismatch"
    assert pin.sha256 in e.message
    for url, got in ((f"{MAIN}/{pin.filename}", b"other"), (f"{other}/{pin.filename}", b"third")):
        assert url in e.message and hashlib.sha256(got).hexdigest() in e.message
    assert not path.exists()


def test_mirror_serving_other_bytes(tmp_path):
    pin = make_pin("tini", b"pinned")
    url = f"{MAIN}/{pin.filename}"
    with pytest.raises(HashMismatch) as ei:
        fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=FakeOpener({url: b"other"}))
    assert url in ei.value.message and hashlib.sha256(b"other").hexdigest() in ei.value.message
    assert not cache_path(tmp_path, pin.sha256).exists()
    assert list((tmp_path / "sha256").iterdir()) == []  # no temporary file left either


def test_a_mirror_serving_other_bytes_is_passed_for_the_next(tmp_path):
    pin = make_pin("tini", b"pinned")
    other = "http://mirror.example/debian"
    opener = FakeOpener({f"{MAIN}/{pin.filename}": b"other", f"{other}/{pin.filename}": b"pinned"})
    path = fetch_deb(pin, mirrors=[MAIN, other], cache_dir=tmp_path, opener=opener)
    assert path.read_bytes() == b"pinned" and len(opener.calls) == 2


def test_deb_gone_names_package_and_ways_out(tmp_path):
    pin = make_pin("libc6", b"x", version="2.36-9+deb12u99")
    with pytest.raises(SourceError) as ei:
        fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=FakeOpener({}))
    e = ei.value
    assert e.reference == "deb-gone" and e.exit_code == EXIT_SOURCE
    assert "libc6 2.36-9+deb12u99 (amd64)" in e.message and "HTTP 404" in e.message
    assert 'debian_snapshot = "https://snapshot.debian.org/archive/debian/<timestamp>"' in e.hint
    assert SNAPSHOT_ENV in e.hint and "envspec lock --upgrade-package libc6" in e.hint


def test_unreachable_is_not_gone(tmp_path):
    pin = make_pin("tini", b"x")
    with pytest.raises(SourceError) as ei:
        fetch_deb(
            pin,
            mirrors=[MAIN],
            cache_dir=tmp_path,
            opener=FakeOpener({}, down=("http://deb",)),
            retries=0,
        )
    assert (
        ei.value.reference == "debian-mirror-unreachable"
        and "Connection refused" in ei.value.message
    )


def test_snapshot_first_then_canonical(tmp_path):
    body = b"old"
    pin = make_pin("tini", body)
    opener = FakeOpener({f"{MAIN}/{pin.filename}": body})
    fetch_deb(pin, mirrors=mirror_list(MAIN, snapshot=SNAP), cache_dir=tmp_path, opener=opener)
    assert opener.calls == [f"{SNAP}/{pin.filename}", f"{MAIN}/{pin.filename}"]


def test_snapshot_from_environment(tmp_path, monkeypatch):
    body = b"old"
    pin = make_pin("tini", body)
    monkeypatch.setenv(SNAPSHOT_ENV, SNAP + "/")
    opener = FakeOpener({f"{SNAP}/{pin.filename}": body})
    fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=opener)
    assert opener.calls == [f"{SNAP}/{pin.filename}"]
    assert mirror_list(MAIN) == [SNAP, MAIN]
    assert mirror_list(MAIN, snapshot="") == [MAIN]


def test_security_pin_urls():
    pin = make_pin(
        "liblzma5",
        b"x",
        suite="bookworm-security",
        filename="pool/updates/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
    )
    assert candidate_urls(pin, [SNAP, MAIN]) == [
        "https://snapshot.debian.org/archive/debian-security/20261130T000000Z/pool/updates/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
        f"{SNAP}/pool/updates/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
        f"{SNAP}/pool/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
        "http://deb.debian.org/debian-security/pool/updates/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
        f"{MAIN}/pool/updates/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
        f"{MAIN}/pool/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
    ]
    main_pin = make_pin("tini", b"x")
    assert candidate_urls(main_pin, [MAIN, "http://deb.debian.org/debian-security"]) == [
        f"{MAIN}/{main_pin.filename}"
    ]


def test_security_fix_folded_into_point_release(tmp_path):
    body = b"fix"
    pin = make_pin(
        "liblzma5",
        body,
        suite="bookworm-security",
        filename="pool/updates/main/x/xz-utils/liblzma5_1.0-1_amd64.deb",
    )
    opener = FakeOpener({f"{MAIN}/pool/main/x/xz-utils/liblzma5_1.0-1_amd64.deb": body})
    assert fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=opener).read_bytes() == body


def test_concurrent_fetches_of_one_file(tmp_path):
    body = b"same" * 100000
    pin = make_pin("tini", body)
    opener = FakeOpener({f"{MAIN}/{pin.filename}": body})
    results, errors = [], []

    def go():
        try:
            results.append(fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=opener))
        except Exception as e:  # pragma: no cover - the assertion below shows it
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert sorted(p.name for p in (tmp_path / "sha256").iterdir()) == [pin.sha256]
    assert results[0].read_bytes() == body


def test_fetch_debs_parallel_and_reports_every_gone_package(tmp_path):
    bodies = {f"pkg{i}": f"body{i}".encode() for i in range(6)}
    pins = [make_pin(n, b) for n, b in bodies.items()]
    files = {f"{MAIN}/{p.filename}": bodies[p.name] for p in pins[:4]}
    opener = FakeOpener(files)
    got = fetch_debs(pins[:4], mirrors=[MAIN], cache_dir=tmp_path, opener=opener, jobs=3)
    assert sorted(got) == ["pkg0", "pkg1", "pkg2", "pkg3"]
    with pytest.raises(SourceError) as ei:
        fetch_debs(pins, mirrors=[MAIN], cache_dir=tmp_path, opener=opener, jobs=3)
    e = ei.value
    assert e.reference == "deb-gone" and "2 .debs could not be fetched" in e.message
    assert "pkg4 1.0-1" in e.message and "pkg5 1.0-1" in e.message
    assert "--upgrade-package pkg4 --upgrade-package pkg5" in e.hint


def test_transient_error_is_retried(tmp_path):
    body = b"ok"
    pin = make_pin("tini", body)
    url = f"{MAIN}/{pin.filename}"
    state = {"n": 0}

    def flaky(u, timeout):
        state["n"] += 1
        if state["n"] == 1:
            raise urllib.error.HTTPError(u, 503, "Service Unavailable", {}, None)
        return io.BytesIO(body)

    assert fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=flaky).read_bytes() == body
    assert state["n"] == 2
    assert url  # the same URL was tried twice


class _Server:
    """A local HTTP/1.1 mirror: files by path, /moved/* redirects, counts connections."""

    def __init__(self, files: dict[str, bytes]) -> None:
        import http.server

        outer = self
        self.files = files
        self.connections = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                outer.connections += 1
                super().setup()

            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path.startswith("/moved/"):
                    self.send_response(302)
                    self.send_header("Location", self.path[len("/moved") :])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = outer.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                body = body if body is not None else b"not here"
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_default_opener_against_a_local_mirror(tmp_path, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    from envspec.debian.fetch import KeepAliveOpener

    pins = [make_pin(f"pkg{i}", f"body{i}".encode() * 1000) for i in range(5)]
    srv = _Server({f"/debian/{p.filename}": f"body{p.name[3:]}".encode() * 1000 for p in pins})
    try:
        opener = KeepAliveOpener()
        got = fetch_debs(
            pins, mirrors=[srv.url + "/debian"], cache_dir=tmp_path / "a", opener=opener, jobs=1
        )
        assert all(got[p.name].read_bytes() == f"body{p.name[3:]}".encode() * 1000 for p in pins)
        assert srv.connections == 1  # one kept-alive connection for five files
        # redirects are followed
        fetch_deb(
            pins[0], mirrors=[srv.url + "/moved/debian"], cache_dir=tmp_path / "b", opener=opener
        )
        # a 404 from a real HTTP server is "gone"
        gone = make_pin("libc6", b"nope", version="9.9-9")
        with pytest.raises(SourceError) as ei:
            fetch_deb(gone, mirrors=[srv.url + "/debian"], cache_dir=tmp_path / "c", opener=opener)
        assert ei.value.reference == "deb-gone"
    finally:
        srv.close()


def test_truncated_body_is_retried_then_reported(tmp_path):
    import http.client

    pin = make_pin("tini", b"whole body")

    def truncated(u, timeout):
        raise http.client.IncompleteRead(b"whole", 5)

    with pytest.raises(SourceError) as ei:
        fetch_deb(pin, mirrors=[MAIN], cache_dir=tmp_path, opener=truncated, retries=1)
    assert (
        ei.value.reference == "debian-mirror-unreachable" and "IncompleteRead" in ei.value.message
    )
