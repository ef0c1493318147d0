"""A wheel built from a source distribution like a Nix derivation: its inputs are pinned files, the
hash of the inputs names the output, and the same inputs give the same wheel bytes.

The inputs (``Derivation``): the sdist (by sha256), every build requirement as a pinned wheel (by
sha256: the build backend and what ``[build-system].requires`` names, or setuptools for a legacy
sdist without pyproject.toml), the Python, the platform and the compiler. ``Derivation.key`` hashes
them; the wheel it produces is cached under that key.

``build_wheel`` makes the build environment at a fixed path (``<work>/env``: ``uv venv``, then
``uv pip install --require-hashes`` of exactly the pinned build requirements, found only in a
folder of the pinned files: ``--offline --no-index``) and runs the backend in it (``uv build
--wheel --no-build-isolation``), with:

- a fixed path for the source and the environment (``/tmp/envspec-sdist/<key>``, the same on every
  machine: compilers write the source folder and the include paths, torch's headers in the
  environment among them, into objects' debug information);
- ``SOURCE_DATE_EPOCH`` (the build backends' zip timestamps), ``PYTHONHASHSEED=0``, ``TZ=UTC``,
  ``LC_ALL=C.UTF-8``, umask 022, and an empty HOME and uv cache of its own;
- no network: uv runs offline with no index, and the sdist's own code sees no configured index;
  ``envspec build`` runs it in a sandbox of the lock's Debian base (``Sandbox``).

A CUDA extension (an sdist that builds against a CUDA torch) also gets NVIDIA's toolkit wheels for
the lock's CUDA unpacked as CUDA_HOME (``cuda_home``) and the lock's GPUs as TORCH_CUDA_ARCH_LIST.

A failed build raises ``SourceBuildError`` (exit 4, ``source-build-failed``) with the log's tail and
where the whole log is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from envspec.cache.store import admit
from envspec.errors import HashMismatch, SourceBuildError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from envspec.cache.store import Cache
    from envspec.debian.models import DebPin
    from envspec.lock import Lockfile, Platform, Wheel
    from envspec.resolve import Resolution, WheelCandidate
    from envspec.sources import ResolvedSources
    from envspec.wheels.fetch import FilePin

# PEP 517: a source tree without [build-system] is built with setuptools' legacy backend
LEGACY_REQUIRES = ("setuptools>=40.8.0",)
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
BUILD_ROOT = Path("/tmp/envspec-sdist")  # fixed: the same absolute source path on every machine
DEFAULT_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can carry
LOG_TAIL = 40


@dataclass(frozen=True)
class Pin:
    """A pinned file: a build requirement's wheel or the sdist."""

    name: str
    version: str
    filename: str
    sha256: str

    @classmethod
    def of(cls, f: FilePin) -> Pin:
        """The pin of a lock's or a resolution's file (a wheel, an sdist, a build input)."""
        return cls(f.name, f.version, f.filename, f.sha256)


@dataclass(frozen=True)
class Derivation:
    """Everything a source build's output depends on; ``key`` names the wheel it produces."""

    sdist: Pin
    build_requires: tuple[Pin, ...]
    python: str  # "3.11"
    platform: str  # the wheel platform tag the image runs, "manylinux_2_36_x86_64"
    compiler: str = (
        ""  # the C/C++ compiler's identity ("gcc (Debian 12.2.0-14) 12.2.0"), "" for none
    )
    epoch: int = DEFAULT_EPOCH
    extra: tuple[tuple[str, str], ...] = field(
        default=()
    )  # further inputs by name (torch's sha256, ...)
    # a CUDA extension's compiler and headers: NVIDIA's toolkit wheels for the lock's CUDA, unpacked
    # as CUDA_HOME (``cuda_home``), and the GPU architectures it is compiled for (the lock's arch list)
    toolkit: tuple[Pin, ...] = ()
    arch_list: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        body: dict[str, object] = {
            "sdist": [self.sdist.name, self.sdist.version, self.sdist.sha256],
            "build_requires": sorted([p.name, p.version, p.sha256] for p in self.build_requires),
            "python": self.python,
            "platform": self.platform,
            "compiler": self.compiler,
            "epoch": self.epoch,
            "extra": sorted(list(x) for x in self.extra),
        }
        if (
            self.toolkit or self.arch_list
        ):  # only then: the keys of builds without CUDA stay as they were
            body["toolkit"] = sorted([p.name, p.version, p.sha256] for p in self.toolkit)
            body["arch_list"] = list(self.arch_list)
        return (
            "sha256:"
            + hashlib.sha256(
                json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
        )


def _names(sdist: Path) -> list[str]:
    if zipfile.is_zipfile(sdist):
        with zipfile.ZipFile(sdist) as z:
            return z.namelist()
    with tarfile.open(sdist) as t:
        return t.getnames()


def _read_member(sdist: Path, name: str) -> bytes | None:
    if zipfile.is_zipfile(sdist):
        with zipfile.ZipFile(sdist) as z:
            return z.read(name) if name in z.namelist() else None
    with tarfile.open(sdist) as t:
        try:
            f = t.extractfile(name)
        except KeyError:
            return None
        return f.read() if f is not None else None


def _top(sdist: Path) -> str:
    tops = {n.split("/", 1)[0] for n in _names(sdist) if n}
    if len(tops) != 1:
        raise SourceBuildError(
            f"{sdist.name}: a source distribution holds one top folder, this one has "
            f"{len(tops)} ({', '.join(sorted(tops)[:3])})",
            step=f"unpack {sdist.name}",
            hint="it is not an sdist as PEP 625 describes one; pin a release with a wheel",
        )
    return tops.pop()


def setup_imports(sdist: Path) -> list[str]:
    """The distributions a legacy sdist's setup.py imports unconditionally (its module body's
    imports, not those in a ``try``), as ``SETUP_IMPORTS`` names them: what it builds against
    without declaring it. [] where there is no setup.py or it does not parse."""
    import ast

    from envspec.resolve.model import SETUP_IMPORTS

    raw = _read_member(sdist, f"{_top(sdist)}/setup.py")
    if raw is None:
        return []
    try:
        tree = ast.parse(raw.decode("utf-8", "replace"))
    except SyntaxError:
        return []
    found: list[str] = []
    for node in tree.body:
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            else []
        )
        for n in names:
            dist = SETUP_IMPORTS.get(n.split(".")[0])
            if dist and dist not in found:
                found.append(dist)
    return found


