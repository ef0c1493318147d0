"""Every error envspec raises on purpose, with its reference, hint and exit code.

The core raises these with facts; only ``cli.py`` turns them into output and an exit status.
Exit codes (documented in README.md, kept distinct by tests/unit/test_errors.py):

====  ==========================================================================
 0    success
 1    a check failed: ``lock --check`` found the lock stale, ``verify`` or ``verify-image``
      found a failure, ``build --check-digest`` built another digest, ``db refresh`` could not
      read a release
 2    bad input: the spec, a lockfile, arguments, or a spec that cannot be satisfied; an image
      of another CPU architecture ``run`` was not asked to emulate (``emulation-not-asked``); a lock
      whose compiled packages cannot load beside its torch (``abi-mismatch``)
 3    a source could not give what was asked: index, mirror, Debian archive, network
      (``db refresh``: an index did not answer for a release; ``verify-image``: the registry); a registry
      refused a push, could not be reached, or dropped it half-way
 4    the build failed (a tool returned non-zero, a hash did not match)
 5    the host lacks something envspec needs (buildah, podman, a GPU driver)
130   interrupted (Ctrl-C); nothing was half-written
====  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

if TYPE_CHECKING:
    from envspec.causes import Candidate, Cause

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_SOURCE = 3
EXIT_BUILD = 4
EXIT_HOST = 5
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = (
    141  # the reader of stdout went away (`| head`): 128 + SIGPIPE, as a shell reports it
)


@dataclass
class Problem:
    """One thing wrong with an input: where it is, what is wrong, and what to do."""

    message: str
    path: str = ""  # TOML path such as "[target].gpus[0]" or "packages[3].sha256"
    line: int | None = None
    hint: str = ""
    reference: str = ""

    def where(self, file: str | Path | None) -> str:
        loc = str(file) if file else ""
        if file and self.line:
            loc = f"{file}:{self.line}"
        if self.path and loc:
            return f"{self.path} ({loc})"
        return self.path or loc


class EnvspecError(Exception):
    """Base class: a message, a kebab-case reference, a hint and an exit code."""

    reference = "envspec-error"
    exit_code = EXIT_BAD_INPUT
    hint_in_message = False  # the message already shows the hint (the CLI prints it once)

    def __init__(self, message: str, *, hint: str = "", reference: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if reference:
            self.reference = reference

    def problems(self) -> list[Problem]:
        return [Problem(self.message, hint=self.hint, reference=self.reference)]

    def to_json(self) -> dict[str, object]:
        return {
            "reference": self.reference,
            "message": self.message,
            "hint": self.hint,
            "causes": [p.message for p in self.problems()] if len(self.problems()) > 1 else [],
        }


class UsageError(EnvspecError):
    reference = "bad-usage"
    exit_code = EXIT_BAD_INPUT


class SpecError(EnvspecError):
    """A spec file is invalid; lists every problem found, each with its TOML path and line."""

    reference = "invalid-spec"
    exit_code = EXIT_BAD_INPUT
    hint_in_message = (
        True  # each problem's hint is under it; ``hint`` is the only one's, for --json
    )

    def __init__(self, file: str | Path, problems: list[Problem]) -> None:
        self.file = str(file)
        self._problems = problems
        n = len(problems)
        head = f"{self.file}: {n} problem{'s' if n != 1 else ''}"
        lines = [head] + [
            f"  {p.where(self.file)}: {p.message}"
            + (f" [{p.reference}]" if p.reference else "")
            + (f"\n    hint: {p.hint}" if p.hint else "")
            for p in problems
        ]
        super().__init__("\n".join(lines), hint=problems[0].hint if n == 1 else "")
        if n == 1 and problems[0].reference:
            self.reference = problems[0].reference

    def problems(self) -> list[Problem]:
        return self._problems

    def to_json(self) -> dict[str, object]:
        return {
            "reference": self.reference,
            "message": f"{self.file}: invalid spec",
            "hint": self.hint,
            "causes": [
                {
                    "path": p.path,
                    "line": p.line,
                    "message": p.message,
                    "hint": p.hint,
                    "reference": p.reference,
                }
                for p in self._problems
            ],
        }


class CompatDBError(EnvspecError):
    reference = "compat-db-invalid"
    exit_code = EXIT_BAD_INPUT


class ResolutionImpossible(EnvspecError):
    """Nothing satisfies the spec. ``causes`` are structured facts; explain.py words them."""

    reference = "no-compatible-torch"
    exit_code = EXIT_BAD_INPUT

    def __init__(
        self,
        message: str,
        causes: Sequence[Cause],
        candidates: Sequence[Candidate] | None = None,
        *,
        hint: str = "",
        reference: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint, reference=reference)
        self.causes = list(causes)
        self.candidates = list(candidates or [])


class SourceError(EnvspecError):
    """An index, mirror or Debian archive did not answer or does not have a pinned file."""

    reference = "source-unavailable"
    exit_code = EXIT_SOURCE


class LockError(EnvspecError):
    """A lockfile cannot be read (syntax, unknown format version) or written."""

    reference = "invalid-lock"
    exit_code = EXIT_BAD_INPUT


class StaleLock(EnvspecError):
    reference = "lock-out-of-date"
    exit_code = EXIT_CHECK_FAILED

    def __init__(self, lock_path: str | Path, reasons: list[str]) -> None:
        self.lock_path = str(lock_path)
        self.reasons = reasons
        super().__init__(
            f"{lock_path} is out of date:\n" + "\n".join(f"  - {r}" for r in reasons),
            hint=f"run `envspec lock` to update {lock_path}",
        )


class AbiProblem(Protocol):
    """What ``AbiMismatch`` words of a ``wheels.abi.Mismatch`` (errors imports no stage)."""

    @property
    def hint(self) -> str: ...
    @property
    def torch(self) -> str: ...
    def sentence(self) -> str: ...
    def to_json(self) -> dict[str, object]: ...


class AbiMismatch(EnvspecError):
    """Compiled packages of a lock that the locked torch cannot load: each ``wheels.abi.Mismatch``
    (the package, its extension module, the torch symbols or libraries missing, the torch it was
    most likely built for). The lock cannot run, so nothing is built from it."""

    reference = "abi-mismatch"
    exit_code = EXIT_BAD_INPUT

    def __init__(self, lock_name: str, mismatches: Sequence[AbiProblem]) -> None:
        self.mismatches = mismatches
        hints = list(dict.fromkeys(m.hint for m in mismatches if m.hint))
        super().__init__(
            f"{lock_name}: {len(mismatches)} extension module(s) cannot load beside torch "
            f"{mismatches[0].torch}:\n" + "\n".join(f"  - {m.sentence()}" for m in mismatches),
            hint="; ".join(hints)
            or "lock a torch release the package was built for, or a release of the "
            "package built for the locked torch",
        )

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "mismatches": [m.to_json() for m in self.mismatches]}


class PlanError(EnvspecError):
    reference = "cannot-plan"
    exit_code = EXIT_BAD_INPUT


class Failure(TypedDict, total=False):
    """What a ``BuildError`` says of the failed step beside its message (its keyword arguments)."""

    step: str
    argv: list[str] | None
    returncode: int | None
    stderr_tail: str
    reference: str | None


class HintedFailure(Failure, total=False):
    hint: str


class BuildError(EnvspecError):
    """A build step failed. Carries the step, the command, its return code and stderr's tail."""

    reference = "build-failed"
    exit_code = EXIT_BUILD

    def __init__(
        self,
        message: str,
        *,
        step: str = "",
        argv: list[str] | None = None,
        returncode: int | None = None,
        stderr_tail: str = "",
        hint: str = "",
        reference: str | None = None,
    ) -> None:
        detail = message
        if argv:
            detail += f"\n  command: {' '.join(argv)}"
        if returncode is not None:
            detail += f"\n  exit status: {returncode}"
        if stderr_tail:
            detail += "\n  stderr:\n" + "\n".join(
                "    " + ln for ln in stderr_tail.rstrip().splitlines()[-20:]
            )
        super().__init__(detail, hint=hint, reference=reference)
        self.step = step
        self.argv = argv or []
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class SourceBuildError(BuildError):
    """A wheel could not be built from its sdist (``wheels/sdist.py``): the step, the command, the
    log's tail, and where the whole log is kept."""

    reference = "source-build-failed"

    def __init__(
        self, message: str, *, log: Path | None = None, hint: str = "", **kw: Unpack[Failure]
    ) -> None:
        if log is not None:
            hint = hint or f"the whole build log: {log}"
        super().__init__(message, hint=hint, **kw)
        self.log = log


