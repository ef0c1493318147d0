"""Registry reads over the distribution API itself (the OCI distribution spec's ``GET
/v2/<name>/manifests/<reference>`` and ``GET /v2/<name>/blobs/<digest>``), so a layer's blob can be
read as a stream: checked, decompressed and untarred as it arrives (``regcache.RegistryCache.stream``),
with no file of the blob or of its tar on the way. skopeo can only copy a blob to a file.

The rules are the push's (``image.engine.RegistryAccess``, the containers conventions):

- TLS is verified unless ``tls_verify`` is False, or is None for a loopback registry without a cert
  dir; an unverified registry is tried over HTTPS first, then over plain HTTP (as skopeo does).
  The CA certificates are the system's, plus ``*.crt`` of the cert dir (``--cert-dir``, else
  /etc/containers/certs.d/HOST:PORT and /etc/docker/certs.d/HOST:PORT), and a client certificate
  ``*.cert`` with its ``*.key`` there (containers-certs.d(5)).
- Credentials come from the authfile (``--authfile``, ``REGISTRY_AUTH_FILE``, else
  ``${XDG_RUNTIME_DIR}/containers/auth.json``, then ``~/.docker/config.json``;
  containers-auth.json(5)): its ``auths`` entry for the registry. A registry that answers 401
  with a ``Basic`` challenge gets them as basic auth; one with a ``Bearer`` challenge (a token
  server, as Docker Hub, GHCR, Harbor and Quay have) gets a pull token from its realm, with them
  where there are any, anonymously otherwise.
- A credential helper (``credHelpers``/``credsStore``) is not run here: ``Unsupported``, and the
  caller reads through skopeo instead, which runs it.

A blob redirect (a registry that serves blobs from object storage) is followed without the
registry's Authorization header.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from envspec.image.engine import RegistryAccess, _is_local_registry
from envspec.image.oci import MT_INDEX, MT_MANIFEST

ACCEPT = ", ".join(
    (
        MT_MANIFEST,
        MT_INDEX,
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
CERT_DIRS = ("/etc/containers/certs.d", "/etc/docker/certs.d")


class Unsupported(Exception):
    """This registry's reads need what only skopeo does here (a credential helper)."""


