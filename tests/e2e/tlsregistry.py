"""A registry that behaves like a real one, for the end-to-end tests: Debian's docker-registry on
a free loopback port, TLS with a certificate signed by a CA this module makes (``cryptography``),
htpasswd (bcrypt) authentication, storage in a temp directory. Clients trust the CA through a
certificates directory of their own (``skopeo --cert-dir`` / ``--dest-cert-dir``), never the
system trust store or /etc/containers/certs.d; credentials come as a containers ``auth.json``.

    with start_tls_registry(tmp_path) as reg:
        reg.address        # "127.0.0.1:PORT"
        reg.cert_dir       # a directory holding ca.crt
        reg.authfile       # auth.json with the right credentials
        reg.write_authfile(path, user, password)   # another one (wrong credentials)
        reg.tags("envspec/smoke")                 # the registry API, with the CA and credentials
        reg.stop(kill=True); reg.start()          # the same storage, a new process

``CutProxy`` sits between a client and the registry and cuts every connection once a number of
bytes have gone through towards the registry (a push dropped half-way).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

USER = "envspec"
PASSWORD = "s3cret-for-tests"


def pytest_marks() -> list:
    """The marks of a test module that uses this registry: e2e and network, and a skip naming what
    is missing (skopeo, buildah, podman, docker-registry; bcrypt and cryptography)."""
    import shutil

    import pytest

    marks = [pytest.mark.e2e, pytest.mark.network]
    for tool in ("skopeo", "buildah", "podman", "docker-registry"):
        if shutil.which(tool) is None:
            marks.append(pytest.mark.skip(reason=f"{tool} is not installed (scripts/dev.sh setup)"))
    try:
        import bcrypt  # noqa: F401
        import cryptography  # noqa: F401
    except ImportError:  # pragma: no cover
        marks.append(
            pytest.mark.skip(
                reason="the test registry needs bcrypt and cryptography (pip install -e '.[test]')"
            )
        )
    return marks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_ca_and_cert(d: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for 127.0.0.1 and localhost signed by it:
    (ca.crt, server.crt, server.key) under ``d``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "envspec test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    d.mkdir(parents=True, exist_ok=True)
    paths = (d / "ca.crt", d / "server.crt", d / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths[2].chmod(0o600)
    return paths


def htpasswd_line(user: str, password: str) -> str:
    """What ``htpasswd -nbB`` writes: docker-registry accepts only bcrypt."""
    import bcrypt

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}\n"


def write_authfile(path: Path, registry: str, user: str, password: str) -> Path:
    """A containers auth.json (containers-auth.json(5)) for ``registry``."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": {registry: {"auth": token}}}))
    path.chmod(0o600)
    return path


class TLSRegistry:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.storage = base / "registry-data"
        self.cert_dir = base / "certs"  # ca.crt only: what a client is given
        ca, crt, key = make_ca_and_cert(base / "pki")
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        (self.cert_dir / "ca.crt").write_bytes(ca.read_bytes())
        self.ca = ca
        (base / "htpasswd").write_text(htpasswd_line(USER, PASSWORD))
        self.config = base / "registry.yml"
        self.config.write_text(
            "version: 0.1\nlog:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n  tls:\n    certificate: {crt}\n    key: {key}\n"
            f"auth:\n  htpasswd:\n    realm: envspec-test\n    path: {base / 'htpasswd'}\n"
        )
        self.authfile = write_authfile(base / "auth" / "auth.json", self.address, USER, PASSWORD)
        self.proc: subprocess.Popen | None = None
        self.log = base / "registry.log"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["docker-registry", "serve", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise AssertionError(
                        f"docker-registry did not start:\n{self.log.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def write_authfile(self, path: Path, user: str, password: str) -> Path:
        return write_authfile(path, self.address, user, password)

    def api(self, path: str, *, method: str = "GET", accept: str = "") -> tuple[int, bytes]:
        """One request to the registry's HTTP API (``/v2/...``) with the CA and the credentials."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        req = urllib.request.Request(
            f"https://{self.address}{path}",
            method=method,
            headers={"Authorization": f"Basic {token}", **({"Accept": accept} if accept else {})},
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:  # noqa: S310
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def tags(self, repo: str) -> list[str]:
        """The repository's tags; [] where the registry does not know the repository."""
        status, body = self.api(f"/v2/{repo}/tags/list")
        if status == 404:
            return []
        assert status == 200, (status, body)
        return json.loads(body).get("tags") or []

    def manifest(self, repo: str, ref: str) -> tuple[int, bytes]:
        return self.api(
            f"/v2/{repo}/manifests/{ref}",
            accept="application/vnd.oci.image.manifest.v1+json,"
            "application/vnd.docker.distribution.manifest.v2+json",
        )

    def blob_status(self, repo: str, digest: str) -> int:
        return self.api(f"/v2/{repo}/blobs/{digest}", method="HEAD")[0]


@contextlib.contextmanager
def start_tls_registry(base: Path) -> Iterator[TLSRegistry]:
    reg = TLSRegistry(base)
    reg.start()
    try:
        yield reg
    finally:
        reg.stop()


class CutProxy:
    """A TCP proxy on a free loopback port in front of ``target`` (host, port). Once ``limit``
    bytes have gone towards the target (all connections together), ``on_cut`` runs (e.g. stop the
    registry) and every connection is closed; new ones are refused from then on."""

    def __init__(
        self, target: tuple[str, int], limit: int, on_cut: Callable[[], None] = lambda: None
    ) -> None:
        self.target, self.limit, self.on_cut = target, limit, on_cut
        self.sent = 0
        self.cut = threading.Event()
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> CutProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cut_all()
        self.server.close()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while not self.cut.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if counted:
                    with self.lock:
                        self.sent += len(data)
                        over = self.sent >= self.limit
                    if over:
                        self._cut_all()
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _cut_all(self) -> None:
        if not self.cut.is_set():
            self.cut.set()
            self.on_cut()
            with contextlib.suppress(OSError):
                self.server.close()  # from now on: connection refused
        with self.lock:
            conns = list(self.conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
