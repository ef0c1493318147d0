"""The plan stage: ``Lockfile`` -> ``BuildPlan`` (ordered layers, each with its pins and content key).

Pure: no I/O. Layers are ordered by stability (what changes least goes lowest), so a change
high up rebuilds little:

==========  ===========================================================================
 base       Debian rootfs from ``[[debian.packages]]`` + the venv skeleton at ``[platform].venv``
 cuda       wheels of group "cuda" (NVIDIA libraries)
 torch      wheels of group "torch" (torch, triton, their dependencies)
 deps       wheels of group "deps"
 team       wheels of group "team" (the spec's own packages)
 source     the wheels built from their sdists (``[wheels.source]``, any group), keyed by their
            derivations: a team change does not build them again, and a registry cache shares them
 envspec    the verifier, the lock, the SBOM, the entrypoint (tiny; cached once keyed by what
            it is made of besides the lock: ``keyed_top``)
==========  ===========================================================================

A layer's *content key* is the sha256 of the canonical JSON of (layer kind, maker version, the
sorted hashes of its pins, the platform fields its maker reads). Equal keys mean byte-identical
layer tars, which is what lets two locks that share a torch variant share layers. A wheel
layer's key (and the base layer's, with Debian packages, and the envspec layer's) also names
its byte-compiled Python (``"pyc"``: the recipe, the invalidation mode and the image's exact
CPython, which compiles them; ``"none"`` when the build makes none,
``make_plan(lock, bytecode=False)``), so a layer without .pyc is never taken for one with.
A group with no pins makes no layer (except ``base`` and ``envspec``, always present).

The plan carries the lock itself and the lock's own pins (``lock.Wheel``, ``DebPin``): the
build reads nothing else.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from envspec.debian.models import DebPin
from envspec.errors import PlanError
from envspec.lock import WHEEL_GROUPS, Lockfile, Platform, Wheel, dumps

# Bump a kind's maker version whenever its maker's output bytes change for the same pins.
MAKER_VERSIONS: dict[str, str] = {
    "base": "2",  # 2: .pyc of the Debian Python modules
    "cuda": "2",  # 2: .pyc files (envspec.image.bytecode)
    "torch": "2",
    "deps": "2",
    "team": "2",
    "source": "1",
    "envspec": "2",  # 2: .pyc of the verifier
}
LAYER_ORDER: tuple[str, ...] = ("base", *WHEEL_GROUPS, "source", "envspec")

# The layers' .pyc recipe (envspec.image.bytecode): bump its number when the bytes made for
# the same source by the same compiler change.
BYTECODE_RECIPE = "pyc-1 unchecked-hash opt0"

LOCK_PATH_IN_IMAGE = "/opt/envspec/envspec.lock"
SBOM_PATH_IN_IMAGE = "/opt/envspec/sbom.spdx.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Layer:
    """One layer to make: its group (one of ``LAYER_ORDER``), content key and the pins it holds."""

    group: str
    key: str  # "sha256:<hex>" content key
    wheels: tuple[Wheel, ...] = ()
    debs: tuple[DebPin, ...] = ()
    cacheable: bool = True

    @property
    def pins(self) -> tuple[Wheel | DebPin, ...]:
        return self.debs + self.wheels

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "key": self.key,
            "cacheable": self.cacheable,
            "pins": [f"{p.name}=={p.version}" for p in self.pins],
        }


@dataclass(frozen=True)
class BuildPlan:
    lock: Lockfile
    layers: tuple[Layer, ...]
    lock_text: str = field(repr=False)  # the canonical lock text the image carries
    bytecode: bool = True  # the layers carry .pyc (their keys say so)

    @property
    def platform(self) -> Platform:
        return self.lock.platform

    @property
    def tag(self) -> str:
        """The image's default name in containers-storage."""
        return self.lock.image_tag

    def layer(self, group: str) -> Layer:
        found = next((lay for lay in self.layers if lay.group == group), None)
        if found is None:
            raise KeyError(f"the plan has no {group} layer")
        return found

    @property
    def wheels(self) -> tuple[Wheel, ...]:
        return tuple(w for lay in self.layers for w in lay.wheels)

    @property
    def debs(self) -> tuple[DebPin, ...]:
        return tuple(d for lay in self.layers for d in lay.debs)

    def to_json(self) -> dict[str, object]:
        """A stable summary (golden-file friendly)."""
        return {"image": self.tag, "layers": [lay.to_json() for lay in self.layers]}