class HashMismatch(BuildError):
    reference = "hash-mismatch"


class DamagedEntry(HashMismatch):
    """A cache entry (``paths``: its files) whose bytes are no longer those recorded when it
    entered the cache: the build drops it and makes it again (``image.build``); raised to the user
    only when the entry made again is damaged too."""

    def __init__(
        self, message: str, *, paths: tuple[Path, ...] = (), **kw: Unpack[HintedFailure]
    ) -> None:
        super().__init__(message, **kw)
        self.paths = tuple(paths)


class RegistryError(EnvspecError):
    """A registry refused the credentials, could not be reached or trusted, or dropped a push.
    ``registry`` is the host[:port] named in the destination; the reference says which
    (``registry-auth-failed``, ``registry-unreachable``, ``registry-tls-failed``,
    ``push-interrupted``, else ``push-failed``)."""

    reference = "push-failed"
    exit_code = EXIT_SOURCE

    def __init__(
        self,
        message: str,
        *,
        registry: str = "",
        detail: str = "",
        hint: str = "",
        reference: str | None = None,
    ) -> None:
        if detail:
            message += "\n  skopeo said:\n" + "\n".join(
                "    " + ln for ln in detail.rstrip().splitlines()[-10:]
            )
        super().__init__(message, hint=hint, reference=reference)
        self.registry = registry

    def to_json(self) -> dict[str, object]:
        return super().to_json() | {"registry": self.registry}


class HostError(EnvspecError):
    """The host lacks a tool or capability envspec needs."""

    reference = "host-unsupported"
    exit_code = EXIT_HOST


ALL_ERRORS: tuple[type[EnvspecError], ...] = (
    UsageError,
    SpecError,
    CompatDBError,
    ResolutionImpossible,
    SourceError,
    LockError,
    StaleLock,
    PlanError,
    BuildError,
    HashMismatch,
    RegistryError,
    HostError,
)
