"""The plan stage: ``Lockfile`` -> ``BuildPlan`` (ordered layers, each with its pins and content key).

Pure: no I/O. Layers are ordered by stability (what changes least goes lowest), so a change
high up rebuilds little:

==========  ===========================================================================
 base       Debian rootfs from ``[[debian.packages]]`` + the venv skeleton at ``[platform].venv``
 cuda       wheels of group "cuda" (NVIDIA libraries)
 torch      wheels of group "torch" (torch, triton, their dependencies)
 deps       wheels of group "deps"
 team       wheels of group "team" (the spec's own packages)
 envspec    the verifier, the lock, the SBOM, the entrypoint (always rebuilt: tiny)
==========  ===========================================================================

A layer's *content key* is the sha256 of the canonical JSON of (layer kind, maker version, the
sorted hashes of its pins, the platform fields its maker reads). Equal keys mean byte-identical
layer tars, which is what lets two locks that share a torch variant share layers.
A group with no pins makes no layer (except ``base`` and ``envspec``, always present).

The lock may be given as the lock stage's model (attributes or ``model_dump()``) or as the dict
``tomllib`` reads from a lockfile: this module reads the fields named in docs/lockfile.md only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from envspec.debian.models import DebPin  # the one model of a pinned .deb
from envspec.errors import PlanError

# Bump a kind's maker version whenever its maker's output bytes change for the same pins.
MAKER_VERSIONS: dict[str, str] = {
    "base": "1",
    "cuda": "1",
    "torch": "1",
    "deps": "1",
    "team": "1",
    "envspec": "1",
}
LAYER_ORDER: tuple[str, ...] = ("base", "cuda", "torch", "deps", "team", "envspec")
WHEEL_GROUPS: tuple[str, ...] = ("cuda", "torch", "deps", "team")

DEFAULT_UID = 1000  # the non-root user's uid/gid; the lock names the user, not its number
LOCK_PATH_IN_IMAGE = "/opt/envspec/envspec.lock"
SBOM_PATH_IN_IMAGE = "/opt/envspec/sbom.spdx.json"


@dataclass(frozen=True)
class WheelPin:
    name: str
    version: str
    filename: str
    index: str
    sha256: str
    size: int = 0
    group: str = "deps"


@dataclass(frozen=True)
class Platform:
    os: str = "linux"
    arch: str = "x86_64"
    python: str = "3.11"
    python_full: str = ""
    python_tag: str = ""
    platform_tag: str = ""
    venv: str = "/opt/venv"
    base: str = "debian:bookworm"

    @property
    def oci_arch(self) -> str:
        return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "amd64": "amd64"}.get(self.arch, self.arch)

    @property
    def site_packages(self) -> str:
        return f"{self.venv}/lib/python{self.python}/site-packages"


@dataclass(frozen=True)
class ImageFacts:
    """What the image config, labels and SBOM need from the lock besides the pins."""

    name: str
    content_hash: str
    spec_hash: str = ""
    db_version: str = ""
    envspec_version: str = ""
    gpus: tuple[str, ...] = ()
    arch_list: tuple[str, ...] = ()
    driver_floor: str = ""
    driver_policy: str = "compat"
    torch_version: str = ""
    torch_variant: str = ""
    cuda: str = ""
    cudnn: str = ""
    nccl: str = ""
    tf32: bool | None = None
    matmul_precision: str = ""
    shm_size: str = ""
    env: tuple[tuple[str, str], ...] = ()
    user: str = "envspec"
    uid: int = DEFAULT_UID
    workdir: str = "/workspace"
    debian_suite: str = ""
    debian_mirror: str = ""

    @property
    def short_hash(self) -> str:
        return self.content_hash.split(":", 1)[-1][:12]


@dataclass(frozen=True)
class LayerPlan:
    group: str  # one of LAYER_ORDER
    key: str  # "sha256:<hex>" content key
    wheels: tuple[WheelPin, ...] = ()
    debs: tuple[DebPin, ...] = ()
    cacheable: bool = True

    @property
    def pins(self) -> tuple[WheelPin | DebPin, ...]:
        return self.debs + self.wheels


@dataclass(frozen=True)
class BuildPlan:
    facts: ImageFacts
    platform: Platform
    layers: tuple[LayerPlan, ...]
    lock_text: str = field(repr=False, default="")
    default_tag: str = ""

    def layer(self, group: str) -> LayerPlan | None:
        return next((lay for lay in self.layers if lay.group == group), None)

    @property
    def wheels(self) -> tuple[WheelPin, ...]:
        return tuple(w for lay in self.layers for w in lay.wheels)

    @property
    def debs(self) -> tuple[DebPin, ...]:
        return tuple(d for lay in self.layers for d in lay.debs)

    def to_json(self) -> dict[str, Any]:
        """A stable summary (golden-file friendly)."""
        return {
            "image": self.default_tag,
            "layers": [
                {"group": lay.group, "key": lay.key, "cacheable": lay.cacheable,
                 "pins": [f"{p.name}=={p.version}" for p in lay.pins]}
                for lay in self.layers
            ],
        }


# --- reading the lock, whatever shape it comes in ------------------------------------------------

_MISSING = object()


def _get(obj: Any, key: str, default: Any = _MISSING) -> Any:
    if obj is None:
        return None if default is _MISSING else default
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
    elif hasattr(obj, key):
        return getattr(obj, key)
    if default is _MISSING:
        raise KeyError(key)
    return default


def _as_dict(lock: Any) -> Any:
    from envspec.lock import as_dict

    return as_dict(lock)


def lock_text_of(lock: Any) -> str:
    """The canonical lock text to bake into the image (the lock stage's own writer)."""
    from envspec import lock as lock_mod

    from pydantic import ValidationError

    try:
        model = lock if isinstance(lock, lock_mod.Lockfile) else lock_mod.Lockfile.model_validate(lock)
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()[:5])
        raise PlanError(f"the lock cannot be planned: {where}", hint="re-create it with `envspec lock`") from None
    return lock_mod.dumps(model)


