"""The one place that runs buildah, skopeo, podman, containers-storage and envspec-put-layer.

envspec makes the image itself (layers, config, manifest: an OCI layout); the engine only moves
that layout where it is wanted: into containers-storage under a tag, to a registry, or into an
archive. Every command is logged (logger ``envspec.image.engine``), dies with envspec (Linux
``PR_SET_PDEATHSIG``, so a killed build cannot finish tagging behind our back), and a non-zero
exit becomes ``BuildError(step, argv, returncode, stderr tail)``.

The host (where containers-storage is, which tools are here) is an ``envspec.host.Host``,
found once by ``detect_host`` and given to the engine; the engine does not look again.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from envspec import settings
from envspec.cache.store import flocked
from envspec.errors import (
    BuildError,
    DamagedEntry,
    HostError,
    RegistryError,
    UsageError,
)
from envspec.host import ASK_STORAGE, FROM_BUILDAH, Host, detect_host

log = logging.getLogger("envspec.image.engine")

APT_HINT = "apt-get install -y buildah skopeo podman runc"
_PR_SET_PDEATHSIG = 1
_UNSET = object()


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def _host_for_build() -> Host:
    """The host as the build needs it: its tools and storage (``buildah info``, unless
    ENVSPEC_STORAGE_ROOT says), nothing that needs a GPU."""
    return detect_host(ask=ASK_STORAGE)


class Engine(Protocol):
    """Every verb ``build()`` calls on a container engine, and nothing else."""

    def storage_cli(self) -> StorageCLI | None:
        """A store that takes layers one by one while they are made, or None."""

    def image_digest(self, ref: str) -> str:
        """The manifest digest of the image named ``ref`` in the engine's storage, "" when none."""

    def import_image(self, oci_dir: Path, ref: str) -> None:
        """Bring the image of an OCI layout into the engine's storage, named ``ref`` last."""

    def push(self, oci_dir: Path, dest: str, *, index: bool = False) -> None:
        """Copy the image of an OCI layout to a registry, keeping its digest. ``index``: the layout
        holds an image index; every image of it goes, and the index as it is."""

    def copy(self, oci_dir: Path, dest: str, *, index: bool = False) -> None:
        """Write the image of an OCI layout as ``oci:DIR``, ``oci-archive:FILE`` or ``docker-archive:FILE``."""


def _is_local_registry(dest: str) -> bool:
    host = dest.split("/", 1)[0]
    hostname = urllib.parse.urlsplit("//" + host).hostname or ""
    return hostname in ("localhost", "::1") or hostname.startswith("127.")


def _docker_ref(dest: str) -> str:
    return dest if dest.startswith("docker://") else "docker://" + dest


# --- registry access: credentials, TLS, and what a failed push means ------------------------------


@dataclass(frozen=True)
class RegistryAccess:
    """How a push reaches its registry, in the containers conventions (containers-auth.json(5),
    containers-certs.d(5)), passed to ``skopeo copy`` as its ``--dest-*`` options.

    ``authfile``: the credentials file (``--authfile``, else ``REGISTRY_AUTH_FILE``; empty: skopeo's
    own defaults, ``${XDG_RUNTIME_DIR}/containers/auth.json``, then ``~/.docker/config.json``).
    ``cert_dir``: a directory with the CA certificates (``*.crt``) to trust for this registry, in
    place of /etc/containers/certs.d/HOST:PORT. ``tls_verify``: None verifies TLS, except for a
    loopback registry when no ``cert_dir`` is given (a test registry on 127.0.0.1 speaks plain HTTP
    or has a certificate nobody signed); True or False says so for every registry."""

    authfile: str = ""
    cert_dir: str = ""
    tls_verify: bool | None = None
    authfile_from: str = (
        ""  # where ``authfile`` came from, for messages: "--authfile", "REGISTRY_AUTH_FILE"
    )


def registry_access(
    authfile: str | None = None,
    cert_dir: str | None = None,
    tls_verify: bool | None = None,
    env: dict[str, str] | None = None,
) -> RegistryAccess:
    """The ``RegistryAccess`` of ``build --push``'s options, checked: an authfile or cert dir that
    is named must exist (skopeo would ignore a missing authfile and fail later with "unauthorized")."""
    env = dict(os.environ) if env is None else env
    where = (
        "--authfile"
        if authfile
        else ("REGISTRY_AUTH_FILE" if env.get("REGISTRY_AUTH_FILE") else "")
    )
    path = authfile or env.get("REGISTRY_AUTH_FILE", "")
    if path and not Path(path).is_file():
        raise UsageError(
            f"{where} {path}: no such file",
            reference="authfile-not-found",
            hint="write it with `skopeo login --authfile FILE REGISTRY` (or `podman login`), "
            "or leave it out to use ${XDG_RUNTIME_DIR}/containers/auth.json",
        )
    if cert_dir and not Path(cert_dir).is_dir():
        raise UsageError(
            f"--cert-dir {cert_dir}: no such directory",
            reference="cert-dir-not-found",
            hint="a directory holding the registry's CA certificate as ca.crt (or any *.crt)",
        )
    return RegistryAccess(
        authfile=path, cert_dir=cert_dir or "", tls_verify=tls_verify, authfile_from=where
    )


