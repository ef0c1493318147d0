"""The resolve stage: ``EnvSpec`` + ``CompatDB`` (+ package indexes) -> ``Resolution``.

Two steps. ``choose`` is pure and offline (``envspec explain`` uses it alone): it picks the torch
release and CUDA variant and keeps every candidate's reason. ``resolve`` then chooses torch with
the packages the spec names, asks uv's resolver for the Python closure and apt for the Debian
closure. The core raises facts (``ResolutionImpossible`` with structured causes); ``explain.py``
words them.

One module per step: ``model`` (what the stage hands on), ``torch`` (the pure choice), ``uv`` (uv
runs), ``failures`` (uv's failures as facts), ``candidates`` (a package as its pin), ``sdists``,
``held`` (held-back releases), ``packages`` (torch with the packages, the Python closure),
``debian``, ``stage`` (the steps in order). This file only says what the stage gives.
"""

from envspec.resolve.debian import debian_request, resolve_debian
from envspec.resolve.held import held_back
from envspec.resolve.model import (
    Choice,
    PassedOver,
    Resolution,
    SourceInputs,
    TorchChoice,
    WheelCandidate,
)
from envspec.resolve.packages import resolve_python, with_packages
from envspec.resolve.sdists import build_inputs, source_only
from envspec.resolve.stage import closure, resolve
from envspec.resolve.torch import choose, choose_all, driver_floor, fitting_releases

__all__ = [
    "Choice",
    "PassedOver",
    "Resolution",
    "SourceInputs",
    "TorchChoice",
    "WheelCandidate",
    "build_inputs",
    "choose",
    "choose_all",
    "closure",
    "debian_request",
    "driver_floor",
    "fitting_releases",
    "held_back",
    "resolve",
    "resolve_debian",
    "resolve_python",
    "source_only",
    "with_packages",
]