class BuildSystem(NamedTuple):
    """An sdist's build system as envspec builds it: ``requires``, what its [build-system] declares
    (PEP 517's default for a legacy sdist) and ``undeclared``; ``backend``; ``undeclared``, what its
    setup.py imports unconditionally and does not declare (``setup_imports``: torch for mamba-ssm,
    whose pyproject.toml leaves torch out on purpose and says to build with
    ``--no-build-isolation``). Those are given at the lock's own pins, as uv's ``match-runtime``
    does, and the lock records them (issue 58, point 1)."""

    requires: list[str]
    backend: str
    undeclared: tuple[str, ...] = ()


def build_system(sdist: Path) -> BuildSystem:
    """``[build-system]``'s ``requires`` and ``build-backend`` from the sdist's pyproject.toml; a
    legacy sdist (no pyproject.toml, or no [build-system]) gets setuptools' legacy backend. A
    setuptools build also gets what its setup.py imports unconditionally and does not declare
    (``BuildSystem.undeclared``)."""
    raw = _read_member(sdist, f"{_top(sdist)}/pyproject.toml")
    table = None
    if raw is not None:
        try:
            table = tomllib.loads(raw.decode()).get("build-system")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise SourceBuildError(
                f"{sdist.name}: its pyproject.toml cannot be read: {e}",
                step=f"read {sdist.name}",
                hint="pin a release with a wheel",
            ) from e
    if not isinstance(table, dict) or "requires" not in table:
        declared, backend = list(LEGACY_REQUIRES), LEGACY_BACKEND
    else:
        declared = [str(r) for r in table["requires"]]
        backend = str(table.get("build-backend") or LEGACY_BACKEND)
    if backend.split(":")[0] != "setuptools.build_meta":
        return BuildSystem(declared, backend)
    from packaging.utils import canonicalize_name

    names = {canonicalize_name(n) for n in _requirement_names(declared)}
    undeclared = [d for d in setup_imports(sdist) if canonicalize_name(d) not in names]
    return BuildSystem(declared + undeclared, backend, tuple(undeclared))


