"""The one place that words resolution results and causes: sentences, tables and JSON."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.causes import (
    ArchFits,
    ArchMissing,
    Candidate,
    Cause,
    CudaNotOffered,
    DebianUnsatisfiable,
    DriverFloor,
    DriverPastGpu,
    DriverTooOld,
    InvalidDebianPackage,
    PythonUnsupported,
    ReleaseNeedsReview,
    Said,
    Suggestion,
    TorchSide,
    UnknownCuda,
    UnknownDebianPackage,
    VariantNotRequested,
)
from envspec.compat import best_arch
from envspec.errors import ResolutionImpossible

if TYPE_CHECKING:
    from markupsafe import Markup

    from envspec.compat.model import CompatDB, CudaToolkit, Gpu, Variant
    from envspec.lock import Lockfile
    from envspec.resolve import Choice, PassedOver


def cause_sentence(c: Cause) -> str:
    text = _sentence(c)
    return f"{c.where}: {text}" if c.where else text


def _sm(cc: str) -> str:
    return "sm_" + cc.replace(".", "")


def _sentence(c: Cause) -> str:
    match c:
        case ArchMissing():
            shown = ", ".join(c.arch_list) if c.arch_list else "no CUDA architectures"
            return (
                f"{c.gpu} ({c.cc}) needs {_sm(c.cc)} SASS or PTX <= compute_{c.cc.replace('.', '')}; "
                f"{c.variant} has {shown}"
            )
        case DriverTooOld():
            return (
                f"driver {c.driver} < {c.needed}, the floor of CUDA {c.cuda} under the "
                f"'{c.policy}' policy"
            )
        case DriverPastGpu():
            return (
                f"CUDA {c.cuda} needs driver >= {c.needed} ('{c.policy}' policy), newer than R{c.last}, "
                f"the last driver branch for {c.gpu} (source: {c.source})"
            )
        case PythonUnsupported():
            return f"torch {c.torch} has no wheels for Python {c.python} (it has {', '.join(c.supported)})"
        case VariantNotRequested():
            return f"{c.variant} is not what [torch].cuda asks for ({c.wanted})"
        case ArchFits():
            return f"{c.gpu}: {c.why}"
        case DriverFloor():
            return f"driver >= {c.floor} ({c.policy})"
        case CudaNotOffered():
            return f"no release in the range has a build for CUDA {c.wanted} (offered: {', '.join(c.offered)})"
        case ReleaseNeedsReview():
            return f"torch {c.torch} needs review before it can be resolved: " + "; ".join(c.items)
        case UnknownDebianPackage():
            guess = c.did_you_mean
            return (
                f"no package named {c.name!r} in Debian {c.suite} ({', '.join(c.pockets or [c.suite])})"
                + (f"; did you mean {' or '.join(repr(x) for x in guess)}?" if guess else "")
            )
        case UnknownCuda():
            return f"CUDA {c.cuda} is not in the compatibility DB"
        case InvalidDebianPackage():
            return f"{c.requested!r} is not a Debian package name"
        case DebianUnsatisfiable():
            return (
                f"apt cannot install {', '.join(c.requested)} from Debian {c.suite}: "
                + "; ".join(c.apt)
            )
        case TorchSide():
            return _torch_side(c)
        case Said() | Suggestion():
            return c.text
    return c.kind


def _torch_side(c: TorchSide) -> str:
    if c.releases:
        shown = ", ".join(c.releases)
        if c.more:
            return f"{c.requirement} installs beside torch {shown} (older releases not asked)"
        only = " only" if len(c.releases) == 1 else ""
        return f"{c.requirement} installs beside torch {shown}{only} of the releases that fit"
    if c.pythons:
        return (
            f"{c.requirement} installs beside no torch release that fits, with Python {c.python}; it "
            f"does with Python {', '.join(c.pythons)}"
        )
    return f"{c.requirement} installs beside no torch release that fits"


def _last_branch(gpus: Iterable[Gpu]) -> str | None:
    """The oldest of the GPUs' last driver branches ("580"), None where none has one."""
    last = [g.max_driver for g in gpus if g.max_driver]
    return min(last, key=int) if last else None