def push_args(access: RegistryAccess, dest: str) -> list[str]:
    """skopeo copy's ``--dest-*`` options for pushing to ``dest`` (HOST[:PORT]/REPO[:TAG])."""
    return skopeo_registry_args(access, dest, "dest-")


def skopeo_registry_args(access: RegistryAccess, ref: str, prefix: str = "") -> list[str]:
    """skopeo's options for reaching ``ref``'s registry: ``--{prefix}tls-verify``, ``cert-dir`` and
    ``authfile`` (prefix ``dest-`` for a push, ``src-`` for a copy from it, none for inspect)."""
    args: list[str] = []
    verify = access.tls_verify
    if verify is None:
        verify = bool(access.cert_dir) or not _is_local_registry(ref.removeprefix("docker://"))
    if not verify:
        args.append(f"--{prefix}tls-verify=false")
    if access.cert_dir:
        args += [f"--{prefix}cert-dir", access.cert_dir]
    if access.authfile:
        args += [f"--{prefix}authfile", access.authfile]
    return args


_AUTH = (
    "unauthorized",
    "authentication required",
    "requested access to the resource is denied",
    "incorrect username or password",
    "invalid username/password",
    "401 unauthorized",
    "403 forbidden",
)
_TLS = (
    "x509:",
    "certificate signed by unknown authority",
    "tls: ",
    "certificate is not valid",
    "server gave http response to https client",
)
_UNREACHABLE = (
    "connection refused",
    "no such host",
    "i/o timeout",
    "network is unreachable",
    "no route to host",
    "dial tcp",
    "server misbehaving",
)
_CUT = (
    "broken pipe",
    "connection reset",
    "unexpected eof",
    ": eof",
    'eof"',
    "server closed",
    "use of closed network connection",
    "http2: ",
    "context deadline exceeded",
)


def registry_error(access: RegistryAccess, dest: str, stderr: str) -> RegistryError:
    """The ``RegistryError`` a failed ``skopeo copy`` to ``dest`` means, from what skopeo said:
    the credentials were refused, the registry was not there or not trusted, or the connection
    broke during the upload (the registry tags an image only when its manifest is stored, and
    refuses a manifest whose blobs are missing: a push cut off tags nothing)."""
    registry = dest.removeprefix("docker://").split("/", 1)[0]
    text = stderr.lower()
    tail = "\n".join(ln.strip() for ln in stderr.strip().splitlines()[-5:])
    creds = (
        f"{access.authfile} ({access.authfile_from})"
        if access.authfile
        else "skopeo's default auth.json (${XDG_RUNTIME_DIR}/containers/auth.json, ~/.docker/config.json)"
    )
    if any(k in text for k in _AUTH):
        return RegistryError(
            f"push to {dest}: the registry {registry} refused the credentials (or has none for it)",
            registry=registry,
            detail=tail,
            reference="registry-auth-failed",
            hint=f"credentials came from {creds}; log in with `skopeo login --authfile FILE "
            f"{registry}` and pass --authfile FILE (or set REGISTRY_AUTH_FILE)",
        )
    if any(k in text for k in _TLS):
        return RegistryError(
            f"push to {dest}: the TLS connection to {registry} could not be trusted",
            registry=registry,
            detail=tail,
            reference="registry-tls-failed",
            hint="pass --cert-dir DIR with the registry's CA certificate as DIR/ca.crt "
            "(or --tls-verify=false for a registry you trust without TLS)",
        )
    if any(
        k in text for k in ("writing blob", "writing manifest", "uploading", "blobs/uploads")
    ) and any(k in text for k in _CUT + _UNREACHABLE):
        return RegistryError(
            f"push to {dest}: the connection to {registry} broke during the upload; "
            "nothing was tagged",
            registry=registry,
            detail=tail,
            reference="push-interrupted",
            hint="run the same build --push again: blobs the registry has are not sent twice",
        )
    if any(k in text for k in _UNREACHABLE + _CUT):
        return RegistryError(
            f"push to {dest}: the registry {registry} could not be reached",
            registry=registry,
            detail=tail,
            reference="registry-unreachable",
            hint=f"check that a registry listens on {registry} and that this machine reaches it",
        )
    return RegistryError(
        f"push to {dest} failed",
        registry=registry,
        detail=tail,
        hint="see what skopeo said above; `skopeo copy --debug` shows every request",
    )


