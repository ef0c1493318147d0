"""registry/client.py against small HTTP servers on loopback (the real registry, with TLS and
htpasswd, is in tests/e2e/test_registry_cache_e2e.py): the token flow, basic auth from the
authfile, a blob redirected to another host without the registry's credentials, 404, plain HTTP
for a loopback registry, credential helpers left to skopeo; and the stream checks of
regcache.check_stream."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import json
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import zstandard

from envspec.image.compress import Compression
from envspec.image.engine import RegistryAccess
from envspec.image.records import LayerRecord
from envspec.registry.client import (
    RegistryClient,
    RegistryHTTPError,
    Unsupported,
    credentials,
    split_ref,
)
from envspec.registry.regcache import BadEntry, RegistryEntry, StreamTimes, check_stream

BLOB = b"layer bytes " * 1000
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


@contextmanager
def serve(handler):
    """An HTTP server on a free loopback port running ``handler(h)`` for every GET; yields host:port."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            handler(self)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def reply(h, status, body=b"", headers=()):
    h.send_response(status)
    for k, v in headers:
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def authfile(tmp_path: Path, host: str, user="u", password="p", **extra) -> Path:
    f = tmp_path / "auth.json"
    f.write_text(
        json.dumps(
            {
                "auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}},
                **extra,
            }
        )
    )
    return f


def test_split_ref():
    assert split_ref("h:5000/team/cache:tag") == ("h:5000", "team/cache", "tag")
    assert split_ref("docker://h/team/cache@sha256:ab") == ("h", "team/cache", "sha256:ab")
    assert split_ref("h:5000/team/cache") == ("h:5000", "team/cache", "latest")


def test_a_token_registry_gets_a_pull_token_with_the_authfiles_credentials(tmp_path):
    seen: dict[str, list] = {"token": [], "blob": []}
    state = {}

    def token_server(h):
        seen["token"].append((h.path, h.headers.get("Authorization")))
        reply(h, 200, json.dumps({"token": "T0K"}).encode())

    with serve(token_server) as tok:

        def registry(h):
            if h.headers.get("Authorization") != "Bearer T0K":
                reply(
                    h,
                    401,
                    b"{}",
                    [
                        (
                            "WWW-Authenticate",
                            f'Bearer realm="http://{tok}/token",service="reg",scope="repository:team/c:pull"',
                        )
                    ],
                )
                return
            seen["blob"].append(h.path)
            reply(h, 200, BLOB)

        with serve(registry) as reg:
            state["reg"] = reg
            client = RegistryClient(RegistryAccess(authfile=str(authfile(tmp_path, reg))))
            with client.open_blob(f"{reg}/team/c", DIGEST) as resp:
                assert resp.read() == BLOB
            with client.open_blob(f"{reg}/team/c", DIGEST) as resp:  # the token is kept: asked once
                assert resp.read() == BLOB
    assert len(seen["token"]) == 1
    path, auth = seen["token"][0]
    assert "service=reg" in path and "scope=repository%3Ateam%2Fc%3Apull" in path
    assert auth == "Basic " + base64.b64encode(b"u:p").decode()
    assert seen["blob"] == [f"/v2/team/c/blobs/{DIGEST}"] * 2


def test_basic_auth_a_redirect_without_the_registrys_credentials_and_404(tmp_path):
    got = []

    def storage(h):
        got.append(h.headers.get("Authorization"))
        reply(h, 200, BLOB)

    with serve(storage) as store:

        def registry(h):
            if h.headers.get("Authorization") != "Basic " + base64.b64encode(b"u:p").decode():
                reply(h, 401, b"", [("WWW-Authenticate", 'Basic realm="r"')])
            elif h.path.endswith("/manifests/missing"):
                reply(h, 404, b"{}")
            elif "/manifests/" in h.path:
                assert "application/vnd.oci.image.manifest.v1+json" in h.headers.get("Accept", "")
                reply(h, 200, b'{"m":1}')
            else:
                reply(h, 307, b"", [("Location", f"http://{store}/bucket/blob?sig=1")])

        with serve(registry) as reg:
            client = RegistryClient(RegistryAccess(authfile=str(authfile(tmp_path, reg))))
            assert client.manifest(f"{reg}/team/c:there") == b'{"m":1}'
            assert client.manifest(f"{reg}/team/c:missing") is None
            with client.open_blob(f"{reg}/team/c", DIGEST) as resp:
                assert resp.read() == BLOB
    assert got == [None]  # the object store never sees the registry's credentials