def choice_json(choice: Choice, *, packages: bool = False) -> dict[str, object]:
    """The fixed `envspec explain --json` shape for a successful choice; ``packages``: the choice
    was made with the packages (``explain --packages``), and says which releases they passed over."""
    t = choice.torch
    out: dict[str, object] = {
        "ok": True,
        "torch": t.release.version if t else None,
        "variant": t.variant.name if t else None,
        "cuda": (t.variant.cuda or None) if t else None,
        "cudnn": (t.variant.cudnn or None) if t else None,
        "nccl": (t.variant.nccl or None) if t else None,
        "arch_list": list(t.variant.arch_list) if t else [],
        "min_driver": (t.min_driver or None) if t else None,
        "max_driver": _last_branch(
            choice.gpus
        ),  # the newest driver branch every GPU is driven by (None: no end)
        "driver_policy": choice.driver_policy,
        "python": choice.python,
        "candidates": [candidate_json(c) for c in t.candidates] if t else [],
        "torch_range": choice.spec.torch.version
        if t and choice.spec.torch
        else None,  # [torch].version as read ("2.9" is "==2.9.*")
        "newer_releases": [
            {"torch": v, "why": release_reason(causes, choice)} for v, causes in t.newer
        ]
        if t
        else [],
        "gpus": [
            {
                "name": g.name,
                "cc": g.cc,
                "architecture": g.architecture or None,
                "line": g.line or None,
                "min_driver": g.min_driver or None,
                "max_driver": g.max_driver or None,
                "host_arch": list(g.host_arch),
            }
            for g in choice.gpus
        ],
        "base": choice.base,
        "platform": choice.platform,
        "notes": list(choice.notes)
        + ([] if packages else [n for n in [packages_note(choice)] if n]),
    }
    if packages:
        out["passed_over"] = passed_over_json(choice)
        out["from_source"] = list(choice.from_source)
        out["from_source_deps"] = list(choice.from_source_deps)
    return out


def packages_note(choice: Choice) -> str | None:
    """What offline `explain` cannot know: `lock` chooses torch together with the named packages."""
    spec = choice.spec
    named = list(spec.python.packages) + (list(spec.torch.packages) if spec.torch else [])
    if choice.torch is None or not named:
        return None
    return (
        "`envspec lock` chooses torch together with the packages the spec names, so the release may be older "
        "where one of them pins torch; `envspec explain --packages` shows that choice (it reads the indexes)"
    )


def passed_over_lines(choice: Choice) -> list[str]:
    """Why the torch of a choice made with the packages (``resolve.with_packages``) is not the
    newest release that fits the hardware: each newer fitting release passed over, and the named
    package that does not accept it. Empty where it is the newest."""
    if choice.torch is None or not choice.passed_over:
        return []
    by_release: dict[str, list[PassedOver]] = {}
    for h in choice.passed_over:
        by_release.setdefault(h.torch, []).append(h)
    lines = [
        f"torch {choice.torch.release.version} was chosen together with the packages the spec names; "
        "newer releases that fit the hardware were passed over:"
    ]
    for release, held in by_release.items():
        why = "; ".join(f"{h.package} {h.version} requires {h.requires}" for h in held if h.package)
        lines.append(
            f"  torch {release}: {why or 'a dependency of the named packages does not accept it'}"
        )
    return lines


def from_source_lines(choice: Choice) -> list[str]:
    """The packages `lock` takes as sdists and `build` builds: the named ones
    (``Choice.from_source``), then their dependencies (``Choice.from_source_deps``)."""
    where = f"for {choice.platform} and Python {choice.python}"
    lines = []
    if choice.from_source:
        lines.append(
            f"built from source (their newest release has no wheel {where}; `envspec build` "
            f"builds each from its sdist): {', '.join(choice.from_source)}"
        )
    if choice.from_source_deps:
        lines.append(
            f"built from source as dependencies of the named packages (no release they accept has "
            f"a wheel {where}): {', '.join(choice.from_source_deps)}"
        )
    return lines


def passed_over_json(choice: Choice) -> list[dict[str, str]]:
    return [h.to_json() for h in choice.passed_over]


def candidate_reason(c: Candidate) -> str:
    return "; ".join(cause_sentence(f) for f in c.facts) or "fits"


def candidate_json(c: Candidate) -> dict[str, object]:
    return {
        "variant": c.variant,
        "cuda": c.cuda,
        "ok": c.ok,
        "reason": candidate_reason(c),
        "preferred": c.preferred,
        "index": c.index,
    }


def _index_name(url: str) -> str:
    """'PyPI' or the index's address without its scheme: where a candidate's wheels come from."""
    return (
        "PyPI"
        if url.rstrip("/") in ("https://pypi.org/simple", "https://pypi.org/simple/")
        else url.split("://", 1)[-1]
    )


def impossible_json(err: ResolutionImpossible) -> dict[str, object]:
    return {
        "ok": False,
        "error": {
            "reference": err.reference,
            "message": err.message,
            "hint": err.hint,
            "causes": [cause_sentence(c) for c in err.causes],
        },
        "candidates": [candidate_json(c) for c in err.candidates],
    }