@dataclass
class BuildahEngine:
    """buildah/skopeo/podman behind the Engine verbs."""

    host: Host = field(default_factory=_host_for_build)
    timeout: float = 3600
    registry: RegistryAccess = field(
        default_factory=RegistryAccess
    )  # credentials and TLS of ``push``
    _store: object = field(default=_UNSET, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        missing = [t for t in ("skopeo", "buildah") if not self.host.which(t)]
        if missing:
            raise HostError(
                f"{' and '.join(missing)} not found on PATH; envspec build needs them",
                hint=APT_HINT,
            )

    def run(
        self, step: str, argv: Sequence[str], *, check: bool = True, tmpdir: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one command. ``tmpdir``: its TMPDIR (skopeo keeps big temporary files there, and a
        killed skopeo leaves them behind: inside the build's work directory they go with it)."""
        argv = list(argv)
        log.info("%s: %s", step, " ".join(argv))
        env = {**os.environ, "LC_ALL": "C"}
        if tmpdir is not None:
            tmpdir.mkdir(parents=True, exist_ok=True)
            env["TMPDIR"] = str(tmpdir)
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=die_with_parent,
                env=env,
            )
        except FileNotFoundError:
            raise HostError(f"{argv[0]} not found on PATH", hint=APT_HINT) from None
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except BaseException:  # KeyboardInterrupt, timeout: the child goes with us
            proc.kill()
            proc.wait()
            raise
        cp = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise command_failed(f"{step} failed", step, cp)
        return cp

    def _skopeo(self, *args: str, tmpdir: Path | None = None) -> list[str]:
        # skopeo puts big temporary files in /var/tmp whatever TMPDIR says (containers/image's
        # "big files" directory); --tmpdir moves them into the build's work directory, so a
        # killed copy leaves nothing behind once that directory is cleaned.
        if tmpdir is not None:
            tmpdir.mkdir(parents=True, exist_ok=True)
            return ["skopeo", "--tmpdir", str(tmpdir), *args]
        return ["skopeo", *args]

    def _podman(self, *args: str) -> list[str]:
        return ["podman", *self.host.storage.args(), *args]

    def import_image(self, oci_dir: Path, ref: str) -> None:
        """Copy the OCI layout into containers-storage with skopeo, naming it ``ref``; the name
        appears only when every layer is stored. build() prefers ``storage_cli()`` where there is
        one: skopeo first copies every blob to a temporary file and hashes it twice more."""
        tmp = Path(oci_dir).parent / "engine-tmp"
        self.run(
            "import",
            self._skopeo(
                "copy",
                "--quiet",
                "--preserve-digests",
                f"oci:{oci_dir}",
                self.host.storage.ref(ref),
                tmpdir=tmp,
            ),
            tmpdir=tmp,
        )

    def storage_cli(self) -> StorageCLI | None:
        """containers/storage's own tool (Debian package ``containers-storage``, or the binary
        ``ENVSPEC_CONTAINERS_STORAGE`` names) on this engine's store, or None where it is
        missing, we are not root (it does not enter a user namespace as buildah does), or
        ``ENVSPEC_IMPORT=skopeo`` asks for skopeo."""
        if self._store is _UNSET:
            store = None
            tool = self.host.which("containers-storage")
            if tool and self.host.euid == 0 and settings.read().import_with != "skopeo":
                store = StorageCLI(
                    self, *self._store_location(), tool=tool, put_tool=self.host.put_layer or None
                )
            self._store = store
        return self._store  # type: ignore[return-value]

    def _store_location(self) -> tuple[str, str, str]:
        """(graph root, run root, driver) of the store buildah uses: ours when a root is set,
        else what ``buildah info`` reported (storage.conf, rootless defaults); asked here only
        when the host was found without it (its failure is then a BuildError)."""
        st = self.host.storage
        if st.custom:
            return st.root, st.runroot, st.driver or "overlay"
        if st.source == FROM_BUILDAH and st.root and st.runroot and st.driver:
            return st.root, st.runroot, st.driver
        info = json.loads(self.run("info", ["buildah", "info"]).stdout)["store"]
        return info["GraphRoot"], info["RunRoot"], info["GraphDriverName"]

    def exists(self, ref: str) -> bool:
        return (
            self.run(
                "exists",
                [
                    "buildah",
                    *self.host.storage.args(),
                    "inspect",
                    "--type",
                    "image",
                    "--format",
                    "{{.FromImageID}}",
                    ref,
                ],
                check=False,
            ).returncode
            == 0
        )

    def image_digest(self, ref: str) -> str:
        if not self.exists(ref):
            return ""
        cp = self.run(
            "inspect", ["skopeo", "inspect", "--raw", self.host.storage.ref(ref)], check=False
        )
        return (
            "sha256:" + hashlib.sha256(cp.stdout.encode()).hexdigest() if cp.returncode == 0 else ""
        )

    def push(self, oci_dir: Path, dest: str, *, index: bool = False) -> None:
        """Push with the credentials and TLS of ``self.registry``; a refusal, an unreachable registry
        or a connection cut off is a ``RegistryError`` (``registry_error``). ``index``: an image
        index and all its images (``skopeo copy --all``), the index's bytes kept."""
        args = [
            "copy",
            "--quiet",
            "--preserve-digests",
            *(["--all"] if index else []),
            *push_args(self.registry, dest),
        ]
        tmp = Path(oci_dir).parent / "engine-tmp"
        cp = self.run(
            "push",
            self._skopeo(*args, f"oci:{oci_dir}", _docker_ref(dest), tmpdir=tmp),
            tmpdir=tmp,
            check=False,
        )
        if cp.returncode != 0:
            raise registry_error(self.registry, dest, cp.stderr)

    def copy(self, oci_dir: Path, dest: str, *, index: bool = False) -> None:
        """Write the image as ``oci:DIR``, ``oci-archive:FILE`` or ``docker-archive:FILE``
        (``index``: an image index and all its images, to an OCI destination)."""
        kind = dest.split(":", 1)[0]
        if kind not in ("oci", "oci-archive", "docker-archive"):
            raise BuildError(
                f"unknown output {dest!r}",
                step="output",
                hint="use oci:DIR, oci-archive:FILE or docker-archive:FILE",
            )
        args = ["copy", "--quiet", *(["--all"] if index else [])]
        if kind != "docker-archive":  # docker-archive has its own manifest format
            args.append("--preserve-digests")
        if kind == "oci":
            args.append("--dest-oci-accept-uncompressed-layers")
        tmp = Path(oci_dir).parent / "engine-tmp"
        self.run("output", self._skopeo(*args, f"oci:{oci_dir}", dest, tmpdir=tmp), tmpdir=tmp)

    def containers(self) -> list[str]:
        """buildah working containers on this storage (a clean build leaves none)."""
        cp = self.run(
            "containers",
            ["buildah", *self.host.storage.args(), "containers", "--quiet"],
            check=False,
        )
        return [ln for ln in cp.stdout.split() if ln]


def chain_id(parent: str, token: str) -> str:
    """A layer ID in containers-storage as containers/image makes it: the bottom layer's diff_id
    hex, then sha256(parent ID + "+" + diff_id hex). With the same IDs, `podman pull` of an
    envspec image into the store it was built in finds its layers and its image."""

    hexd = token.split(":", 1)[-1]
    return hashlib.sha256(f"{parent}+{hexd}".encode()).hexdigest() if parent else hexd


def command_failed(
    message: str,
    step: str,
    cp: subprocess.CompletedProcess[str],
    *,
    argv: Sequence[str] | None = None,
    kind: type[BuildError] = BuildError,
) -> BuildError:
    """A command that exited non-zero, as ``kind``: its argv (``argv``, where not all of it is
    worth showing), exit status and the last 20 lines of its stderr."""
    return kind(
        message,
        step=step,
        argv=list(cp.args if argv is None else argv),
        returncode=cp.returncode,
        stderr_tail="\n".join(cp.stderr.strip().splitlines()[-20:]),
    )


class Cancelled(Exception):
    """The build stopped; the layer being imported was dropped."""


class StagingEmptied(BuildError):
    """A staged layer's files were removed before they were in the layer: another process that
    opened the store (buildah, podman) emptied overlay's staging directory as it ended. Staging
    the layer again from its file makes it."""


EXIT_STAGING_EMPTIED = 3  # envspec-put-layer commit's exit status for it


FEED_CHUNK = 1 << 20


def _feed(
    pipe: IO[bytes],
    tar: Path,
    size: int,
    cancel: threading.Event,
    progress: Callable[[int], None],
    want: str = "",
) -> None:
    """Copy the finished layer file ``tar`` of ``size`` bytes into ``pipe``, checking ``cancel``
    between chunks. Without ``want``: ``sendfile``, no copy through Python. With ``want`` (a
    cached file): read and hashed on the way, raising HashMismatch before the end of input when
    the bytes are not ``want``, so the tool never sees a complete layer."""

    h = hashlib.sha256() if want else None
    view = memoryview(bytearray(FEED_CHUNK)) if want else None
    off = 0
    with open(tar, "rb", buffering=0) as f:
        while off < size:
            if cancel.is_set():
                raise Cancelled()
            step = min(FEED_CHUNK, size - off)
            if h is None:
                n = os.sendfile(pipe.fileno(), f.fileno(), off, step)
            else:
                assert view is not None
                n = f.readinto(view[:step]) or 0
                h.update(view[:n])
                pipe.write(view[:n])
            if not n:
                raise BuildError(
                    f"the layer file {tar} ends at {off} bytes, its maker wrote {size}",
                    step="import layer",
                )
            off += n
            progress(off)
    if h is not None and f"sha256:{h.hexdigest()}" != want:
        raise DamagedEntry(
            f"the cached layer file {tar} is not {want} (sha256:{h.hexdigest()})",
            step="import layer",
            paths=(tar,),
            hint="it changed on disk; build again with --no-cache",
        )


STAGING_DIR = "envspec-staging"  # under the driver's home (envspec-put-layer's stagingRoot)


@functools.lru_cache(maxsize=8)
def _stage_flags(tool: str) -> frozenset[str] | None:
    """The flags this envspec-put-layer's ``stage`` takes (``stage -h`` lists them as ``  -NAME``);
    None for a tool built before ``stage`` (its usage line does not name it). One run of the tool."""
    try:
        cp = subprocess.run([tool, "stage", "-h"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if cp.returncode != 2 or "stage:" not in cp.stderr:
        return None
    return frozenset(m.group(1) for m in re.finditer(r"^  -([a-z][a-z-]*)", cp.stderr, re.M))


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie (killed, not yet reaped by an init that may never
    reap it) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class Staged:
    """A finished stager's answer, its JSON line (``envspec-put-layer stage``): where it untarred
    the layer, its tar-split, the bytes it read. ``commit`` gets it back as it is (``raw``)."""

    raw: dict[str, Any]

    @property
    def staging(self) -> str:
        return str(self.raw.get("staging") or "")

    @property
    def tar_split(self) -> str:
        return str(self.raw.get("tar_split") or "")

    @property
    def size(self) -> int:
        return int(self.raw.get("size", -1))


@dataclass(frozen=True, kw_only=True)
class LayerPut:
    """How ``StorageCLI.put_layer`` takes a layer: its group's name (for the log), the digest the
    store takes (``envspec-put-layer``), whether the file is hashed on its way (a cached file),
    a cancel event, the bytes sent so far."""

    name: str = ""
    diff_id: str = ""
    check: bool = True
    cancel: threading.Event | None = None
    progress: Callable[[int], None] = lambda n: None


def _drop_staged(staged: Staged) -> None:
    shutil.rmtree(staged.staging or "/nonexistent", ignore_errors=True)
    if staged.tar_split:
        Path(staged.tar_split).unlink(missing_ok=True)


class Stage:
    """One ``envspec-put-layer stage`` process: a layer file untarred into the store's staging
    area, hashed on its way. ``end(size)`` once the maker closed the file (``follow``), or
    ``close()`` when it failed; ``wait`` gives what the tool printed last (``commit_staged``
    takes it); ``kill`` stops it and removes what it staged."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        err: IO[bytes],
        name: str,
        progress: Callable[[int], None],
        root: Path | None = None,
    ):
        self.proc, self.err, self.name, self.progress = proc, err, name, progress
        self.root = root  # the staging area, where the tool names its directory "<its pid>-..."
        self.argv: list[str] = (
            [str(a) for a in proc.args] if isinstance(proc.args, list) else [str(proc.args)]
        )
        self.staging = ""
        self.result: Staged | None = None
        self._reader = threading.Thread(
            target=self._read, name=f"envspec-stage-{name}", daemon=True
        )

    def start(self) -> Stage:
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("staging "):
                self.staging = line[len("staging ") :]
            elif line.startswith("progress "):
                with contextlib.suppress(ValueError):
                    self.progress(int(line.split()[1]))
            elif line.startswith("{"):
                with contextlib.suppress(ValueError):
                    answer = json.loads(line)
                    if isinstance(answer, dict):
                        self.result = Staged(answer)

    def _tell(self, text: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            if text:
                self.proc.stdin.write(text.encode())
            self.proc.stdin.close()

    def end(self, size: int) -> None:
        self._tell(f"end {size}\n")

    def close(self) -> None:
        self._tell("")

    def wait(self, cancel: threading.Event) -> Staged:
        while True:
            try:
                rc = self.proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if cancel.is_set():
                    self.kill()
                    raise Cancelled() from None
        self._reader.join()
        if rc != 0 or self.result is None:
            self.err.seek(0)
            tail = self.err.read().decode("utf-8", "replace").strip().splitlines()[-20:]
            self.kill()
            raise BuildError(
                f"untarring the {self.name} layer into containers-storage failed",
                step="import layer",
                argv=[str(a) for a in self.argv[:6]],
                returncode=rc,
                stderr_tail="\n".join(tail),
            )
        self.err.close()
        return self.result

    def kill(self) -> None:
        """Stop the tool and its chrooted untar child (one process group), then remove what it
        staged: the directory it named, or, when it was killed before its "staging" line was read,
        every entry of the staging area named after its pid."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        self.proc.wait()
        self._tell("")
        self._reader.join(timeout=5)
        if self.staging:
            _drop_staged(
                Staged({"staging": self.staging, "tar_split": self.staging + ".tar-split.gz"})
            )
        if self.root is not None and self.root.is_dir():
            for p in self.root.glob(f"{self.proc.pid}-*"):
                _drop_staged(Staged({"staging": str(p)} if p.is_dir() else {"tar_split": str(p)}))
        self.err.close()


FS_TOPDIR_FL = 0x00020000  # ext4's "top of directory hierarchy" inode flag (`chattr +T`)


def _ioc(direction: int, nr: int) -> int:
    """Linux's _IOR/_IOW('f', nr, long): FS_IOC_GETFLAGS (direction 2), FS_IOC_SETFLAGS (1)."""
    return (direction << 30) | (ctypes.sizeof(ctypes.c_long) << 16) | (ord("f") << 8) | nr


def spread_dirs(d: Path) -> bool:
    """Mark ``d`` with ext4's top-directory flag where it has not got it, so that the
    directories made in it (one per staged layer) are placed as top-level ones, each in a block
    group with above-average free inodes, not in its parent's. On an ext4 without a journal,
    making a file steps, one inode at a time, over its group's inodes deleted in the last minute
    (``find_inode_bit``, ``recently_deleted``): after a node removed an image, a layer untarred
    beside it paid that for each file (issue 59; docs/build.md, "Staged layers are spread").
    False where the file system has no such flag (XFS, tmpfs) or it cannot be set: nothing
    changes then."""
    import fcntl

    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        buf = bytearray(4)  # the kernel reads and writes an int, whatever the request's size says
        fcntl.ioctl(fd, _ioc(2, 1), buf)
        flags = int.from_bytes(buf, sys.byteorder)
        if not flags & FS_TOPDIR_FL:
            fcntl.ioctl(fd, _ioc(1, 2), (flags | FS_TOPDIR_FL).to_bytes(4, sys.byteorder))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@dataclass
class StorageCLI:
    """containers/storage on one store. Layers go in through ``envspec-put-layer`` where it is
    there: our tar straight from our file, untarred once, with the diff digest we computed
    (containers/storage's own tool cannot be given it, so it hashes every layer twice; skopeo
    adds a temporary copy and two more hashes). Without it, ``containers-storage import-layer``.
    The image is made with ``containers-storage`` from our own config and manifest bytes, so its
    manifest digest is ours. Layers take IDs from ``chain_id``; stored layers are kept."""

    engine: BuildahEngine
    root: str
    runroot: str
    driver: str
    tool: str = "containers-storage"
    put_tool: str | None = None

    def _store_flags(self) -> list[str]:
        """The flags that name this store, as containers-storage and envspec-put-layer take them."""
        return ["--graph", self.root, "--run", self.runroot, "--storage-driver", self.driver]

    def _cs(self, *args: str) -> list[str]:
        return [self.tool, *self._store_flags(), *args]

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """One envspec import at a time per store (an flock in its run root)."""
        Path(self.runroot).mkdir(parents=True, exist_ok=True)
        return flocked(Path(self.runroot) / "envspec-import.lock")

    def layer_diff_id(self, layer_id: str) -> str | None:
        """The stored layer's diff digest; None where there is no such layer, "" where there is
        one without content (an import that was killed before it finished)."""
        cp = self.engine.run("layer", self._cs("layer", "--json", layer_id), check=False)
        if cp.returncode != 0:
            return None
        try:
            found = json.loads(cp.stdout)
        except ValueError:
            return None
        return (found[0].get("diff-digest") or "") if found else None

    def delete_layer(self, layer_id: str) -> None:
        self.engine.run("delete layer", self._cs("delete-layer", layer_id), check=False)

    def put_layer(
        self, layer_id: str, parent: str, tar: Path, size: int, put: LayerPut = LayerPut()
    ) -> tuple[str, bool]:
        """Apply the layer file ``tar`` as layer ``layer_id`` on ``parent`` unless it is stored
        already. Returns (the stored diff digest, whether this call stored it). With
        ``envspec-put-layer`` and ``put.diff_id``, the store takes that digest: ``put.check``
        hashes the file on its way (a cached file); without it the caller vouches for it (its
        maker hashed these bytes as it wrote them, in this build). Cancelled, the import is killed
        and the partial layer dropped."""
        have = self.layer_diff_id(layer_id)
        if have:
            return have, False
        if have == "":  # left by a killed import: gone before ours
            self.delete_layer(layer_id)
        given = bool(self.put_tool and put.diff_id)  # the store takes our digest
        if self.put_tool and put.diff_id:
            argv = [
                self.put_tool,
                *self._store_flags(),
                "--id",
                layer_id,
                "--parent",
                parent,
                "--diff-digest",
                put.diff_id,
            ]
        else:
            argv = self._cs("import-layer", "--id", layer_id, *([parent] if parent else []))
        log.info("import layer %s: %s", put.name, " ".join(argv))
        want = put.diff_id if given and put.check else ""
        rc, tail = self._feed_tool(argv, layer_id, tar, size, put, want)
        if rc != 0:
            have = self.layer_diff_id(layer_id)
            if have:  # stored by someone else meanwhile
                return have, False
            self.delete_layer(layer_id)
            raise BuildError(
                "import of a layer into containers-storage failed",
                step="import layer",
                argv=argv,
                returncode=rc,
                stderr_tail=tail,
            )
        return self.layer_diff_id(layer_id) or "", True

    def _feed_tool(
        self, argv: list[str], layer_id: str, tar: Path, size: int, put: LayerPut, want: str
    ) -> tuple[int, str]:
        """Run the import tool ``argv`` with the layer file on its stdin (``want``: the digest it
        must have on its way, "": unchecked). Returns (its exit status, its stderr's tail); a
        failure or an interrupt while feeding kills it and drops the partial layer."""
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=die_with_parent,
                env={**os.environ, "LC_ALL": "C"},
            )
            assert proc.stdin is not None
            try:
                _feed(
                    proc.stdin, tar, size, put.cancel or threading.Event(), put.progress, want=want
                )
                proc.stdin.close()
            except BrokenPipeError:  # it stopped reading: its exit status says why
                pass
            except BaseException:
                proc.kill()
                proc.wait()
                self.delete_layer(layer_id)
                raise
            rc = proc.wait()
            err.seek(0)
            tail = err.read().decode("utf-8", "replace").strip().splitlines()[-20:]
        return rc, "\n".join(tail)

    @property
    def can_stage(self) -> bool:
        """Whether a layer can be untarred before its ID is known, while it is still being written
        (``envspec-put-layer stage`` and ``commit``: the overlay driver; ENVSPEC_STAGED_IMPORT=off
        turns it off; an envspec-put-layer built before it had ``stage`` imports one layer after the other)."""
        if not (self.put_tool and self.driver == "overlay" and settings.read().staged_import):
            return False
        return _stage_flags(self.put_tool) is not None

    def prepare(self) -> None:
        """The driver's checks that mount a test overlay, run now (``envspec-put-layer prepare``),
        before layers are untarred: the unmount syncs the store's file system, which with the
        staged files of a pull still dirty took seconds in the first commit. Best effort: a tool
        without ``prepare`` (or a failed check) leaves the check to the first commit, as before."""
        if self.put_tool:
            self.engine.run(
                "prepare store",
                [
                    self.put_tool,
                    "prepare",
                    *self._store_flags(),
                ],
                check=False,
            )

    def stored_layers(self) -> dict[str, str]:
        """Layer ID -> diff digest of every layer in the store ("" for one without content)."""
        cp = self.engine.run("layers", self._cs("layers", "--json"), check=False)
        try:
            found = json.loads(cp.stdout) if cp.returncode == 0 else []
        except ValueError:
            found = []
        return {lay["id"]: lay.get("diff-digest") or "" for lay in found or []}

    def staging_root(self) -> Path:
        """The staging area: under the driver's home (a rename from there into a layer stays on
        its mount); each entry is named ``PID-...`` after the process that made it."""
        return Path(self.root) / self.driver / STAGING_DIR

    def make_staging_root(self) -> Path:
        """The staging area, made where it is not, its entries spread over the file system's
        block groups (``spread_dirs``; ``envspec-put-layer stage`` does the same), unless
        ``ENVSPEC_SPREAD_STAGING=off``."""
        root = self.staging_root()
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if settings.read().spread_staging:
            spread_dirs(root)
        return root

    def clean_staging(self) -> None:
        """Staging directories left by a killed build: those of processes no longer alive (the
        caller holds ``locked``; this build's own, made before its import began, are kept)."""
        root = self.staging_root()
        if not root.is_dir():
            return
        for p in root.iterdir():
            pid = p.name.split("-", 1)[0]
            if pid.isdigit() and _alive(int(pid)):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif p.name.endswith(".tar-split.gz"):
                p.unlink(missing_ok=True)
            else:
                p.unlink(missing_ok=True)

    def stage(
        self,
        fd: int,
        *,
        follow: bool,
        size: int | None,
        name: str = "",
        tree: Path | None = None,
        own: bool = False,
        progress: Callable[[int], None] = lambda n: None,
        nice: int | None = None,
    ) -> Stage:
        """Start untarring the layer file open at ``fd`` into the store's staging area (no lock of
        the store is taken). ``follow``: its maker is still writing it; ``Stage.end`` says its size.
        ``tree``: the maker makes the files there itself; only the tar-split record is made.
        ``own``: this build's maker made the tar (not the layer cache, not a registry): the tool
        untars it in its own process, not in a chrooted child (a tool built before ``--own``
        untars every tar chrooted). ``nice``: its niceness (default ``ENVSPEC_STAGE_NICE``, 10: a
        stager following a file catches up when cores are free; one fed through a pipe gets 0)."""
        assert self.put_tool
        argv = [
            self.put_tool,
            "stage",
            "--graph",
            self.root,
            "--storage-driver",
            self.driver,
            "--fd",
            str(fd),
            *(["--follow"] if follow else []),
            *(["--size", str(size)] if size is not None else []),
            *(["--tree", str(tree)] if tree is not None else []),
            *(
                ["--own"]
                if own and tree is None and "own" in (_stage_flags(self.put_tool) or ())
                else []
            ),
        ]
        log.info("stage layer %s: %s", name, " ".join(argv))
        return self._start_stager(argv, fd, name, progress, nice)

    def _start_stager(
        self,
        argv: list[str],
        fd: int,
        name: str,
        progress: Callable[[int], None],
        nice: int | None,
    ) -> Stage:
        """The stager's process, in a process group of its own, at niceness ``nice``."""
        err = tempfile.TemporaryFile()
        if nice is None:
            nice = settings.read().stage_nice

        def child() -> (
            None
        ):  # below the layer makers: a stager catches up with its maker when cores are free
            os.setpgid(0, 0)  # its own group, with the untar it starts: Stage.kill stops both
            die_with_parent()
            if nice:
                os.nice(nice)

        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            pass_fds=(fd,),
            preexec_fn=child,
            env={**os.environ, "LC_ALL": "C"},
        )
        return Stage(proc, err, name, progress, root=self.staging_root()).start()

    def commit_staged(
        self, layer_id: str, parent: str, diff_id: str, staged: Staged
    ) -> tuple[str, bool]:
        """Make layer ``layer_id`` on ``parent`` from a finished ``Stage``'s result, unless it is
        stored already (then the staged files are dropped). Returns (the stored diff digest,
        whether this call stored it). A layer of that ID left without content by a killed import
        is made again. One process: the tool looks for the layer itself."""
        assert self.put_tool
        argv = [
            self.put_tool,
            "commit",
            *self._store_flags(),
            "--id",
            layer_id,
            "--parent",
            parent,
            "--diff-digest",
            diff_id,
            "--staged",
            json.dumps(staged.raw),
        ]
        cp = self.engine.run("commit layer", argv, check=False)
        _drop_staged(staged)  # moved in, or not wanted any more
        if cp.returncode != 0:
            have = self.layer_diff_id(layer_id)
            if have:  # stored by someone else meanwhile
                return have, False
            raise command_failed(
                "making a staged layer in containers-storage failed",
                "import layer",
                cp,
                argv=argv[:-2],  # not the staged JSON
                kind=StagingEmptied if cp.returncode == EXIT_STAGING_EMPTIED else BuildError,
            )
        try:
            rec = json.loads(cp.stdout)
            return rec.get("diff-digest") or "", not rec.get("envspec-existing", False)
        except (ValueError, AttributeError):
            return self.layer_diff_id(layer_id) or "", True

    def _put_image_at_once(
        self,
        image_id: str,
        mdigest: str,
        top_layer: str,
        ref: str,
        items: tuple[tuple[str, bytes], ...],
    ) -> bool:
        """``put_image`` in one ``envspec-put-layer image``; False where the tool predates it."""
        assert self.put_tool
        with tempfile.TemporaryDirectory(prefix="envspec-import-") as td:
            args: list[str] = []
            for i, (name, blob) in enumerate(items):
                (Path(td) / str(i)).write_bytes(blob)
                args += ["--data", f"{name}={Path(td) / str(i)}"]
            argv = [
                self.put_tool,
                "image",
                *self._store_flags(),
                "--id",
                image_id,
                "--digest",
                mdigest,
                "--top",
                top_layer,
                "--name",
                ref,
                *args,
            ]
            cp = self.engine.run("create image", argv, check=False)
        if cp.returncode == 0:
            return True
        if cp.returncode != 2:
            raise command_failed(
                "creating the image in containers-storage failed", "create image", cp
            )
        return False

    def _create_image(self, image_id: str, mdigest: str, top_layer: str) -> None:
        """The image record on its top layer, with containers-storage's own tool (one made
        meanwhile by another build is taken)."""
        cp = self.engine.run(
            "create image",
            self._cs(
                "create-image",
                "--id",
                image_id,
                "--digest",
                mdigest,
                "--metadata",
                "{}",
                top_layer,
            ),
            check=False,
        )
        if (
            cp.returncode != 0
            and self.engine.run("image", self._cs("image", image_id), check=False).returncode
        ):
            raise command_failed(
                "creating the image in containers-storage failed", "create image", cp
            )

    def put_image(self, config: bytes, manifest: bytes, top_layer: str, ref: str) -> None:
        """Make (or complete) the image whose ID is the config's digest, store the config and
        the manifest under containers/image's names for them, and last give it the name ``ref``
        (taking it from any other image)."""

        image_id = hashlib.sha256(config).hexdigest()
        mdigest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        items = (
            ("sha256:" + image_id, config),
            ("manifest-" + mdigest, manifest),
            ("manifest", manifest),
        )
        # one process (``envspec-put-layer image``); a tool built before it says usage (2)
        if self.put_tool and self._put_image_at_once(image_id, mdigest, top_layer, ref, items):
            return
        if self.engine.run("image", self._cs("image", image_id), check=False).returncode != 0:
            self._create_image(image_id, mdigest, top_layer)
        with tempfile.TemporaryDirectory(prefix="envspec-import-") as td:
            for name, data in items:
                f = Path(td) / "data"
                f.write_bytes(data)
                self.engine.run(
                    "image data", self._cs("set-image-data", "--file", str(f), image_id, name)
                )
        self.engine.run("name", self._cs("add-names", "--name", ref, image_id))


@dataclass
class RecordingEngine:
    """The ``Engine`` that records each verb and runs nothing: unit tests and ``build --dry-run``."""

    calls: list[tuple[object, ...]] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)  # ref -> manifest digest
    fail_on: str = ""  # a verb that raises BuildError, to test failure paths

    def _call(self, verb: str, *args: object) -> None:
        self.calls.append((verb, *args))
        if verb == self.fail_on:
            raise BuildError(
                f"{verb} failed (fake)", step=verb, argv=[verb, *map(str, args)], returncode=1
            )

    def import_image(self, oci_dir: Path, ref: str) -> None:
        self._call("import_image", str(oci_dir), ref)
        index = Path(oci_dir) / "index.json"
        if index.is_file():  # a dry run records the verb on a layout that was never written
            self.images[ref] = json.loads(index.read_text())["manifests"][0]["digest"]

    def storage_cli(self) -> StorageCLI | None:
        return None

    def image_digest(self, ref: str) -> str:
        self._call("image_digest", ref)
        return self.images.get(ref, "")

    def push(self, oci_dir: Path, dest: str, *, index: bool = False) -> None:
        self._call("push", str(oci_dir), dest, *(["index"] if index else []))

    def copy(self, oci_dir: Path, dest: str, *, index: bool = False) -> None:
        self._call("copy", str(oci_dir), dest, *(["index"] if index else []))