class RegistryHTTPError(Exception):
    """A read the registry refused or could not answer: ``status`` (0: no answer at all)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def split_ref(ref: str) -> tuple[str, str, str]:
    """(host, repository, reference) of ``HOST[:PORT]/REPO:TAG`` or ``HOST[:PORT]/REPO@DIGEST``."""
    bare = ref.removeprefix("docker://")
    host, _, rest = bare.partition("/")
    if "@" in rest:
        repo, _, reference = rest.partition("@")
    else:
        repo, _, reference = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
    return host, repo, reference


def credentials(
    access: RegistryAccess, host: str, env: dict[str, str] | None = None
) -> tuple[str, str] | None:
    """(user, password) of ``host`` in the authfile that applies, or None where it has none.
    ``Unsupported`` where a credential helper holds them."""
    env = dict(os.environ) if env is None else env
    if access.authfile:
        files = [Path(access.authfile)]
    else:
        files = []
        if env.get("XDG_RUNTIME_DIR"):
            files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
        files.append(Path(env.get("HOME", "/root")) / ".docker" / "config.json")
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        auths = data.get("auths") or {}
        for key, entry in auths.items():
            name = re.sub(r"^https?://", "", key).split("/", 1)[0]
            if name == host and isinstance(entry, dict) and entry.get("auth"):
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
                return user, password
        if host in (data.get("credHelpers") or {}) or data.get("credsStore"):
            raise Unsupported(f"the credentials of {host} are in a credential helper ({path})")
        if access.authfile:
            break
    return None


@dataclass
class RegistryClient:
    """Reads of registries with ``access``'s TLS and credentials (module docstring). Thread-safe:
    each read has its own connection; tokens and the scheme found for a host are shared."""

    access: RegistryAccess = field(default_factory=RegistryAccess)
    timeout: float = 60.0
    env: dict[str, str] | None = None
    _schemes: dict[str, str] = field(default_factory=dict)  # host -> "https" / "http"
    _auth: dict[tuple[str, str], str] = field(
        default_factory=dict
    )  # (host, repo) -> Authorization value
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- reads -------------------------------------------------------------------------------------
    def manifest(self, ref: str) -> bytes | None:
        """The manifest's bytes as served (their sha256 is its digest); None where there is none."""
        host, repo, reference = split_ref(ref)
        resp = self._get(host, repo, f"/v2/{repo}/manifests/{reference}", {"Accept": ACCEPT})
        if resp is None:
            return None
        with resp:
            return resp.read()

    def open_blob(self, ref: str, digest: str) -> IO[bytes] | None:
        """The blob ``digest`` of ``ref``'s repository as a stream (close it when done); None where
        the registry does not have it. The caller checks its bytes."""
        host, repo, _ = split_ref(ref)
        return self._get(host, repo, f"/v2/{repo}/blobs/{digest}", {})

    # -- HTTP --------------------------------------------------------------------------------------
    def _verify(self, host: str) -> bool:
        if self.access.tls_verify is not None:
            return self.access.tls_verify
        return bool(self.access.cert_dir) or not _is_local_registry(host)

    def _cert_dir(self, host: str) -> Path | None:
        if self.access.cert_dir:
            return Path(self.access.cert_dir)
        for base in CERT_DIRS:
            d = Path(base) / host
            if d.is_dir():
                return d
        return None

    def _context(self, host: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        if not self._verify(host):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        d = self._cert_dir(host)
        if d is not None:
            for crt in sorted(d.glob("*.crt")):
                ctx.load_verify_locations(cafile=str(crt))
            for cert in sorted(d.glob("*.cert")):
                key = cert.with_suffix(".key")
                if key.is_file():
                    ctx.load_cert_chain(str(cert), str(key))
        return ctx

    def _connect(self, scheme: str, netloc: str, tls_host: str) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(
                netloc, timeout=self.timeout, context=self._context(tls_host)
            )
        return http.client.HTTPConnection(netloc, timeout=self.timeout)

    def _request(self, host: str, path: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        """One GET to the registry ``host``, over the scheme it speaks (found once)."""
        schemes = (
            [self._schemes[host]]
            if host in self._schemes
            else (["https"] if self._verify(host) else ["https", "http"])
        )
        last: Exception | None = None
        for scheme in schemes:
            conn = self._connect(scheme, host, host)
            try:
                conn.request("GET", path, headers={"User-Agent": "envspec", **headers})
                resp = conn.getresponse()
            except (ssl.SSLError, ConnectionResetError, http.client.BadStatusLine) as e:
                conn.close()
                last = e
                continue  # a plain-HTTP registry answers a TLS hello with garbage or a reset
            except OSError as e:
                conn.close()
                raise RegistryHTTPError(f"the registry {host} could not be reached ({e})") from None
            with self._lock:
                self._schemes[host] = scheme
            return resp
        raise RegistryHTTPError(f"the registry {host} could not be reached ({last})")

    def _get(
        self, host: str, repo: str, path: str, headers: dict[str, str]
    ) -> http.client.HTTPResponse | None:
        """GET ``path`` from ``host`` with the repository's credentials (answering one 401
        challenge), following redirects; None on 404. Anything else but 200 is ``RegistryHTTPError``."""
        with self._lock:
            auth = self._auth.get((host, repo))
        resp = self._request(host, path, {**headers, **({"Authorization": auth} if auth else {})})
        if resp.status == 401:
            challenge = resp.getheader("WWW-Authenticate", "")
            resp.read()
            resp.close()
            auth = self._answer(host, repo, challenge)
            with self._lock:
                self._auth[(host, repo)] = auth
            resp = self._request(host, path, {**headers, "Authorization": auth})
        for _ in range(5):
            if resp.status not in (301, 302, 303, 307, 308):
                break
            where = urllib.parse.urljoin(f"https://{host}{path}", resp.getheader("Location", ""))
            resp.read()
            resp.close()
            resp = self._follow(host, where, headers, auth)
        if resp.status == 404:
            resp.read()
            resp.close()
            return None
        if resp.status != 200:
            body = resp.read(2000).decode("utf-8", "replace").strip()
            resp.close()
            raise RegistryHTTPError(
                f"GET {host}{path}: {resp.status} {resp.reason} {body}".strip(), resp.status
            )
        return resp

    def _follow(
        self, host: str, url: str, headers: dict[str, str], auth: str | None
    ) -> http.client.HTTPResponse:
        u = urllib.parse.urlsplit(url)
        same = u.netloc == host
        scheme = self._schemes.get(host, "https") if same else u.scheme
        conn = self._connect(scheme, u.netloc, u.hostname or u.netloc)
        path = u.path + (f"?{u.query}" if u.query else "")
        try:
            conn.request(
                "GET",
                path,
                headers={
                    "User-Agent": "envspec",
                    **headers,
                    **({"Authorization": auth} if auth and same else {}),
                },
            )
            return conn.getresponse()
        except OSError as e:
            conn.close()
            raise RegistryHTTPError(f"{url} could not be reached ({e})") from None

    def _answer(self, host: str, repo: str, challenge: str) -> str:
        """The Authorization value for a 401's ``WWW-Authenticate`` challenge."""
        creds = credentials(self.access, host, self.env)
        kind = challenge.split(" ", 1)[0].lower()
        if kind == "basic":
            if creds is None:
                raise RegistryHTTPError(
                    f"the registry {host} asks for credentials and the authfile has none", 401
                )
            return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        if kind != "bearer":
            raise RegistryHTTPError(
                f"the registry {host} asks for {challenge!r}, which envspec does not answer", 401
            )
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", "")
        if not realm:
            raise RegistryHTTPError(f"the registry {host}'s token challenge names no realm", 401)
        query = {
            "service": params.get("service", ""),
            "scope": params.get("scope") or f"repository:{repo}:pull",
        }
        u = urllib.parse.urlsplit(realm)
        conn = self._connect(u.scheme or "https", u.netloc, u.hostname or u.netloc)
        head = {"User-Agent": "envspec"}
        if creds is not None:
            head["Authorization"] = (
                "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            )
        try:
            conn.request(
                "GET",
                f"{u.path or '/'}?{urllib.parse.urlencode({k: v for k, v in query.items() if v})}",
                headers=head,
            )
            resp = conn.getresponse()
            body = resp.read()
        except (TimeoutError, OSError) as e:
            raise RegistryHTTPError(
                f"the token server {realm} could not be reached ({e})"
            ) from None
        finally:
            conn.close()
        if resp.status != 200:
            raise RegistryHTTPError(
                f"the token server {realm} refused a pull token for {repo}: {resp.status}", 401
            )
        try:
            token = json.loads(body).get("token") or json.loads(body).get("access_token")
        except ValueError:
            token = None
        if not token:
            raise RegistryHTTPError(f"the token server {realm} gave no token", 401)
        return f"Bearer {token}"