def choice_lines(choice: Choice, *, packages: bool = False) -> list[str]:
    """Human form: what was chosen and why, and every candidate with its reason; ``packages``: the
    choice was made with the packages (``explain --packages``)."""
    t = choice.torch
    lines = [f"spec {choice.spec.name}: Python {choice.python} on {choice.base}, {choice.platform}"]
    if choice.gpus:
        lines.append(
            "targets: "
            + ", ".join(
                f"{g.name} (sm_{g.cc.replace('.', '')}"
                + (f", driver >= R{g.min_driver}" if g.min_driver else "")
                + (f", <= R{g.max_driver}" if g.max_driver else "")
                + ")"
                for g in choice.gpus
            )
        )
    lines += [f"note: {n}" for n in choice.notes]
    if t is None:
        lines.append("no torch in this spec")
        return lines
    v = t.variant
    lines.append(
        f"torch {t.release.version} {v.name}"
        + (
            f": CUDA {v.cuda}, cuDNN {v.cudnn or '-'}, NCCL {v.nccl or '-'}"
            if v.cuda
            else " (CPU build)"
        )
    )
    if v.cuda:
        lines.append(f"arch list: {' '.join(v.arch_list)}")
        lines.append(f"driver floor: {t.min_driver} ({choice.driver_policy})")
    lines += newer_lines(choice)
    lines.append(f"candidates of torch {t.release.version}:")
    for c in t.candidates:
        mark = "*" if c.preferred else ("+" if c.ok else "-")
        lines.append(
            f"  {mark} {c.variant:<7} {candidate_reason(c)}"
            + (f" [{_index_name(c.index)}]" if c.index else "")
        )
    lines.append("(* chosen: PyPI's build when it fits, else the newest CUDA that fits)")
    if packages:
        lines += passed_over_lines(choice) or [
            f"torch {t.release.version} is the newest release that fits, and the "
            "packages the spec names accept it"
        ]
        lines += from_source_lines(choice)
    elif (note := packages_note(choice)) is not None:
        lines.append(f"note: {note}")
    return lines


def newer_lines(choice: Choice) -> list[str]:
    """Why the releases within ``[torch].version`` newer than the chosen one were passed over, runs
    of releases with the same reason on one line (``2.8.0 to 2.15.0: ...``); the range as envspec
    reads it (``"2.9"`` is ``==2.9.*``)."""
    t, torch = choice.torch, choice.spec.torch
    if t is None or torch is None:
        return []
    wanted = torch.version
    head = (
        f'releases in [torch].version "{wanted}": torch {t.release.version} is the newest that fits'
    )
    if not t.newer:
        return [head]
    runs: list[tuple[list[str], str]] = []
    for version, causes in t.newer:
        why = release_reason(causes, choice)
        if runs and runs[-1][1] == why:
            runs[-1][0].append(version)
        else:
            runs.append(([version], why))
    lines = [head + "; newer ones passed over:"]
    for versions, why in runs:
        span = versions[0] if len(versions) == 1 else f"{versions[-1]} to {versions[0]}"
        lines.append(f"  - {span}: {why}")
    return lines


def release_reason(causes: list[Cause], choice: Choice) -> str:
    """Why no build of one release fits, in a few words: the GPU kernels, the driver, Python."""
    if any(isinstance(c, ReleaseNeedsReview) for c in causes):
        return "needs review in the compatibility DB (`envspec db show`)"
    if py := next((c for c in causes if isinstance(c, PythonUnsupported)), None):
        return f"no wheels for Python {py.python}"
    missing = [c for c in causes if isinstance(c, ArchMissing)]
    arch = sorted({f"{c.gpu} ({_sm(c.cc)})" for c in missing})
    lacking = {c.build for c in missing}
    # the driver floors of the builds that have the GPUs' kernels (all builds where none lacks them)
    floors = [c for c in causes if isinstance(c, DriverTooOld) and c.build not in lacking]

    def lowest(cs: list[DriverTooOld]) -> str:
        return min(
            (c.needed for c in cs), key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v))
        )

    if arch and not floors:
        return f"no build has kernels for {', '.join(arch)}"
    if arch:
        return (
            f"the builds with kernels for {', '.join(arch)} need driver >= {lowest(floors)}, "
            f"above {floors[0].driver}"
        )
    if floors:
        return f"every build needs driver >= {lowest(floors)}, above {floors[0].driver}"
    return "; ".join(_sentence(c) for c in causes) or "no build fits"


def driver_assumed_lines(lock: Lockfile | None) -> list[str]:
    """A lock whose spec set no [target].driver (``[hardware].driver_assumed``): the floor it assumed
    of the hosts, one note per platform, as `lock`, `build` and `build --dry-run` say it."""
    if lock is None:
        return []
    return [
        f"note: {p.name + ': ' if lock.multi else ''}the spec sets no [target].driver: the lock assumes the "
        f"hosts run driver >= {p.hardware.driver_floor} (what torch {p.torch.version if p.torch else ''} "
        f"{p.torch.variant if p.torch else ''} needs; [hardware].driver_assumed); set [target].driver to "
        "their oldest driver if older"
        for p in lock.parts
        if p.hardware.driver_assumed
    ]


