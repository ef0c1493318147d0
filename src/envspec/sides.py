"""The sides of a conflict over torch (issue 57, point 4): which of the fitting torch releases each
package the spec names installs beside, found by asking the resolver one small question at a time.

uv explains a failed resolution from the first path it tried: with ``vllm>=0.17`` and
``xformers==0.0.33.post2`` it names xformers alone, and a hint built from that (``[torch].version =
"2.9.*"``) is one vllm rules out. Here each package is asked alone: "its newest release beside which
torch?", then again without that torch, so its side is the releases it accepts, newest first. Two
sides with no release in common are the conflict, named with both; a package that installs beside
no fitting torch is asked on other Pythons, where the spec's Python is what rules it out.

Nothing here runs uv: ``Ask`` does (``resolve.with_packages`` hands it in). Nothing here words
anything: the sides are ``causes.TorchSide`` facts that ``explain`` words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from envspec.causes import TorchSide

# (requirement, the torch releases allowed, the Python or "" for the spec's) -> the torch release
# the resolver chose beside the requirement's newest possible release; None where none installs
Ask = Callable[[str, Sequence[str], str], str | None]

SHOWN = 4  # releases asked per side before its older ones are only asked where they decide


@dataclass(frozen=True)
class Sides:
    """What was found: each named package's side, and the releases every side accepts among those
    the narrowest complete side has (empty: no torch release installs them all)."""

    sides: tuple[TorchSide, ...]
    common: tuple[str, ...]
    decided: bool  # False where no side was asked to its end: the common releases are not known


def side(requirement: str, fitting: Sequence[str], ask: Ask, *, shown: int = SHOWN) -> TorchSide:
    """The fitting releases (newest first) ``requirement`` installs beside, at most ``shown`` of
    them (``more``: older ones not asked)."""
    left = list(fitting)
    took: list[str] = []
    while left and len(took) < shown:
        got = ask(requirement, left, "")
        if got is None or got not in left:
            return TorchSide(requirement=requirement, releases=tuple(took))
        took.append(got)
        left.remove(got)
    return TorchSide(requirement=requirement, releases=tuple(took), more=bool(left))


def find(named: Sequence[str], fitting: Sequence[str], ask: Ask) -> Sides:
    """Each named package's side, and the releases they all accept, judged on the releases of the
    narrowest side asked to its end: each other side is asked those it has not shown. One package
    alone: the question already failed, its side is empty."""
    if len(named) == 1:
        return Sides((TorchSide(requirement=named[0], releases=()),), (), True)
    sides = [side(r, fitting, ask) for r in named]
    complete = [s for s in sides if not s.more]
    if not complete:
        return Sides(tuple(sides), (), False)
    narrow = min(complete, key=lambda s: len(s.releases))
    common = []
    for release in narrow.releases:
        if all(
            release in s.releases or (s.more and ask(s.requirement, [release], "") == release)
            for s in sides
            if s is not narrow
        ):
            common.append(release)
    return Sides(tuple(sides), tuple(common), True)


def python_for(
    requirement: str, in_range: Sequence[str], others: Sequence[str], ask: Ask
) -> str | None:
    """The first Python of ``others`` (nearest the spec's first, ``resolve`` orders them) on which
    ``requirement`` installs beside a torch of ``in_range``; None where it does on none."""
    return next((p for p in others if ask(requirement, in_range, p) is not None), None)