def _sha(value: str) -> str:
    return value.split(":", 1)[1] if value.startswith("sha256:") else value


def _key(kind: str, payload: dict[str, Any]) -> str:
    body = json.dumps({"kind": kind, "maker": MAKER_VERSIONS[kind], **payload}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def _wheels(lock: Any, problems: list[str]) -> list[WheelPin]:
    out = []
    for i, w in enumerate(_get(lock, "wheels", []) or []):
        try:
            pin = WheelPin(
                name=str(_get(w, "name")), version=str(_get(w, "version")), filename=str(_get(w, "filename")),
                index=str(_get(w, "index", "") or ""), sha256=_sha(str(_get(w, "sha256"))),
                size=int(_get(w, "size", 0) or 0), group=str(_get(w, "group", "deps") or "deps"),
            )
        except KeyError as e:
            problems.append(f"wheels[{i}]: missing {e.args[0]!r}")
            continue
        if pin.group not in WHEEL_GROUPS:
            problems.append(f"wheels[{i}].group: {pin.group!r} is not one of {', '.join(WHEEL_GROUPS)}")
        if len(pin.sha256) != 64:
            problems.append(f"wheels[{i}].sha256: {pin.filename} has no sha256 (the build fetches only known bytes)")
        if not pin.filename.endswith(".whl"):
            problems.append(f"wheels[{i}].filename: {pin.filename!r} is not a wheel (sdists cannot be built reproducibly)")
        out.append(pin)
    return out


def _debs(lock: Any, problems: list[str]) -> list[DebPin]:
    deb = _get(lock, "debian", None)
    out = []
    for i, d in enumerate(_get(deb, "packages", []) or []):
        try:
            out.append(DebPin(
                name=str(_get(d, "name")), version=str(_get(d, "version")),
                architecture=str(_get(d, "architecture")), filename=str(_get(d, "filename")),
                size=int(_get(d, "size", 0) or 0), sha256=_sha(str(_get(d, "sha256"))),
                suite=str(_get(d, "suite", "") or ""),
            ))
        except KeyError as e:
            problems.append(f"debian.packages[{i}]: missing {e.args[0]!r}")
        except ValidationError as e:
            problems.append(f"debian.packages[{i}]: {e.errors()[0]['msg']}")
    return out


def _facts(lock: Any, platform: Platform) -> ImageFacts:
    meta = _get(lock, "meta", {})
    hw = _get(lock, "hardware", {}) or {}
    torch = _get(lock, "torch", None) or {}
    rt = _get(lock, "runtime", {}) or {}
    deb = _get(lock, "debian", None) or {}
    env = _get(rt, "env", {}) or {}
    tf32 = _get(rt, "tf32", None)
    return ImageFacts(
        name=str(_get(meta, "name")),
        content_hash=str(_get(meta, "content_hash")),
        spec_hash=str(_get(meta, "spec_hash", "") or ""),
        db_version=str(_get(meta, "db_version", "") or ""),
        envspec_version=str(_get(meta, "envspec", "") or ""),
        gpus=tuple(_get(hw, "gpus", []) or []),
        arch_list=tuple(_get(hw, "arch_list", []) or []),
        driver_floor=str(_get(hw, "driver_floor", "") or ""),
        driver_policy=str(_get(hw, "driver_policy", "compat") or "compat"),
        torch_version=str(_get(torch, "version", "") or ""),
        torch_variant=str(_get(torch, "variant", "") or ""),
        cuda=str(_get(torch, "cuda", "") or ""),
        cudnn=str(_get(torch, "cudnn", "") or ""),
        nccl=str(_get(torch, "nccl", "") or ""),
        tf32=None if tf32 is None else bool(tf32),
        matmul_precision=str(_get(rt, "matmul_precision", "") or ""),
        shm_size=str(_get(rt, "shm_size", "") or ""),
        env=tuple(sorted((str(k), str(v)) for k, v in dict(env).items())),
        user=str(_get(rt, "user", "envspec") or "envspec"),
        uid=int(_get(rt, "uid", DEFAULT_UID) or DEFAULT_UID),
        workdir=str(_get(rt, "workdir", "/workspace") or "/workspace"),
        debian_suite=str(_get(deb, "suite", "") or ""),
        debian_mirror=str(_get(deb, "mirror", "") or ""),
    )


def make_plan(lock: Any) -> BuildPlan:
    """Order the lock's pins into layers and give each a content key. Raises ``PlanError``
    listing every problem (a lock that cannot be built: no base, wheels without hashes, ...)."""
    text = lock_text_of(lock)
    data = _as_dict(lock)
    problems: list[str] = []
    try:
        p = _get(data, "platform")
        platform = Platform(
            os=str(_get(p, "os", "linux")), arch=str(_get(p, "arch", "x86_64")),
            python=str(_get(p, "python")), python_full=str(_get(p, "python_full", "") or ""),
            python_tag=str(_get(p, "python_tag", "") or ""), platform_tag=str(_get(p, "platform_tag", "") or ""),
            venv=str(_get(p, "venv", "/opt/venv")), base=str(_get(p, "base", "debian:bookworm")),
        )
        facts = _facts(data, platform)
    except KeyError as e:
        raise PlanError(f"the lock lacks {e.args[0]!r}; it cannot be planned",
                        hint="re-create it with `envspec lock`") from None
    if platform.base == "none":
        problems.append("[platform].base is \"none\": a host-only lock can be verified but not built")
    if not platform.venv.startswith("/"):
        problems.append(f"[platform].venv: {platform.venv!r} is not an absolute path")
    wheels = _wheels(data, problems)
    debs = _debs(data, problems)
    seen: dict[str, str] = {}
    for w in wheels:
        if w.filename in seen:
            problems.append(f"wheels: {w.filename} is listed twice")
        seen[w.filename] = w.group
    if problems:
        raise PlanError("the lock cannot be built:\n" + "\n".join(f"  - {m}" for m in problems),
                        hint="re-create it with `envspec lock`")

    layers: list[LayerPlan] = []
    debs_sorted = tuple(sorted(debs, key=lambda d: (d.name, d.version, d.architecture, d.filename)))
    layers.append(LayerPlan(
        group="base",
        key=_key("base", {
            "debs": [d.sha256 for d in debs_sorted],
            "venv": platform.venv, "python": platform.python, "python_full": platform.python_full,
            "arch": platform.arch, "user": facts.user, "uid": facts.uid, "workdir": facts.workdir,
        }),
        debs=debs_sorted,
    ))
    for group in WHEEL_GROUPS:
        pins = tuple(sorted((w for w in wheels if w.group == group), key=lambda w: (w.name, w.version, w.filename)))
        if not pins:
            continue
        layers.append(LayerPlan(
            group=group,
            key=_key(group, {
                "wheels": sorted(w.sha256 for w in pins),
                "venv": platform.venv, "python": platform.python, "arch": platform.arch,
            }),
            wheels=pins,
        ))
    layers.append(LayerPlan(
        group="envspec",
        key=_key("envspec", {"lock": facts.content_hash, "venv": platform.venv, "python": platform.python}),
        cacheable=False,
    ))
    tag = f"localhost/envspec/{facts.name}:{facts.short_hash}"
    return BuildPlan(facts=facts, platform=platform, layers=tuple(layers), lock_text=text, default_tag=tag)
