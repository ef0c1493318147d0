"""The Debian closure of a choice, through apt (``envspec.debian``): what the spec asks for
(``debian_request``) and its pins (``resolve_debian``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from envspec import debian  # a lazy package: its modules load on first use
from envspec.causes import (
    UnknownDebianPackage,
)
from envspec.errors import ResolutionImpossible
from envspec.resolve.failures import _debian_where
from envspec.resolve.model import Choice

if TYPE_CHECKING:  # imported where used: `choose` (explain) needs neither the network nor the host
    from envspec.debian.models import DebPin
    from envspec.sources import ResolvedSources

# ---------------------------------------------------------------------------------------
# the Debian closure, through apt (envspec.debian)


def debian_request(choice: Choice) -> list[str]:
    spec = choice.spec
    if choice.suite is None:
        raise ValueError(
            'a lock without a Debian base ([system].base = "none") asks for no Debian packages'
        )
    services = {
        k
        for k in ("jupyter", "ssh")
        if getattr(spec.services, k) and getattr(spec.services, k).enabled
    }
    # torch.compile needs a compiler at run time: Triton builds a C helper (gcc + Python headers) on
    # GPUs, Inductor emits C++ (g++) on CPUs; torch itself links libstdc++. A spec can opt out.
    compiler = spec.system.compiler if spec.system.compiler is not None else spec.torch is not None
    base = set(debian.base_packages(choice.suite, gpu=compiler, services=services))
    if spec.torch is not None:
        base.add("libstdc++6")
        if compiler:
            base.add("g++")
    return sorted(base | set(spec.system.packages))


def resolve_debian(
    choice: Choice, sources: ResolvedSources, *, cache_dir: Path
) -> tuple[list[DebPin], list[str]]:
    if choice.suite is None:
        return [], []
    requested = debian_request(choice)
    try:
        pins = debian.resolve_closure(
            choice.suite,
            requested,
            cache_dir=cache_dir,
            archive=debian.DebianArchive(
                mirror=sources.debian_mirror,
                security_mirror=sources.debian_security_mirror,
                architecture=choice.debian_arch,
            ),
        )
    except ResolutionImpossible as e:  # an unknown package the spec names: its key and line
        wanted = choice.spec.system.packages
        e.causes = [
            replace(c, where=_debian_where(choice.spec, wanted.index(c.name)))
            if isinstance(c, UnknownDebianPackage) and c.name in wanted
            else c
            for c in e.causes
        ]
        raise
    return pins, requested