def _needed(system: BuildSystem, needs: Sequence[str]) -> BuildSystem:
    """``system`` with what the sdist's metadata build at lock time was found to need
    (``WheelCandidate.build_needs``: an import in its setup.py that ``setup_imports`` cannot see,
    inside a function) among its requirements and its undeclared ones."""
    from packaging.utils import canonicalize_name

    have = {canonicalize_name(n) for n in _requirement_names(system.requires)}
    more = [n for n in needs if canonicalize_name(n) not in have]
    if not more:
        return system
    return system._replace(
        requires=[*system.requires, *more], undeclared=(*system.undeclared, *more)
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _unpack(sdist: Path, dest: Path, sha256: str = "") -> Path:
    """Unpack ``sdist`` into ``dest``; with ``sha256``, from the one open file whose bytes were
    just hashed and found to be those (the sdist may be a local mirror's file, read where it is)."""
    with open(sdist, "rb") as f:
        if sha256:
            got = hashlib.file_digest(f, "sha256").hexdigest()
            if got != sha256:
                raise HashMismatch(
                    f"{sdist} is not the locked sdist (sha256 {got}, the lock says {sha256})",
                    step=f"unpack {sdist.name}",
                    hint="it changed after it was fetched; build again",
                )
            f.seek(0)
        if zipfile.is_zipfile(f):
            f.seek(0)
            with zipfile.ZipFile(f) as z:
                z.extractall(dest)
        else:
            f.seek(0)
            with tarfile.open(fileobj=f) as t:
                t.extractall(dest, filter="data")
    return dest / _top(sdist)


def build_env(work: Path, epoch: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The build's environment: what makes its output depend on its inputs only."""
    keep = ("PATH", "LANG", "TMPDIR", "CC", "CXX", "MAKEFLAGS")
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in keep}
    env.update(
        {
            "SOURCE_DATE_EPOCH": str(epoch),
            "PYTHONHASHSEED": "0",
            "TZ": "UTC",
            "LC_ALL": "C.UTF-8",
            "HOME": str(work / "home"),
            "UV_CACHE_DIR": str(work / "uv-cache"),
            "UV_NO_CONFIG": "1",
            "UV_OFFLINE": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "PIP_NO_INDEX": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


@dataclass(frozen=True)
class Sandbox:
    """The lock's own Debian base as the build's whole world (bubblewrap): its Python and its
    compiler, read-only, with a private /tmp, /dev and /proc, the build's folder at its fixed path,
    uv at ``SANDBOX_UV``, and no network, no host environment, no other process."""

    rootfs: Path  # a root file system made from the lock's Debian packages (``debian.make_rootfs``)
    python: str  # the interpreter inside it: "/usr/bin/python3.11"


SANDBOX_UV = "/tmp/.envspec-tools/uv"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def jobs_env(jobs: int) -> dict[str, str]:
    """The compile jobs of one build, as make, ninja via setuptools (MAX_JOBS: torch's cpp_extension)
    and CMake read them; nothing where ``jobs`` is 0 (the build's own default)."""
    if jobs <= 0:
        return {}
    return {
        "MAKEFLAGS": f"-j{jobs}",
        "MAX_JOBS": str(jobs),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
    }


def _sandboxed(
    argv: list[str], box: Sandbox, work: Path, cwd: Path, env: Mapping[str, str], uv: str
) -> list[str]:
    """``argv`` as bubblewrap runs it in ``box``, with this host's ``uv`` at ``SANDBOX_UV``."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SourceBuildError(
            "bubblewrap (bwrap) is not installed: wheels built from sdists run in a sandbox "
            "of the lock's Debian base",
            step="build from source",
            hint="apt-get install bubblewrap (scripts/dev.sh setup installs it)",
        )
    out = [
        bwrap,
        "--ro-bind",
        str(box.rootfs),
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--bind",
        str(work),
        str(work),
        "--ro-bind",
        uv,
        SANDBOX_UV,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--chdir",
        str(cwd),
        "--clearenv",
    ]
    if os.geteuid() != 0:  # an unprivileged bwrap needs a user namespace of its own
        out.append("--unshare-user")
    for k, v in sorted(env.items()):
        out += ["--setenv", k, v]
    return out + ["--", *argv]


# a compile step in a build's log: the compiler run on one source (setuptools prints each command),
# or ninja's "[3/12] ..." (compiled by re as the log is read)
_COMPILE_LINE = r"^\[(\d+)/(\d+)\] |(?:^|/)(nvcc|[\w.+-]*(?:gcc|g\+\+|c\+\+|clang\+*))(?:-\d+)? .* -c ['\"]?([^ '\"]+)"


def compile_steps(text: str) -> list[str]:
    """The compile steps a piece of a build's log shows, in words: "nvcc isotonic_cuda.cu",
    "[3/12]"; what ``build_wheel`` reports as the build's progress."""
    import re

    out = []
    for line in text.splitlines():
        m = re.search(_COMPILE_LINE, line)
        if m is None:
            continue
        out.append(
            f"[{m.group(1)}/{m.group(2)}]"
            if m.group(1)
            else f"{m.group(3)} {Path(m.group(4)).name}"
        )
    return out


def failure_excerpt(text: str, tail: int = LOG_TAIL, first: int = 8) -> str:
    """What a failed build shows of its log: the first compiler errors (a parallel compile's
    error is far above the traceback its driver ends with: flash-attn's nvcc error, then 60 lines
    of ninja and setuptools), then the last ``tail`` lines."""
    import re

    lines = text.splitlines()
    end = lines[-tail:]
    early = [ln for ln in lines[:-tail] if re.search(r"\berror\b|^FAILED:|\bfatal\b", ln)][:first]
    if not early:
        return "\n".join(end)
    return "\n".join(["first errors in the log:", *early, "...", "its end:", *end])


def _follow(
    proc: subprocess.Popen[bytes],
    log: Path,
    on_progress: Callable[[str], None] | None,
    every: float = 1.0,
    start: int | None = None,
) -> None:
    """Wait for ``proc``, reading what it writes to ``log`` from ``start`` (default: the end as it is
    now) and reporting its compile steps."""
    if on_progress is None:
        proc.wait()
        return
    import time

    with open(log, "rb") as r:
        r.seek(0, os.SEEK_END) if start is None else r.seek(start)
        rest = b""
        while True:
            done = proc.poll() is not None
            chunk = rest + r.read()
            lines, _, rest = chunk.rpartition(b"\n")
            for step in compile_steps(lines.decode("utf-8", "replace")):
                on_progress(step)
            if done:
                return
            time.sleep(every)


@dataclass(frozen=True, kw_only=True)
class Builder:
    """What builds a wheel from its sdist: uv, the Python it builds with on this host (or, with
    ``sandbox``, in the lock's Debian base), where builds run (``root``), the compile jobs."""

    uv: str
    python: str
    root: Path = BUILD_ROOT
    sandbox: Sandbox | None = None
    jobs: int = 0


def build_wheel(
    d: Derivation,
    sdist: Path,
    build_wheels: Mapping[str, Path],
    out_dir: Path,
    *,
    builder: Builder,
    log: Path,
    on_progress: Callable[[str], None] | None = None,
) -> Path:
    """Build ``d``'s wheel from the checked files (``sdist``; ``build_wheels``: sha256 -> the file
    of each pinned build requirement, as the cache keeps them) into ``out_dir``; returns the wheel's
    path. ``builder.python``: the interpreter (or version) uv builds with, on this host; with
    ``builder.sandbox``, the build runs in it with its Python instead (``envspec build``: the lock's
    Debian base). ``on_progress``: each compile step the log shows (``compile_steps``), as it
    shows it. Raises ``SourceBuildError``."""
    work = builder.root / d.key.split(":", 1)[1][:16]
    with _locked(builder.root / f"{work.name}.lock"):
        shutil.rmtree(work, ignore_errors=True)
        (work / "wheels").mkdir(parents=True)
        (work / "home").mkdir()
        for p in d.build_requires:  # under its own file name: uv finds wheels by name
            if p.sha256 not in build_wheels:
                raise SourceBuildError(
                    f"{p.filename} (a build requirement of {d.sdist.name}) was not given",
                    step=f"build {d.sdist.name} {d.sdist.version}",
                )
            shutil.copyfile(build_wheels[p.sha256], work / "wheels" / p.filename)
        src = _unpack(sdist, work / "src", d.sdist.sha256)
        toolkit_env = _toolkit_env(d, build_wheels, work)
        toolkit_env |= {k.removeprefix("env:"): v for k, v in d.extra if k.startswith("env:")}
        argv, env = _build_command(d, builder, work, src, toolkit_env)
        returncode = _run_logged(d, argv, env, src, log, on_progress)
        wheels = sorted((work / "out").glob("*.whl")) if returncode == 0 else []
        if returncode != 0 or len(wheels) != 1:
            shutil.rmtree(work, ignore_errors=True)  # the log is kept, not the tree
            tail = failure_excerpt(log.read_text(errors="replace"))
            raise SourceBuildError(
                f"building {d.sdist.name} {d.sdist.version} from {d.sdist.filename} failed"
                + ("" if returncode != 0 else f": it made {len(wheels)} wheels"),
                step=f"build {d.sdist.name} {d.sdist.version}",
                argv=argv,
                returncode=returncode,
                stderr_tail=tail,
                log=log,
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        dest = out_dir / wheels[0].name
        shutil.move(wheels[0], dest)
        shutil.rmtree(work, ignore_errors=True)
        return dest


def _toolkit_env(d: Derivation, build_wheels: Mapping[str, Path], work: Path) -> dict[str, str]:
    """A CUDA extension's environment: the pinned toolkit as CUDA_HOME, at the build's fixed
    path, and the lock's arch list ({} for a build without a toolkit)."""
    if not d.toolkit:
        return {}
    missing = [p.filename for p in d.toolkit if p.sha256 not in build_wheels]
    if missing:
        raise SourceBuildError(
            f"{', '.join(missing)} (the CUDA toolkit of {d.sdist.name}) was not given",
            step=f"build {d.sdist.name} {d.sdist.version}",
        )
    home = cuda_home([build_wheels[p.sha256] for p in d.toolkit], work / "cuda")
    # nvcc names its intermediate files tmpxft_<its PID>_..., and those names end up in the
    # object (a static initializer's symbol): in the object's own folder they are named after it
    return {
        "CUDA_HOME": str(home),
        "CUDA_PATH": str(home),
        "TORCH_CUDA_ARCH_LIST": torch_arch_list(d.arch_list),
        "NVCC_APPEND_FLAGS": "--objdir-as-tempdir",
    }


def _build_command(
    d: Derivation, builder: Builder, work: Path, src: Path, toolkit_env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the build: a build environment at a fixed path (<work>/env)
    holding exactly the pinned build requirements, and the backend run in it without another
    isolation layer (uv's own isolated environment lives in a folder of a random name, which a
    compiler writes into the objects' debug information: the include paths of torch's headers,
    for a torch extension); in the sandbox where there is one."""
    constraints = work / "build-constraints.txt"
    constraints.write_text(
        "".join(
            f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n"
            for p in sorted(d.build_requires, key=lambda p: p.name)
        )
    )
    venv, sandbox = work / "env", builder.sandbox
    tool = SANDBOX_UV if sandbox is not None else builder.uv
    python = sandbox.python if sandbox else builder.python
    in_venv = ["--python", str(venv / "bin" / "python")]
    steps = [[tool, "venv", "--offline", "--python", python, str(venv)]]
    if d.build_requires:
        steps.append(
            [tool, "pip", "install", "--offline", "--no-index", "--find-links"]
            + [str(work / "wheels"), "--require-hashes", *in_venv, "-r", str(constraints)]
        )
    steps.append(
        [tool, "build", "--wheel", "--no-build-isolation", "--offline", "--no-index", *in_venv]
        + ["--out-dir", str(work / "out"), str(src)]
    )
    import shlex

    argv = ["/bin/sh", "-ec", " && ".join(shlex.join(s) for s in steps)]
    jobs = jobs_env(builder.jobs)
    if sandbox is None:
        env = build_env(work, d.epoch) | jobs | toolkit_env
        if "CUDA_HOME" in toolkit_env:
            env["PATH"] = f"{toolkit_env['CUDA_HOME']}/bin:{env.get('PATH', '')}"
        return argv, env
    path = (
        f"{toolkit_env['CUDA_HOME']}/bin:{SANDBOX_PATH}"
        if "CUDA_HOME" in toolkit_env
        else SANDBOX_PATH
    )
    env = build_env(work, d.epoch, base={"PATH": path}) | jobs | toolkit_env | {"TMPDIR": "/tmp"}
    return _sandboxed(argv, sandbox, work, src, env, builder.uv), env


def _run_logged(
    d: Derivation,
    argv: list[str],
    env: dict[str, str],
    src: Path,
    log: Path,
    on_progress: Callable[[str], None] | None,
) -> int:
    """Run the build with its output in ``log`` (headed by what is built and how), each compile
    step to ``on_progress`` as the log shows it. Returns its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write(
            f"# {d.sdist.name} {d.sdist.version} from {d.sdist.filename} (derivation {d.key})\n"
            f"# {' '.join(argv)}\n"
        )
        f.flush()
        start = f.tell()
        # umask in the child only: builds run on several threads at once (``build_all``)
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, cwd=src, env=env, umask=0o022
        )
        _follow(proc, log, on_progress, start=start)
    return proc.returncode


def _entry(d: Derivation, cache_root: Path) -> Path:
    """``d``'s folder in the cache: ``<cache>/built/<key hex>/``."""
    return cache_root / "built" / d.key.split(":", 1)[1]


def cached_wheel(d: Derivation, cache_root: Path) -> Path | None:
    """``d``'s wheel from the cache, checked against the sha256 recorded when it was built; None
    where it is not there or is damaged."""
    entry = _entry(d, cache_root)
    try:
        m = json.loads((entry / "wheel.json").read_text())
        wheel: Path = entry / str(m["filename"])
        with open(wheel, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() == m["sha256"]:
                return wheel
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def cached_build(
    d: Derivation,
    sdist: Path,
    build_wheels: Mapping[str, Path],
    cache_root: Path,
    *,
    builder: Builder,
    on_progress: Callable[[str], None] | None = None,
) -> tuple[Path, bool]:
    """``d``'s wheel from the cache (``<cache>/built/<key>/``, checked against the sha256 recorded
    when it was built), or built now and kept there with its log (``<cache>/built/<key>/build.log``,
    also kept when the build fails). Returns (the wheel, whether it was built now)."""
    import tempfile
    import time

    entry = _entry(d, cache_root)
    found = cached_wheel(d, cache_root)
    if found is not None:
        return found, False
    entry.mkdir(parents=True, exist_ok=True)
    with _locked(entry / ".lock"):
        found = cached_wheel(d, cache_root)  # built by another process while this one waited
        if found is not None:
            return found, False
        out = Path(tempfile.mkdtemp(prefix=".out-", dir=entry))
        try:
            began = time.monotonic()
            made = build_wheel(
                d,
                sdist,
                build_wheels,
                out,
                builder=builder,
                log=entry / "build.log",
                on_progress=on_progress,
            )
            seconds = round(time.monotonic() - began, 1)
            with open(made, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            admit(made, entry / made.name)  # read-only, as every entry
            tmp = entry / ".wheel.json.tmp"
            tmp.unlink(missing_ok=True)
            tmp.write_text(
                json.dumps(
                    {
                        "filename": made.name,
                        "sha256": digest,
                        "key": d.key,
                        "sdist": [d.sdist.name, d.sdist.version, d.sdist.sha256],
                        # how long it took, with how many compile jobs: ``estimate``'s history
                        "seconds": seconds,
                        "jobs": builder.jobs,
                    },
                    indent=1,
                )
            )
            admit(tmp, entry / "wheel.json")  # last: an entry without its record is not an entry
            return entry / made.name, True
        finally:
            shutil.rmtree(out, ignore_errors=True)


# NVIDIA's wheels that make a CUDA toolkit for building extensions, per CUDA major version: nvcc, its
# front end's headers (crt) and cicc (nvvm), the CUDA C++ core libraries' headers (cccl) and the
# runtime (cuda_runtime.h, libcudart), each pinned to the lock's CUDA major.minor. CUDA 13 only:
# PyPI's nvidia-cuda-nvcc-cu12 carries ptxas and no nvcc (12.8.93: bin/ptxas alone)
TOOLKIT_WHEELS: dict[str, tuple[str, ...]] = {
    "13": (
        "nvidia-cuda-nvcc",
        "nvidia-cuda-crt",
        "nvidia-nvvm",
        "nvidia-cuda-cccl",
        "nvidia-cuda-runtime",
    ),
}


# What a CUDA extension's own setup.py reads instead of TORCH_CUDA_ARCH_LIST, and its switch that
# stops it from downloading a prebuilt wheel from its project's releases: set from the lock ("{archs}":
# the arch list's numbers, "90;100"), inputs of the derivation like any other
PACKAGE_ENV: dict[str, dict[str, str]] = {
    "flash-attn": {"FLASH_ATTN_CUDA_ARCHS": "{archs}", "FLASH_ATTENTION_FORCE_BUILD": "TRUE"},
    "causal-conv1d": {"CAUSAL_CONV1D_FORCE_BUILD": "TRUE"},
    "mamba-ssm": {"MAMBA_FORCE_BUILD": "TRUE"},
    "fast-hadamard-transform": {"FAST_HADAMARD_TRANSFORM_FORCE_BUILD": "TRUE"},
}


def package_env(name: str, arch_list: Sequence[str]) -> dict[str, str]:
    """``PACKAGE_ENV``'s settings for package ``name``, for the lock's arch list."""
    archs = ";".join(a.split("_", 1)[-1] for a in arch_list if a.startswith("sm_"))
    return {k: v.replace("{archs}", archs) for k, v in PACKAGE_ENV.get(name, {}).items()}


def toolkit_requirements(cuda: str, locked: Mapping[str, str] | None = None) -> list[str]:
    """The toolkit wheels for CUDA ``cuda`` ("13.0"): ``nvidia-cuda-nvcc==13.0.*``, ...; [] where
    envspec knows no toolkit wheels for that major version. They follow the torch build the lock
    has (issue 58, point 2): ``locked`` (name -> version of the lock's wheels) gives the CUDA
    runtime's major.minor where it pins one, and a toolkit wheel the lock already pins (torch
    2.15.0 cu132 brings nvidia-cuda-cccl 13.3.5.0.6) is required by its name alone, so the lock's
    pin holds it."""
    locked = locked or {}
    major, _, minor = cuda.partition(".")
    runtime = locked.get("nvidia-cuda-runtime", "").split(".")
    if len(runtime) >= 2 and runtime[0] == major:
        minor = runtime[1]
    return [
        n if n in locked else f"{n}=={major}.{minor or 0}.*" for n in TOOLKIT_WHEELS.get(major, ())
    ]


def torch_arch_list(arch_list: Sequence[str]) -> str:
    """The lock's arch list (``sm_90``, ``compute_120``) as TORCH_CUDA_ARCH_LIST reads it: "9.0;12.0+PTX"."""
    import re

    out: list[str] = []
    for a in arch_list:
        kind, _, num = a.partition("_")
        m = re.fullmatch(r"(\d+)(\d)([a-z]?)", num)  # 90 -> 9.0, 100a -> 10.0a
        v = f"{m.group(1)}.{m.group(2)}{m.group(3)}" if m else num
        if kind == "compute":
            if v in out:
                out[out.index(v)] = f"{v}+PTX"
            else:
                out.append(f"{v}+PTX")
        elif v not in out and f"{v}+PTX" not in out:
            out.append(v)
    return ";".join(out)


def cuda_home(toolkit: Sequence[Path], dest: Path) -> Path:
    """NVIDIA's toolkit wheels (``toolkit``) unpacked into one CUDA_HOME at ``dest``: each wheel's
    ``nvidia/<part>/`` tree merged (CUDA 13 wheels share ``nvidia/cu13/``, CUDA 12 ones have a folder
    each), ``lib64`` as ``lib``, and the unversioned ``libcudart.so`` the linker asks for."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in toolkit:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if len(parts) < 3 or parts[0] != "nvidia" or info.is_dir():
                    continue
                target = dest.joinpath(*parts[2:])
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                mode = (info.external_attr >> 16) & 0o777
                os.chmod(target, mode or 0o644)
    lib = dest / "lib"
    if lib.is_dir() and not (dest / "lib64").exists():
        (dest / "lib64").symlink_to("lib")
    for so in sorted(lib.glob("libcudart.so.*")) if lib.is_dir() else ():
        if not (lib / "libcudart.so").exists():
            (lib / "libcudart.so").symlink_to(so.name)
    return dest


def memory_jobs(per_job: int = 4 << 30) -> int:
    """How many compile jobs the machine's memory holds (nvcc of a large kernel: about 4 GiB each)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return os.cpu_count() or 1
    return max(1, total // per_job)


def compiler_of(debs: Iterable[DebPin]) -> str:
    """The C compiler a lock's Debian base carries, as its pin ("gcc-12 12.2.0-14+deb12u1"): what
    an sdist's C code is compiled with; "" where the lock has none."""
    import re

    found = sorted(f"{d.name} {d.version}" for d in debs if re.fullmatch(r"gcc-\d+", d.name))
    return found[-1] if found else ""


def derivation(
    w: FilePin,
    build: Sequence[FilePin],
    *,
    python: str,
    platform: str,
    compiler: str,
    toolkit: Sequence[FilePin] = (),
    arch_list: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Derivation:
    """The derivation of a locked sdist (``w``) with its pinned build requirements (and, for a CUDA
    extension, its toolkit wheels, arch list and the package's own settings), as the lock makes it
    (``pin_inputs``) and the build makes it again (``derivation_of``)."""
    return Derivation(
        sdist=Pin.of(w),
        build_requires=tuple(Pin.of(b) for b in build),
        python=python,
        platform=platform,
        compiler=compiler,
        toolkit=tuple(Pin.of(b) for b in toolkit),
        arch_list=tuple(arch_list),
        extra=tuple(sorted((f"env:{k}", v) for k, v in (env or {}).items())),
    )


def _requirement_names(requires: list[str]) -> set[str]:
    from envspec.spec import requirement_name

    return {requirement_name(r).lower() for r in requires}


def _cuda_inputs(
    w: WheelCandidate,
    requires: list[str],
    res: Resolution,
    sources: ResolvedSources,
    workdir: Path,
    locked: list[str],
) -> tuple[list[WheelCandidate], list[str], tuple[str, ...]]:
    """What a build of ``w`` against the lock's CUDA torch needs besides its own requirements:
    (the CUDA toolkit's wheels, its requirements with ninja, the GPU architectures to compile
    for). No nvcc wheel for that CUDA: ``ResolutionImpossible`` (no-cuda-compiler)."""
    from envspec.resolve import build_inputs

    ch = res.choice
    assert ch.torch is not None
    cuda = ch.torch.variant.cuda or ""
    if not toolkit_requirements(cuda):
        raise _no_cuda_compiler(w, res, cuda)
    pins = {p.name: p.version for p in res.wheels if not p.is_sdist}
    toolkit = build_inputs(
        toolkit_requirements(cuda, pins),
        ch,
        sources,
        workdir=workdir,
        name=f"{w.name}-cuda",
        constraints=locked,
    )
    if "ninja" not in _requirement_names(requires):
        # torch's cpp_extension compiles in parallel (MAX_JOBS) with ninja, else one file at a time
        requires = [*requires, "ninja"]
    # for the GPUs the lock is for (its hardware contract), else for every GPU its torch is built for
    arch_list = tuple(f"sm_{cc.replace('.', '')}" for cc in ch.compute_capabilities) or tuple(
        ch.torch.variant.arch_list
    )
    return toolkit, requires, arch_list


def _no_cuda_compiler(w: WheelCandidate, res: Resolution, cuda: str) -> Exception:
    from envspec.causes import NoCudaCompiler
    from envspec.errors import ResolutionImpossible

    t = res.choice.torch
    return ResolutionImpossible(
        f"{w.name} {w.version} has no wheel and builds a CUDA extension, and there is no CUDA compiler "
        f"for CUDA {cuda} on the package indexes",
        causes=[
            NoCudaCompiler(
                text=f"{w.name} {w.version} builds against torch "
                f"{t.release.version if t else ''} {t.variant.name if t else ''} (CUDA {cuda}); NVIDIA "
                f"publishes nvcc as a wheel for CUDA 13 only (nvidia-cuda-nvcc; nvidia-cuda-nvcc-cu12 "
                f"carries ptxas alone), and envspec never compiles with a system's nvcc",
            )
        ],
        hint=f'lock a CUDA 13 torch ([torch].cuda = "13.0": torch 2.11 or later on PyPI), or pin a '
        f"release of {w.name} that has a wheel",
        reference="no-cuda-compiler",
    )


def _with_inputs(
    w: WheelCandidate,
    system: BuildSystem,
    build: list[WheelCandidate],
    base: tuple[str, str, str],
    toolkit: list[WheelCandidate],
    arch_list: tuple[str, ...],
) -> WheelCandidate:
    """``w`` with its build inputs and its derivation's key: ``system``, its [build-system]'s
    backend and requirements; ``base``, the exact Python, the compiler and the platform tag."""
    import dataclasses

    from envspec.resolve import SourceInputs

    python, compiler, platform = base
    env = package_env(w.name, arch_list) if toolkit else {}
    d = derivation(
        w,
        build,
        python=python,
        platform=platform,
        compiler=compiler,
        toolkit=toolkit,
        arch_list=arch_list,
        env=env,
    )
    return dataclasses.replace(
        w,
        source=SourceInputs(
            backend=system.backend,
            requires=tuple(system.requires),
            undeclared=system.undeclared,
            build=tuple(build),
            python=python,
            compiler=compiler,
            key=d.key,
            toolkit=tuple(toolkit),
            arch_list=arch_list,
            env=tuple(sorted(env.items())),
        ),
    )


def pin_inputs(
    res: Resolution, sources: ResolvedSources, cache: Cache, *, workdir: Path
) -> Resolution:
    """The resolution with each sdist it takes (``WheelCandidate.is_sdist``) given its build inputs
    (``WheelCandidate.source``): the sdist is fetched by its sha256 into the cache, its
    ``[build-system]`` read (``build_system``), its build requirements pinned as wheels for the
    image's platform and Python (``resolve.build_inputs``; a package the lock also pins, torch, at
    the lock's version), and the derivation's key computed with the exact Python and the compiler
    of the lock's Debian base."""
    import dataclasses

    from envspec import debian
    from envspec.resolve import build_inputs
    from envspec.wheels.fetch import WheelFetcher

    todo = [w for w in res.wheels if w.is_sdist and w.source is None]
    if not todo:
        return res
    ch = res.choice
    files = WheelFetcher(cache, sources.mirrors).fetch_all(todo)
    python = (debian.python_full_version(list(res.debs), ch.suite) if ch.suite else "") or ch.python
    compiler = compiler_of(list(res.debs))
    locked = [f"{w.name}=={w.version}" for w in res.wheels if not w.is_sdist]
    done: dict[str, WheelCandidate] = {}
    cuda = ch.torch.variant.cuda if ch.torch is not None else ""

    for w in todo:
        system = _needed(build_system(files[w.sha256]), w.build_needs)
        requires = system.requires
        toolkit: list[WheelCandidate] = []
        arch_list: tuple[str, ...] = ()
        # a build against a CUDA torch compiles CUDA code: the lock's CUDA toolkit, from NVIDIA's wheels
        if cuda and "torch" in _requirement_names(requires):
            toolkit, requires, arch_list = _cuda_inputs(w, requires, res, sources, workdir, locked)
        build = build_inputs(
            requires, ch, sources, workdir=workdir, name=w.name, constraints=locked
        )
        base = (python, compiler, ch.platform_tag)
        done[w.sha256] = _with_inputs(
            w, system._replace(requires=requires), build, base, toolkit, arch_list
        )
    return dataclasses.replace(
        res, wheels=[done.get(w.sha256, w) if w.is_sdist else w for w in res.wheels]
    )


def derivation_of(w: Wheel, platform: Platform) -> Derivation:
    """The derivation of a lock's pin built from its sdist (``Wheel.source``), checked against the
    key the lock records: a lock whose inputs do not give its key (edited by hand, or written by an
    envspec that hashes otherwise) is refused (``LockError``), not built under a wrong name."""
    from envspec.errors import LockError

    src = w.source
    if src is None:
        raise ValueError(f"{w.filename} is not built from source")
    d = derivation(
        w,
        src.build,
        python=src.python,
        platform=platform.platform_tag,
        compiler=src.compiler,
        toolkit=src.toolkit,
        arch_list=src.arch_list,
        env=src.env,
    )
    if d.key != src.key:
        raise LockError(
            f"{w.name} {w.version}: the lock's [wheels.source].key {src.key[:19]}… is not the hash of "
            f"its inputs ({d.key[:19]}…)",
            hint="re-create the lock with `envspec lock`",
            reference="lock-source-key",
        )
    return d


class SourceEvents:
    """What ``build_all`` reports: a wheel's build starts, one of its compile steps, its wheel is
    there (built now in ``seconds``, or ``cached``). No-ops here; ``image`` reports them."""

    def start(self, w: Wheel) -> None: ...
    def progress(self, w: Wheel, step: str) -> None: ...
    def done(self, w: Wheel, wheel: Path, seconds: float, cached: bool) -> None: ...


def _refuse_cross_build(lock: Lockfile, todo: Sequence[Wheel]) -> None:
    """No wheel is built from source for another architecture than this host's."""
    import platform as host_platform

    machine = host_platform.machine()
    if (
        machine != lock.platform.arch
    ):  # Linux names them as the lock does (x86_64, aarch64), as run.py compares
        names = ", ".join(f"{w.name} {w.version}" for w in todo)
        raise SourceBuildError(
            f"{names}: built from source for {lock.platform.arch}, on a {machine} host",
            step="build from source",
            hint=f"build this lock on a {lock.platform.arch} host once with --cache-to, and take "
            "the layer from the registry cache here (--cache-from)",
        )


def build_all(
    lock: Lockfile,
    pins: Sequence[Wheel],
    files: Mapping[str, Path],
    cache_root: Path,
    *,
    sandbox: Callable[[], Sandbox],
    parallel: int = 1,
    jobs: int = 0,
    events: SourceEvents | None = None,
) -> dict[str, Path]:
    """The wheels of the lock's pins built from source: sdist sha256 -> the wheel, each taken from
    the cache (``cached_wheel``) or built (``cached_build``) in the lock's Debian base (``sandbox``,
    made only where something is built), ``parallel`` at once with ``jobs`` compile jobs each (0:
    the cores divided among them). ``files``: sha256 -> the checked file of every sdist and build
    requirement. ``events``: what it reports."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from envspec.resolve.uv import _uv

    events = events or SourceEvents()
    derivations = {w.sha256: derivation_of(w, lock.platform) for w in pins}
    out: dict[str, Path] = {}
    todo = []
    for w in pins:
        hit = cached_wheel(derivations[w.sha256], cache_root)
        if hit is not None:
            out[w.sha256] = hit
            events.done(w, hit, 0.0, True)
        else:
            todo.append(w)
    if not todo:
        return out
    _refuse_cross_build(lock, todo)
    box = sandbox()
    uv = _uv()
    parallel = max(1, min(parallel, len(todo)))
    per = jobs if jobs > 0 else max(1, (os.cpu_count() or 1) // parallel)
    if jobs <= 0 and any(derivations[w.sha256].toolkit for w in todo):  # nvcc: about 4 GiB a job
        per = max(1, min(per, memory_jobs() // parallel))

    def one(w: Wheel) -> tuple[str, Path]:
        events.start(w)
        start = time.monotonic()
        wheel, made = cached_build(
            derivations[w.sha256],
            files[w.sha256],
            files,
            cache_root,
            builder=Builder(uv=uv, python=box.python, sandbox=box, jobs=per),
            on_progress=(lambda text: events.progress(w, text)),
        )
        events.done(w, wheel, time.monotonic() - start, not made)
        return w.sha256, wheel

    with ThreadPoolExecutor(max_workers=parallel) as ex:
        for sha, wheel in ex.map(one, todo):
            out[sha] = wheel
    return out
