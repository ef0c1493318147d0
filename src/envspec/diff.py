"""``envspec diff OLD.lock NEW.lock``: what changed between two locks, as a reviewer reads it.

Pure: two locks in, a ``LockDiff`` out. ``diff_lines`` words it for a terminal or a pull
request comment, ``LockDiff.to_json`` gives the same facts to machines. Nothing here prints.

What a reviewer wants first is what changes on the GPU hosts (torch, its CUDA variant, cuDNN,
NCCL, the driver floor, the compiled arch list), then the package changes, then what the
change costs (which image layers are rebuilt and re-pushed). Layers come from the build plan
(``envspec.plan.make_plan``): a layer whose content key is unchanged is byte-identical and
is neither rebuilt nor pushed. Where the plan cannot be made (a host-only lock that cannot be
built), the layer view falls back to the wheels' ``group`` fields and says so.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from debian.debian_support import version_compare
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from envspec.debian.models import DebPin
from envspec.errors import PlanError
from envspec.lock import Lockfile, Wheel, load, short_hash
from envspec.plan import LAYER_ORDER, make_plan

ChangeKind = Literal["added", "removed", "upgraded", "downgraded", "rebuilt"]


@dataclass(frozen=True)
class PackageChange:
    """One wheel or Debian package that differs. ``rebuilt``: same version, other file or hash."""

    name: str
    change: ChangeKind
    old: str = ""  # version in the old lock ("" when added)
    new: str = ""  # version in the new lock ("" when removed)
    group: str = ""  # wheel layer group, or Debian architecture
    size_delta: int = 0  # bytes, new size - old size (0 when unknown)
    # a wheel built from its sdist ([wheels.source]): "built from source" (the new pin, or the one
    # added or removed), "now built from its sdist", "now a wheel, was built from its sdist",
    # "same sdist, other build inputs"; "" for the rest
    source: str = ""


@dataclass(frozen=True)
class FieldChange:
    """A scalar field of the lock that differs, by its lockfile path (``torch.variant``)."""

    path: str
    old: object  # as the lockfile writes it: a string, number, list or table
    new: object


@dataclass(frozen=True)
class LayerChange:
    group: str
    change: Literal["same", "changed", "added", "removed"]
    old_key: str = ""
    new_key: str = ""
    pins_changed: int = 0  # pins of this layer added, removed or changed
    push_bytes: int = 0  # compressed size of the new layer's pins when changed (0 = unknown)


@dataclass(frozen=True)
class LockDiff:
    old_name: str
    new_name: str
    old_hash: str
    new_hash: str
    fields: tuple[FieldChange, ...] = ()
    archs_added: tuple[str, ...] = ()
    archs_removed: tuple[str, ...] = ()
    gpus_added: tuple[str, ...] = ()
    gpus_removed: tuple[str, ...] = ()
    wheels: tuple[PackageChange, ...] = ()
    debs: tuple[PackageChange, ...] = ()
    layers: tuple[LayerChange, ...] = ()
    layers_from: Literal["plan", "groups"] = "plan"
    notes: tuple[str, ...] = ()
    # two locks of which one has a section per platform: the diff of each platform both have (the
    # fields above stay empty), and the platforms only one of them has
    platforms: tuple[tuple[str, LockDiff], ...] = ()
    platforms_added: tuple[str, ...] = ()
    platforms_removed: tuple[str, ...] = ()

    @property
    def per_platform(self) -> bool:
        return bool(self.platforms or self.platforms_added or self.platforms_removed)

    @property
    def identical(self) -> bool:
        """True when the two locks describe the same image (every platform's, for multi-platform locks)."""
        if self.per_platform:
            return (
                self.old_hash == self.new_hash
                and not (self.platforms_added or self.platforms_removed)
                and all(d.identical for _, d in self.platforms)
            )
        return self.old_hash == self.new_hash and not (
            self.fields or self.wheels or self.debs or self.archs_added or self.archs_removed
        )

    def field(self, path: str) -> FieldChange | None:
        return next((f for f in self.fields if f.path == path), None)

    def to_json(self) -> dict[str, object]:
        def counts(changes: tuple[PackageChange, ...]) -> dict[str, int]:
            return {
                k: sum(1 for c in changes if c.change == k)
                for k in ("added", "removed", "upgraded", "downgraded", "rebuilt")
            }

        if self.per_platform:
            return {
                "old": {"name": self.old_name, "content_hash": self.old_hash},
                "new": {"name": self.new_name, "content_hash": self.new_hash},
                "identical": self.identical,
                "platforms": {name: d.to_json() for name, d in self.platforms},
                "platforms_added": list(self.platforms_added),
                "platforms_removed": list(self.platforms_removed),
                "notes": list(self.notes),
            }
        return {
            "old": {"name": self.old_name, "content_hash": self.old_hash},
            "new": {"name": self.new_name, "content_hash": self.new_hash},
            "identical": self.identical,
            "fields": [{"path": f.path, "old": f.old, "new": f.new} for f in self.fields],
            "arch_list": {"added": list(self.archs_added), "removed": list(self.archs_removed)},
            "gpus": {"added": list(self.gpus_added), "removed": list(self.gpus_removed)},
            "wheels": {"counts": counts(self.wheels), "changes": [asdict(c) for c in self.wheels]},
            "debs": {"counts": counts(self.debs), "changes": [asdict(c) for c in self.debs]},
            "layers": {"from": self.layers_from, "layers": [asdict(lay) for lay in self.layers]},
            "notes": list(self.notes),
        }


# --- versions ----------------------------------------------------------------------------------


def _pep440_cmp(a: str, b: str) -> int:
    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return (a > b) - (a < b)
    return (va > vb) - (va < vb)


def deb_version_cmp(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian version ``a`` sorts before, with or after ``b`` (dpkg's rules, deb-version(7),
    as python-debian implements them)."""
    r = version_compare(a, b)
    return (r > 0) - (r < 0)


# --- packages ----------------------------------------------------------------------------------

Pin = Wheel | DebPin


def _pin_change(
    name: str, x: Pin, y: Pin, c: int, group_of: Callable[[Pin], str]
) -> PackageChange | None:
    """How pin ``x`` became ``y`` (``c``: their versions compared), None where nothing changed."""
    delta = y.size - x.size
    note = _source_note(x, y)
    if c < 0:
        return PackageChange(name, "upgraded", x.version, y.version, group_of(y), delta, note)
    if c > 0:
        return PackageChange(name, "downgraded", x.version, y.version, group_of(y), delta, note)
    if (x.sha256, x.filename) != (y.sha256, y.filename) or _source_key(x) != _source_key(y):
        return PackageChange(name, "rebuilt", x.version, y.version, group_of(y), delta, note)
    if group_of(x) != group_of(y):
        moved = f"{group_of(x)} -> {group_of(y)}"
        return PackageChange(name, "rebuilt", x.version, y.version, moved, delta, note)
    return None


def _package_changes(
    old: Sequence[Pin],
    new: Sequence[Pin],
    key: Callable[[Pin], tuple[str, ...]],
    cmp: Callable[[str, str], int],
    group_of: Callable[[Pin], str],
) -> tuple[PackageChange, ...]:
    def index(pkgs: Sequence[Pin]) -> dict[tuple[str, ...], list[Pin]]:
        out: dict[tuple[str, ...], list[Pin]] = {}
        for p in pkgs:
            out.setdefault(key(p), []).append(p)
        return out

    a, b = index(old), index(new)

    def version_order(p: Pin, q: Pin) -> int:
        return cmp(p.version, q.version)

    by_version = functools.cmp_to_key(version_order)
    changes: list[PackageChange] = []
    for k in sorted(set(a) | set(b)):
        pa, pb = a.get(k, []), b.get(k, [])
        name = k[0]
        if not pa:
            changes += [
                PackageChange(
                    name, "added", "", p.version, group_of(p), p.size, _source_note(None, p)
                )
                for p in pb
            ]
            continue
        if not pb:
            changes += [
                PackageChange(
                    name, "removed", p.version, "", group_of(p), -p.size, _source_note(p, None)
                )
                for p in pa
            ]
            continue
        # one pin per key is the norm; several (a wheel twice) compare the newest of each side
        x, y = max(pa, key=by_version), max(pb, key=by_version)
        change = _pin_change(name, x, y, cmp(x.version, y.version), group_of)
        if change is not None:
            changes.append(change)
    return tuple(changes)


def _source_key(p: Pin) -> str:
    """The derivation key of a wheel built from its sdist; "" for any other pin."""
    return p.source.key if isinstance(p, Wheel) and p.source is not None else ""


def _source_note(old: Pin | None, new: Pin | None) -> str:
    """What ``PackageChange.source`` says of a wheel built from its sdist."""
    a, b = old is not None and bool(_source_key(old)), new is not None and bool(_source_key(new))
    if old is None or new is None:
        return "built from source" if (a or b) else ""
    if b and not a:
        return "now built from its sdist"
    if a and not b:
        return "now a wheel, was built from its sdist"
    if a and b and old.sha256 == new.sha256 and _source_key(old) != _source_key(new):
        return "same sdist, other build inputs"
    return "built from source" if b else ""


def _wheel_group(p: Pin) -> str:
    return p.group if isinstance(p, Wheel) else ""


def _deb_arch(p: Pin) -> str:
    return p.architecture if isinstance(p, DebPin) else ""


# --- scalar fields -----------------------------------------------------------------------------

# The lockfile paths compared as scalars, in the order a reviewer reads them.
_FIELDS: tuple[str, ...] = (
    "torch.version",
    "torch.local",
    "torch.variant",
    "torch.cuda",
    "torch.cudnn",
    "torch.nccl",
    "torch.index",
    "hardware.driver_floor",
    "hardware.driver_policy",
    "hardware.compute_capabilities",
    "platform.python",
    "platform.python_full",
    "platform.python_tag",
    "platform.platform_tag",
    "platform.base",
    "platform.arch",
    "platform.venv",
    "debian.suite",
    "debian.mirror",
    "debian.requested",
    "runtime.tf32",
    "runtime.matmul_precision",
    "runtime.shm_size",
    "runtime.env",
    "runtime.ulimits",
    "runtime.user",
    "runtime.uid",
    "runtime.workdir",
    "services.jupyter",
    "services.ssh",
    "meta.name",
    "meta.db_version",
    "meta.envspec",
    "meta.spec_hash",
)
_ABSENT = "(absent)"


def _get_path(lock: Lockfile, path: str) -> object:
    """The value at a lockfile path as the lockfile writes it (tables as dicts), or ``_ABSENT``."""
    table, _, key = path.partition(".")
    v = getattr(getattr(lock, table), key, None)
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json", exclude_none=True)
    return _ABSENT if v is None else v


def _field_changes(a: Lockfile, b: Lockfile) -> tuple[FieldChange, ...]:
    out = []
    for path in _FIELDS:
        x, y = _get_path(a, path), _get_path(b, path)
        if x != y:
            out.append(FieldChange(path, x, y))
    return tuple(out)


# --- layers ------------------------------------------------------------------------------------


def _layers_from_plan(a: Lockfile, b: Lockfile) -> tuple[LayerChange, ...]:
    pa, pb = make_plan(a), make_plan(b)
    old = {lay.group: lay for lay in pa.layers}
    new = {lay.group: lay for lay in pb.layers}
    order = [lay.group for lay in pb.layers] + [g for g in old if g not in new]
    out = []
    for g in order:
        x, y = old.get(g), new.get(g)
        if x is None:
            assert y is not None
            out.append(LayerChange(g, "added", "", y.key, len(y.pins), _size(y.pins)))
        elif y is None:
            out.append(LayerChange(g, "removed", x.key, "", len(x.pins), 0))
        elif x.key == y.key:
            out.append(LayerChange(g, "same", x.key, y.key))
        else:
            ox = {(p.name, p.version, p.sha256) for p in x.pins}
            oy = {(p.name, p.version, p.sha256) for p in y.pins}
            n = len({k[0] for k in ox ^ oy})
            out.append(LayerChange(g, "changed", x.key, y.key, n, _size(y.pins)))
    return tuple(out)


def _size(pins: Sequence[Pin]) -> int:
    sizes = [p.size for p in pins]
    return sum(sizes) if sizes and all(sizes) else 0


def _layers_from_groups(
    a: Lockfile, b: Lockfile, wheels: tuple[PackageChange, ...], debs: tuple[PackageChange, ...]
) -> tuple[LayerChange, ...]:
    def groups(lock: Lockfile) -> set[str]:
        return {w.group for w in lock.wheels} | {"base", "envspec"}

    ga, gb = groups(a), groups(b)
    changed: dict[str, int] = {}
    for c in wheels:
        for g in c.group.split(" -> "):
            changed[g] = changed.get(g, 0) + 1
    base_changed = bool(debs) or any(
        _get_path(a, p) != _get_path(b, p)
        for p in (
            "platform.python",
            "platform.python_full",
            "platform.venv",
            "runtime.user",
            "runtime.workdir",
        )
    )
    out = []
    for g in LAYER_ORDER:
        if g not in ga and g not in gb:
            continue
        if g not in ga:
            out.append(LayerChange(g, "added", pins_changed=changed.get(g, 0)))
        elif g not in gb:
            out.append(LayerChange(g, "removed", pins_changed=changed.get(g, 0)))
        elif g == "base":
            out.append(
                LayerChange(g, "changed" if base_changed else "same", pins_changed=len(debs))
            )
        elif g == "envspec":
            same = _get_path(a, "meta.content_hash") == _get_path(b, "meta.content_hash")
            out.append(LayerChange(g, "same" if same else "changed"))
        else:
            out.append(
                LayerChange(
                    g, "changed" if changed.get(g) else "same", pins_changed=changed.get(g, 0)
                )
            )
    return tuple(out)


# --- entry point -------------------------------------------------------------------------------


def diff_locks(old: Lockfile, new: Lockfile) -> LockDiff:
    """Compare two locks; where either has a section per platform, platform by platform (each
    platform's view against the other's, ``Lockfile.for_platform``)."""
    if old.multi or new.multi:
        return _diff_per_platform(old, new)
    return _diff_one(old, new)


def _diff_per_platform(old: Lockfile, new: Lockfile) -> LockDiff:
    names_old, names_new = old.platform_names, new.platform_names
    both = [n for n in names_new if n in names_old]
    return LockDiff(
        old_name=old.meta.name,
        new_name=new.meta.name,
        old_hash=old.meta.content_hash,
        new_hash=new.meta.content_hash,
        platforms=tuple((n, _diff_one(old.for_platform(n), new.for_platform(n))) for n in both),
        platforms_added=tuple(n for n in names_new if n not in names_old),
        platforms_removed=tuple(n for n in names_old if n not in names_new),
    )


def _diff_one(old: Lockfile, new: Lockfile) -> LockDiff:
    """Compare two one-platform locks."""
    a, b = old, new
    arch_a, arch_b = a.hardware.arch_list, b.hardware.arch_list
    gpu_a, gpu_b = a.hardware.gpus, b.hardware.gpus
    wheels = _package_changes(
        a.wheels, b.wheels, key=lambda p: (p.name,), cmp=_pep440_cmp, group_of=_wheel_group
    )
    debs = _package_changes(
        a.debian.packages if a.debian else [],
        b.debian.packages if b.debian else [],
        key=lambda p: (p.name, _deb_arch(p)),
        cmp=deb_version_cmp,
        group_of=_deb_arch,
    )
    notes: list[str] = []
    layers_from: Literal["plan", "groups"] = "plan"
    try:
        layers = _layers_from_plan(a, b)
    except PlanError as e:  # a lock that cannot be built (base "none", missing hashes)
        layers_from = "groups"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        notes.append(
            f"no build plan ({first}): layer changes are estimated from the wheels' groups"
        )
        layers = _layers_from_groups(a, b, wheels, debs)
    return LockDiff(
        old_name=a.meta.name,
        new_name=b.meta.name,
        old_hash=a.meta.content_hash,
        new_hash=b.meta.content_hash,
        fields=_field_changes(a, b),
        archs_added=tuple(x for x in arch_b if x not in arch_a),
        archs_removed=tuple(x for x in arch_a if x not in arch_b),
        gpus_added=tuple(x for x in gpu_b if x not in gpu_a),
        gpus_removed=tuple(x for x in gpu_a if x not in gpu_b),
        wheels=wheels,
        debs=debs,
        layers=layers,
        layers_from=layers_from,
        notes=tuple(notes),
    )


def diff_files(old_path: str | Path, new_path: str | Path) -> LockDiff:
    """``diff_locks`` on two lockfiles read with ``envspec.lock.load`` (raises ``LockError``)."""
    return diff_locks(load(old_path), load(new_path))


# --- words -------------------------------------------------------------------------------------


def _short(h: str) -> str:
    return short_hash(h) if h else "?"


def _mb(n: int) -> str:
    if n <= 0:
        return ""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def _fmt(v: object) -> str:
    if v == _ABSENT or v == "" or v is None:
        return "(none)" if v != _ABSENT else "(absent)"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_fmt(x)}" for k, x in v.items()) + "}" if v else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", v):
        return "sha256:" + v[7:19]
    return str(v)


def _driver_tuple(v: object) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(v).split("."))
    except ValueError:
        return ()


_HEADLINE = (  # (label, path) of what a GPU host cares about, in this order: what changes the platform first
    ("CPU architecture", "platform.arch"),
    ("wheel platform", "platform.platform_tag"),
    ("base", "platform.base"),
    ("torch", "torch.version"),
    ("torch build", "torch.local"),
    ("CUDA variant", "torch.variant"),
    ("CUDA", "torch.cuda"),
    ("cuDNN", "torch.cudnn"),
    ("NCCL", "torch.nccl"),
    ("torch index", "torch.index"),
    ("driver floor", "hardware.driver_floor"),
    ("driver policy", "hardware.driver_policy"),
    ("compute capabilities", "hardware.compute_capabilities"),
    ("python", "platform.python"),
    ("python (full)", "platform.python_full"),
)


def diff_lines(d: LockDiff) -> list[str]:
    """The diff in words, one line each (no markup), for a terminal or a review comment; of
    multi-platform locks, a block per platform."""
    if d.per_platform:
        return _per_platform_lines(d)
    return _one_lines(d)


def _per_platform_lines(d: LockDiff) -> list[str]:
    lines = [f"{d.old_name} {_short(d.old_hash)} -> {d.new_name} {_short(d.new_hash)}"]
    if d.identical:
        lines.append("the locks are identical: same images, nothing to rebuild")
        return lines
    for n in d.platforms_added:
        lines.append(f"platform added: {n} (a new image in the index)")
    for n in d.platforms_removed:
        lines.append(f"platform removed: {n} (its image leaves the index)")
    for name, sub in d.platforms:
        lines += ["", f"== {name} =="]
        if sub.identical:
            lines.append(
                "  no changes: the same pins (only its copy of the lock, in the envspec layer, differs)"
            )
            continue
        lines += [("  " + line) if line else "" for line in _one_lines(sub)[1:]]
    return lines


def _arch_swaps(changes: Sequence[PackageChange]) -> dict[tuple[str, str], list[str]]:
    """The Debian packages removed for one architecture and added at the same version for another
    (an x86_64 lock against an aarch64 one): {(old arch, new arch): names}."""
    gone = {(c.name, c.old): c.group for c in changes if c.change == "removed"}
    out: dict[tuple[str, str], list[str]] = {}
    for c in changes:
        was = gone.get((c.name, c.new)) if c.change == "added" else None
        if was and c.group and was != c.group:
            out.setdefault((was, c.group), []).append(c.name)
    return out


def _one_lines(d: LockDiff) -> list[str]:
    lines = [f"{d.old_name} {_short(d.old_hash)} -> {d.new_name} {_short(d.new_hash)}"]
    if d.identical:
        lines.append("the locks are identical: same image, nothing to rebuild")
        return lines
    lines += _stack_lines(d)
    for title, changes in (("Python wheels", d.wheels), ("Debian packages", d.debs)):
        if changes:
            lines += _package_lines(title, changes)
    headline = {p for _, p in _HEADLINE}
    rest = [f for f in d.fields if f.path not in headline]
    if rest:
        lines += ["", "Other fields:"]
        for f in rest:
            lines.append(f"  {f.path}: {_fmt(f.old)} -> {_fmt(f.new)}")
    lines += _layer_lines(d)
    for note in d.notes:
        lines.append(f"note: {note}")
    return lines


def _stack_lines(d: LockDiff) -> list[str]:
    """The GPU stack and platform: the headline fields, the arch list, the target GPUs."""
    lines: list[str] = []
    shown = False
    for label, path in _HEADLINE:
        f = d.field(path)
        if f is None:
            continue
        if not shown:
            lines += ["", "GPU stack and platform:"]
            shown = True
        line = f"  {label + ':':<22}{_fmt(f.old)} -> {_fmt(f.new)}"
        if path == "hardware.driver_floor":
            o, n = _driver_tuple(f.old), _driver_tuple(f.new)
            if o and n and n > o:
                line += "  (raised: hosts with drivers older than this can no longer run the image)"
            elif o and n and n < o:
                line += "  (lowered: runs on more hosts)"
        lines.append(line)
    if d.archs_added or d.archs_removed or d.gpus_added or d.gpus_removed:
        if not shown:
            lines += ["", "GPU stack and platform:"]
            shown = True
        if d.archs_added:
            lines.append(f"  {'arch list added:':<22}{', '.join(d.archs_added)}")
        if d.archs_removed:
            lines.append(
                f"  {'arch list removed:':<22}{', '.join(d.archs_removed)}"
                "  (GPUs that needed these now rely on the others, or PTX, or fail)"
            )
        if d.gpus_added:
            lines.append(f"  {'target GPUs added:':<22}{', '.join(d.gpus_added)}")
        if d.gpus_removed:
            lines.append(f"  {'target GPUs removed:':<22}{', '.join(d.gpus_removed)}")

    return lines


def _package_lines(title: str, changes: Sequence[PackageChange]) -> list[str]:
    """The changes of one kind of package, counted, then a line each (Debian packages built for
    another architecture at the same versions: one line)."""
    lines: list[str] = []
    counts = {
        k: sum(1 for c in changes if c.change == k)
        for k in ("added", "removed", "upgraded", "downgraded", "rebuilt")
    }
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    lines += ["", f"{title} ({summary}):"]
    swapped = _arch_swaps(changes) if title == "Debian packages" else {}
    for (was, now), names in swapped.items():  # one line, not a - and a + for each package
        lines.append(
            f"  = {len(names)} packages at the same versions, built for {now} instead of {was}"
        )
    moved = {n for names in swapped.values() for n in names}
    for c in changes:
        if c.name in moved and c.change in ("added", "removed"):
            continue
        lines.append(_change_line(c))
    return lines


def _change_line(c: PackageChange) -> str:
    mark = {"added": "+", "removed": "-", "upgraded": "^", "downgraded": "v", "rebuilt": "~"}[
        c.change
    ]
    if c.change == "added":
        what = c.new
    elif c.change == "removed":
        what = c.old
    elif c.change == "rebuilt":
        what = (
            f"{c.new} ({c.source})"
            if c.source and c.source != "built from source"
            else f"{c.new} (same version, other file)"
        )
    else:
        what = f"{c.old} -> {c.new}"
    if c.source == "built from source" or (c.source and c.change != "rebuilt"):
        what += f" ({c.source})"
    where = f"  [{c.group}]" if c.group else ""
    return f"  {mark} {c.name} {what}{where}"


def _layer_lines(d: LockDiff) -> list[str]:
    """The image's layers: unchanged, rebuilt (how many packages differ, what to push), new, gone."""
    lines: list[str] = []
    if d.layers:
        src = "build plan" if d.layers_from == "plan" else "wheel groups, estimated"
        lines += ["", f"Image layers ({src}):"]
        for lay in d.layers:
            if lay.change == "same":
                lines.append(f"  {lay.group:<8} unchanged (cached, not pushed)")
                continue
            what = {"changed": "rebuilt", "added": "new layer", "removed": "gone"}[lay.change]
            extra = []
            if lay.pins_changed:
                extra.append(
                    f"{lay.pins_changed} package{'s differ' if lay.pins_changed != 1 else ' differs'}"
                )
            if lay.push_bytes:
                extra.append(f"~{_mb(lay.push_bytes)} to push")
            if lay.old_key or lay.new_key:
                extra.append(
                    f"key {_short(lay.old_key) if lay.old_key else '-'} -> "
                    f"{_short(lay.new_key) if lay.new_key else '-'}"
                )
            lines.append(f"  {lay.group:<8} {what}" + (f": {'; '.join(extra)}" if extra else ""))
    return lines