def test_credentials_and_what_is_left_to_skopeo(tmp_path):
    f = authfile(tmp_path, "https://reg.example:5000")
    assert credentials(RegistryAccess(authfile=str(f)), "reg.example:5000") == ("u", "p")
    assert credentials(RegistryAccess(authfile=str(f)), "other.example") is None
    helper = tmp_path / "helper.json"
    helper.write_text(json.dumps({"credHelpers": {"reg.example": "gcloud"}}))
    with pytest.raises(Unsupported):
        credentials(RegistryAccess(authfile=str(helper)), "reg.example")
    # the defaults: XDG_RUNTIME_DIR's containers/auth.json, then ~/.docker/config.json
    (tmp_path / "run" / "containers").mkdir(parents=True)
    (tmp_path / "run" / "containers" / "auth.json").write_text(f.read_text())
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "HOME": str(tmp_path / "home")}
    assert credentials(RegistryAccess(), "reg.example:5000", env) == ("u", "p")


def test_refusals_and_an_unreachable_registry_are_errors(tmp_path):
    with serve(lambda h: reply(h, 401, b"", [("WWW-Authenticate", 'Basic realm="r"')])) as reg:
        with pytest.raises(RegistryHTTPError) as e:
            RegistryClient(RegistryAccess(authfile=str(tmp_path / "none.json"))).manifest(
                f"{reg}/team/c:t"
            )
        assert e.value.status == 401 and "credentials" in str(e.value)
    with serve(lambda h: reply(h, 500, b"boom")) as reg:
        with pytest.raises(RegistryHTTPError) as e:
            RegistryClient().manifest(f"{reg}/team/c:t")
        assert e.value.status == 500 and "boom" in str(e.value)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RegistryHTTPError) as e:
        RegistryClient().manifest(f"127.0.0.1:{port}/team/c:t")
    assert e.value.status == 0


# --- check_stream ---------------------------------------------------------------------------------

TAR = bytes(range(256)) * 40000  # 10 MB: several chunks on each side


def entry_for(blob: bytes, tar: bytes = TAR) -> RegistryEntry:
    return RegistryEntry(
        ref="r",
        manifest_digest="",
        key="k",
        diff_id="sha256:" + hashlib.sha256(tar).hexdigest(),
        diff_size=len(tar),
        compressor="",
        media_type="",
        digest="sha256:" + hashlib.sha256(blob).hexdigest(),
        size=len(blob),
        record=LayerRecord(diff_id="sha256:" + hashlib.sha256(tar).hexdigest(), size=len(tar)),
    )


def compressed(name: str, data: bytes = TAR) -> bytes:
    return {"zstd": zstandard.ZstdCompressor().compress, "gzip": gzip.compress, "none": bytes}[
        name
    ](data)


def chunks(b: bytes, n: int = 65536):
    return (memoryview(b)[i : i + n] for i in range(0, len(b), n))


@pytest.mark.parametrize("name", ["zstd", "gzip", "none"])
def test_check_stream_writes_the_tar_and_says_where_the_time_went(name):
    blob = compressed(name)
    out = bytearray()
    times = StreamTimes()
    check_stream(chunks(blob), out.extend, entry_for(blob), Compression(name), times)
    assert bytes(out) == TAR
    assert dict(times.items()).keys() == {
        "wait",
        "sha256_blob",
        "decompress",
        "sha256_tar",
        "write",
    }


@pytest.mark.parametrize("name", ["zstd", "gzip"])
def test_check_stream_refuses_damaged_cut_and_lying_blobs(name):
    blob = compressed(name)
    damaged = blob[: len(blob) // 2] + bytes(64) + blob[len(blob) // 2 + 64 :]
    with pytest.raises(BadEntry, match="the blob's bytes are not the ones recorded"):
        check_stream(chunks(damaged), lambda b: None, entry_for(blob), Compression(name))
    cut = blob[: len(blob) // 2]
    with pytest.raises(BadEntry):  # the recorded blob is whole: this one is short
        check_stream(chunks(cut), lambda b: None, entry_for(blob), Compression(name))
    with pytest.raises(
        BadEntry, match="ends|decompresses to"
    ):  # short, and recorded so: its stream ends early
        check_stream(chunks(cut), lambda b: None, entry_for(cut), Compression(name))
    other = compressed(name, TAR[::-1])
    with pytest.raises(BadEntry, match="not to the layer's diff_id"):
        check_stream(chunks(other), lambda b: None, entry_for(other), Compression(name))
    big = compressed(name, TAR + b"x" * 10)
    with pytest.raises(BadEntry, match="more than"):
        check_stream(chunks(big), lambda b: None, entry_for(big), Compression(name))