def _key(kind: str, payload: dict[str, object]) -> str:
    body = json.dumps(
        {"kind": kind, "maker": MAKER_VERSIONS[kind], **payload},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def _problems(lock: Lockfile) -> list[str]:
    """Why the lock cannot be built (it can still be a valid lock: a host-only lock verifies)."""
    problems: list[str] = []
    if lock.platform.base == "none":
        problems.append('[platform].base is "none": a host-only lock can be verified but not built')
    if not lock.platform.venv.startswith("/"):
        problems.append(f"[platform].venv: {lock.platform.venv!r} is not an absolute path")
    seen: set[str] = set()
    for i, w in enumerate(lock.wheels):
        if w.group not in WHEEL_GROUPS:
            problems.append(
                f"wheels[{i}].group: {w.group!r} is not one of {', '.join(WHEEL_GROUPS)}"
            )
        if not _SHA256.match(w.sha256):
            problems.append(
                f"wheels[{i}].sha256: {w.filename} has no sha256 (the build fetches only known bytes)"
            )
        if not w.filename.endswith(".whl") and w.source is None:
            problems.append(
                f"wheels[{i}].filename: {w.filename!r} is not a wheel, and the lock gives no build inputs "
                "for it ([wheels.source])"
            )
        if w.filename in seen:
            problems.append(f"wheels: {w.filename} is listed twice")
        seen.add(w.filename)
    return problems


def make_plan(lock: Lockfile, *, bytecode: bool = True) -> BuildPlan:
    """Order the lock's pins into layers and give each a content key. Raises ``PlanError``
    listing every problem (a lock that cannot be built: no base, wheels without hashes, ...).
    ``bytecode``: the layers carry .pyc (the wheels', the Debian Python modules', the verifier's;
    the build turns it off where no interpreter of the image's version can compile them)."""
    problems = _problems(lock)
    if problems:
        raise PlanError(
            "the lock cannot be built:\n" + "\n".join(f"  - {m}" for m in problems),
            hint="re-create it with `envspec lock`",
        )
    platform = lock.platform
    pyc = (
        f"{BYTECODE_RECIPE} cpython-{platform.python_full}"
        if bytecode and platform.python_full
        else "none"
    )
    layers = [_base_layer(lock, pyc), *_wheel_layers(lock, pyc)]
    layers.append(
        Layer(
            group="envspec",
            key=_key(
                "envspec",
                {
                    "lock": lock.meta.content_hash,
                    "venv": platform.venv,
                    "python": platform.python,
                    "pyc": pyc,
                },
            ),
            cacheable=False,
        )
    )
    return BuildPlan(lock=lock, layers=tuple(layers), lock_text=dumps(lock), bytecode=pyc != "none")


def keyed_top(plan: BuildPlan, inputs: str) -> BuildPlan:
    """The plan with its envspec layer cacheable like the others (issue 59, point 3): keyed also
    by ``inputs``, the digest of what that layer is made of besides the lock (the verifier's and
    envspec's own sources, the authorized-keys file: ``image.layers.envspec_layer_inputs``), so a
    node that pulls every layer from a registry cache makes none; ``inputs`` "": as it is."""
    if not inputs:
        return plan
    layers = tuple(
        Layer(
            group=lay.group,
            key="sha256:" + hashlib.sha256(f"{lay.key}\n{inputs}".encode()).hexdigest(),
            cacheable=True,
        )
        if lay.group == "envspec"
        else lay
        for lay in plan.layers
    )
    return BuildPlan(
        lock=plan.lock, layers=layers, lock_text=plan.lock_text, bytecode=plan.bytecode
    )


def _base_layer(lock: Lockfile, pyc: str) -> Layer:
    """The Debian root file system, the venv skeleton and the user: keyed by the .debs and what
    the skeleton is made of."""
    platform, rt = lock.platform, lock.runtime
    debs = tuple(
        sorted(
            lock.debian.packages if lock.debian else (),
            key=lambda d: (d.name, d.version, d.architecture, d.filename),
        )
    )
    return Layer(
        group="base",
        key=_key(
            "base",
            {
                "debs": [d.sha256 for d in debs],
                "venv": platform.venv,
                "python": platform.python,
                "python_full": platform.python_full,
                "arch": platform.arch,
                "user": rt.user,
                "uid": rt.uid,
                "workdir": rt.workdir,
                "pyc": pyc if debs else "none",
            },
        ),
        debs=debs,
    )


def _wheel_layers(lock: Lockfile, pyc: str) -> list[Layer]:
    """A layer per wheel group that has wheels, keyed by their sha256s; then the wheels built
    from sdists, keyed by what they are built from (the derivations' keys), not the sdists alone."""
    platform = lock.platform
    where = {"venv": platform.venv, "python": platform.python, "arch": platform.arch, "pyc": pyc}
    layers = []
    for group in WHEEL_GROUPS:
        pins = tuple(
            sorted(
                (w for w in lock.wheels if w.group == group and not w.built),
                key=lambda w: (w.name, w.version, w.filename),
            )
        )
        if pins:
            layers.append(
                Layer(
                    group=group,
                    key=_key(group, {"wheels": sorted(w.sha256 for w in pins), **where}),
                    wheels=pins,
                )
            )
    built = tuple(
        sorted((w for w in lock.wheels if w.built), key=lambda w: (w.name, w.version, w.filename))
    )
    if built:
        derivations = sorted(w.source.key for w in built if w.source is not None)
        layers.append(
            Layer(
                group="source",
                key=_key("source", {"derivations": derivations, **where}),
                wheels=built,
            )
        )
    return layers


def cache_entries(
    lock: Lockfile, top: Callable[[BuildPlan], BuildPlan] | None = None
) -> list[tuple[str, str]]:
    """(kind, name) of every cache entry the lock's images are made from: its wheels' and .debs'
    sha256 and its plan's cacheable layer keys (hex); of a multi-platform lock, what each
    platform's image needs. What ``envspec cache gc`` keeps for the lock (``cache.gc.Needed``);
    a host-mode lock (``[runtime] mode = "host"``) has no image, so no layers. ``top``: the plan
    with its envspec layer keyed as a build keys it (``keyed_top``), so that layer is kept too."""
    if lock.multi:
        return [e for view in lock.views() for e in cache_entries(view, top)]
    out = [("wheel", w.sha256) for w in lock.wheels]
    out += [
        ("wheel", b.sha256)
        for w in lock.wheels
        if w.source is not None
        for b in (*w.source.build, *w.source.toolkit)
    ]
    out += [("built", w.source.key.split(":", 1)[-1]) for w in lock.wheels if w.source is not None]
    out += [("deb", d.sha256) for d in (lock.debian.packages if lock.debian else ())]
    try:
        plan = make_plan(lock)
    except PlanError:
        return out
    plan = top(plan) if top is not None else plan
    return out + [("layer", lay.key.split(":", 1)[-1]) for lay in plan.layers if lay.cacheable]