def impossible_lines(err: ResolutionImpossible) -> list[str]:
    lines = [err.message + ":"]
    lines += ["  - " + cause_sentence(c) for c in err.causes if not isinstance(c, Suggestion)]
    sugg = [c.text for c in err.causes if isinstance(c, Suggestion)]
    if sugg:
        lines.append("what would fit:")
        lines += ["  " + s for s in sugg]
    return lines


# ---------------------------------------------------------------------------------------
# the DB as one page (`envspec db show --html FILE`)


def db_matrix(db: CompatDB) -> dict[str, object]:
    """The GPU x torch x CUDA-variant matrix, as plain data for templates/db_matrix.html.j2: for each
    CUDA build of each release (newest first) and each GPU (with its product line, architecture and
    last driver branch), whether a kernel of the build runs on it
    (and which), and the driver floor under each policy (the CUDA runtime's, raised to the GPU's first
    branch), each cell pointing at its build's sources. Sorted, no timestamps: the page is a function
    of the DB."""
    from packaging.version import Version

    from envspec.compat.load import LINES

    gpus = [_gpu_column(i, g) for i, g in enumerate(db.gpus)]
    builds = []
    for rel in sorted(db.torch_releases, key=lambda r: Version(r.version), reverse=True):
        for v in rel.variants.values():
            tk = db.cuda_toolkit(v.cuda) if v.cuda else None
            if tk is not None:
                builds.append(_build_row(db, rel.version, v, tk, [str(g["id"]) for g in gpus]))
    return {
        "db_version": db.version,
        "date": db.date,
        "gpus": gpus,
        "builds": builds,
        "lines": LINES,
    }


def _gpu_column(i: int, g: Gpu) -> dict[str, object]:
    """A GPU's column of the matrix: its facts and their sources."""
    return {
        "id": f"g{i}",
        "name": g.name,
        "short": g.short,
        "cc": g.cc,
        "min_driver": g.min_driver,
        "max_driver": g.max_driver,
        "line": g.line,
        "architecture": g.architecture,
        "host_arch": " ".join(g.host_arch),
        "sources": [
            s
            for s in (
                g.source,
                g.min_driver_source,
                g.max_driver_source,
                g.driver_note,
                g.torch_note,
                g.host_arch_source,
            )
            if s
        ],
    }


def _build_row(
    db: CompatDB, version: str, v: Variant, tk: CudaToolkit, gpu_ids: list[str]
) -> dict[str, object]:
    """A CUDA build's row: for each GPU whether a kernel of it runs there (and which), and the
    driver floor under each policy (the CUDA runtime's, raised to the GPU's first branch)."""
    from packaging.version import Version

    def floor(a: str, b: str) -> str:
        return a if not b or Version(a) >= Version(b) else b

    cells = []
    for g, gid in zip(db.gpus, gpu_ids):
        arch = best_arch(g.cc, v.arch_list)
        cells.append(
            {
                "gpu": gid,
                "runs": bool(arch),
                "arch": arch,
                "compat": floor(tk.driver_compat, g.min_driver),
                "strict": floor(tk.driver_strict, g.min_driver),
                "estimated": "driver_strict" in tk.estimated,
            }
        )
    return {
        "id": f"b-{version}-{v.name}".replace(".", "_"),
        "torch": version,
        "variant": v.name,
        "cuda": v.cuda,
        "cudnn": v.cudnn or "",
        "nccl": v.nccl or "",
        "pypi": v.pypi,
        "index": v.index,
        "arch_list": " ".join(v.arch_list),
        "cells": cells,
        "sources": [f"build: {v.source}", f"CUDA {tk.version}: {tk.source}"],
    }


_URL = r"https?://[^\s,;()]+[^\s,;().]"  # compiled by re on first use: db --html, not explain


def _linkify(text: str) -> Markup:
    """Escaped text with its http(s) addresses as links."""
    from markupsafe import Markup, escape

    out, last = [], 0
    for m in re.finditer(_URL, text):
        out.append(str(escape(text[last : m.start()])))
        url = str(escape(m.group(0)))
        out.append(f'<a href="{url}">{url}</a>')
        last = m.end()
    out.append(str(escape(text[last:])))
    return Markup("".join(out))


def db_html(db: CompatDB) -> str:
    """One self-contained HTML page of the DB (no server, no external assets): the matrix of
    ``db_matrix``, filterable by GPU and driver (also from ``?gpu=H100&driver=535.104.05``)."""
    import jinja2  # only here: `explain` itself stays light to import

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).resolve().parent / "templates")),
        undefined=jinja2.StrictUndefined,
        autoescape=True,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["linkify"] = _linkify
    return env.get_template("db_matrix.html.j2").render(**db_matrix(db))
