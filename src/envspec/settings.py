"""Every ``ENVSPEC_*`` environment variable envspec reads on the host, in one place: its name, its
type, its default and its meaning (``VARIABLES``), and ``read(env)``, which parses them all once into
a frozen ``Settings``. No other module reads an ``ENVSPEC_*`` variable (tests/unit/test_settings.py
fails when one does); they take a ``Settings`` or call ``read()``.

The verifier, which runs inside images and imports nothing else from envspec, reads the few it
needs in ``envspec/verify/settings.py``. docs/usage.md's list of variables is generated from both
tables: ``python -m envspec.settings`` prints it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from envspec.errors import UsageError

OFF = ("0", "off", "no", "false")
DEBIAN_SNAPSHOT = "ENVSPEC_DEBIAN_SNAPSHOT"  # also set by `envspec build` from the spec's [sources]


@dataclass(frozen=True)
class Var:
    """One variable: its name, what it takes, its default (as written in the environment; "" for
    none), and what it does."""

    name: str
    kind: Literal["path", "on/off", "number", "text", "list", "reference"]
    default: str
    meaning: str
    group: str  # "storage", "build", "sources", "lock", "image"


VARIABLES: tuple[Var, ...] = (
    # where things are
    Var(
        "ENVSPEC_CACHE",
        "path",
        "$XDG_CACHE_HOME/envspec, else ~/.cache/envspec",
        "envspec's cache: wheels, .debs, layer tars, index reads, the checked compat DB",
        "storage",
    ),
    Var(
        "ENVSPEC_STORAGE_ROOT",
        "path",
        "",
        "a containers-storage root of envspec's own (its graph root); unset: podman's and buildah's "
        "default store. `envspec run` must see the same value as the build",
        "storage",
    ),
    Var(
        "ENVSPEC_STORAGE_RUNROOT",
        "path",
        "a short path named by a hash of the storage root",
        "the run root for ENVSPEC_STORAGE_ROOT (podman refuses run roots over 50 characters)",
        "storage",
    ),
    Var(
        "ENVSPEC_STORAGE_DRIVER",
        "text",
        "overlay where the kernel has it, else vfs",
        "the containers-storage driver for ENVSPEC_STORAGE_ROOT (or over buildah's)",
        "storage",
    ),
    Var(
        "ENVSPEC_SCRATCH",
        "path",
        "/dev/shm",
        "where the throw-away root filesystem of a build's Debian layer is laid down (a tmpfs)",
        "storage",
    ),
    # the tools
    Var(
        "ENVSPEC_CONTAINERS_STORAGE",
        "path",
        "containers-storage on PATH",
        "the containers-storage tool the layer importer uses",
        "build",
    ),
    Var(
        "ENVSPEC_PUT_LAYER",
        "path",
        "envspec-put-layer beside this Python, else on PATH",
        "envspec's own layer import tool (image/putlayer); empty or off: none",
        "build",
    ),
    Var(
        "ENVSPEC_RUNTIME",
        "text",
        "runc where crun is absent or the cgroup hierarchy is v1 or hybrid, else podman's",
        "the OCI runtime `envspec run` and the build ask podman for",
        "build",
    ),
    Var(
        "ENVSPEC_IMPORT",
        "text",
        "containers-storage's tool (and envspec-put-layer) as root",
        "skopeo: import layers with skopeo instead",
        "build",
    ),
    Var(
        "ENVSPEC_STAGED_IMPORT",
        "on/off",
        "on",
        "off: no staged import (envspec-put-layer stage and commit) on the overlay driver",
        "build",
    ),
    Var("ENVSPEC_STAGE_NICE", "number", "10", "the niceness of the layer stager", "build"),
    Var(
        "ENVSPEC_STAGE_PIPE",
        "on/off",
        "on",
        "off: each layer's stager reads its tar from the file, not through a FIFO from its maker",
        "build",
    ),
    Var(
        "ENVSPEC_SPREAD_STAGING",
        "on/off",
        "on",
        "off: the store's staging area (overlay/envspec-staging) is not given ext4's top-directory "
        "flag, so staged layers are placed beside it, not spread over the block groups "
        "(envspec-put-layer reads it too)",
        "build",
    ),
    Var(
        "ENVSPEC_LAYER_TREES",
        "text",
        "on",
        "where the store stages: on: the wheel layers' makers make their files in the staging area "
        "(but torch's stack's, which are untarred); all: those too; off: none",
        "build",
    ),
    Var(
        "ENVSPEC_MAKER_NICE",
        "number",
        "0",
        "added to the niceness of the first layer maker of a build",
        "build",
    ),
    Var(
        "ENVSPEC_MAKER_NICE_OTHERS",
        "number",
        "10",
        "the other layer makers' niceness above the first one's",
        "build",
    ),
    Var(
        "ENVSPEC_DIRECT_WRITE",
        "on/off",
        "on",
        "off: layer files are never written with O_DIRECT (past the page cache)",
        "build",
    ),
    Var(
        "ENVSPEC_CACHE_STREAM",
        "on/off",
        "on",
        "off: a build never streams the registry cache's layers into the store",
        "build",
    ),
    Var(
        "ENVSPEC_KEEP_PULLED",
        "on/off",
        "off",
        "on: the layers a build took from a registry cache into the local layer cache stay there "
        "(for a later push or output from this machine); off: once the image is in the store "
        "they are dropped, so a node keeps what `podman pull` keeps",
        "build",
    ),
    Var(
        "ENVSPEC_BACKGROUND_COMPRESS",
        "on/off",
        "on",
        "off: no `envspec cache compress` in the background after a build that kept its layers "
        "uncompressed",
        "build",
    ),
    Var(
        "ENVSPEC_CACHE_FROM",
        "reference",
        "the spec's [sources] cache_from",
        'the registry cache to take layers from (HOST[:PORT]/REPO; "": none); --cache-from wins',
        "build",
    ),
    Var(
        "ENVSPEC_CACHE_TO",
        "reference",
        "the spec's [sources] cache_to",
        'the registry cache to push made layers to ("": none); --cache-to wins',
        "build",
    ),
    # where packages come from
    Var(
        "ENVSPEC_MIRRORS",
        "list",
        "",
        "Python package mirrors (whitespace- or comma-separated), tried after the spec's "
        "[sources].mirrors and before pip's configuration",
        "sources",
    ),
    Var(
        "ENVSPEC_DEBIAN_MIRROR",
        "reference",
        "the spec's [sources].debian_mirror",
        "a Debian mirror tried for pinned .debs",
        "sources",
    ),
    Var(
        "ENVSPEC_DEBIAN_SNAPSHOT",
        "reference",
        "the spec's [sources].debian_snapshot",
        "a Debian snapshot mirror tried first for pinned .debs gone from the current archive",
        "sources",
    ),
    Var(
        "ENVSPEC_OFFLINE",
        "on/off",
        "",
        "set (any value): envspec reaches no network address; file:// mirrors still work",
        "sources",
    ),
    # read inside images (passed by `envspec run`; set in the image's config)
    Var(
        "ENVSPEC_SERVICES",
        "list",
        "all without a command, none with one",
        "the services the image's entrypoint starts (jupyter, ssh; all)",
        "image",
    ),
    Var(
        "ENVSPEC_AUTHORIZED_KEYS",
        "text",
        "",
        "SSH public keys the image's sshd accepts, added to the spec's",
        "image",
    ),
)

BY_NAME = {v.name: v for v in VARIABLES}


@dataclass(frozen=True)
class Settings:
    """The host-side variables, parsed. ``None``: the variable is not set (where that differs from
    set and empty)."""

    cache: Path
    storage_root: str
    storage_runroot: str
    storage_driver: str
    scratch: Path
    containers_storage: str
    put_layer: str | None
    runtime: str
    import_with: str
    staged_import: bool
    stage_nice: int
    stage_pipe: bool
    spread_staging: bool
    layer_trees: str
    maker_nice: int
    maker_nice_others: int
    direct_write: bool
    cache_stream: bool
    keep_pulled: bool
    background_compress: bool
    cache_from: str | None
    cache_to: str | None
    mirrors: str
    debian_mirror: str
    debian_snapshot: str
    offline: bool


def _on(env: Mapping[str, str], name: str, default: bool = True) -> bool:
    v = env.get(name)
    if v is None:
        return default
    return v.strip().lower() not in OFF


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "") or BY_NAME[name].default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(
            f"{name}={raw!r} is not a whole number",
            hint=f"e.g. {name}={BY_NAME[name].default}",
            reference="bad-setting",
        ) from None


def cache_dir_for(env: Mapping[str, str]) -> Path:
    """envspec's cache: ``ENVSPEC_CACHE``, else ``$XDG_CACHE_HOME/envspec``, else ``~/.cache/envspec``."""
    if env.get("ENVSPEC_CACHE"):
        return Path(env["ENVSPEC_CACHE"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "envspec"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".cache" / "envspec"


def read(env: Mapping[str, str] | None = None) -> Settings:
    """Every host-side variable of ``env`` (default: this process's environment), parsed."""
    env = os.environ if env is None else env
    return Settings(
        cache=cache_dir_for(env),
        storage_root=env.get("ENVSPEC_STORAGE_ROOT", ""),
        storage_runroot=env.get("ENVSPEC_STORAGE_RUNROOT", ""),
        storage_driver=env.get("ENVSPEC_STORAGE_DRIVER", ""),
        scratch=Path(env.get("ENVSPEC_SCRATCH", "/dev/shm")),
        containers_storage=env.get("ENVSPEC_CONTAINERS_STORAGE", ""),
        put_layer=env.get("ENVSPEC_PUT_LAYER"),
        runtime=env.get("ENVSPEC_RUNTIME", ""),
        import_with=env.get("ENVSPEC_IMPORT", ""),
        staged_import=env.get("ENVSPEC_STAGED_IMPORT") != "off",
        stage_nice=_int(env, "ENVSPEC_STAGE_NICE"),
        stage_pipe=_on(env, "ENVSPEC_STAGE_PIPE"),
        spread_staging=_on(env, "ENVSPEC_SPREAD_STAGING"),
        layer_trees=env.get("ENVSPEC_LAYER_TREES", "on"),
        maker_nice=_int(env, "ENVSPEC_MAKER_NICE"),
        maker_nice_others=_int(env, "ENVSPEC_MAKER_NICE_OTHERS"),
        direct_write=_on(env, "ENVSPEC_DIRECT_WRITE"),
        cache_stream=_on(env, "ENVSPEC_CACHE_STREAM"),
        keep_pulled=_on(env, "ENVSPEC_KEEP_PULLED", default=False),
        background_compress=_on(env, "ENVSPEC_BACKGROUND_COMPRESS"),
        cache_from=env.get("ENVSPEC_CACHE_FROM"),
        cache_to=env.get("ENVSPEC_CACHE_TO"),
        mirrors=env.get("ENVSPEC_MIRRORS", ""),
        debian_mirror=env.get("ENVSPEC_DEBIAN_MIRROR", ""),
        debian_snapshot=env.get("ENVSPEC_DEBIAN_SNAPSHOT", ""),
        offline=bool(env.get("ENVSPEC_OFFLINE")),
    )


def markdown() -> str:
    """The list of variables for docs/usage.md (host side, then the verifier's)."""
    from envspec.verify import settings as vsettings

    out = ["| variable | takes | default | what it does |", "| --- | --- | --- | --- |"]
    for v in VARIABLES:
        out.append(f"| `{v.name}` | {v.kind} | {v.default or '(unset)'} | {v.meaning} |")
    out += [
        "",
        "Read by the verifier (`envspec/verify/settings.py`), in images and on hosts:",
        "",
        "| variable | takes | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    for name, kind, default, meaning in vsettings.VARIABLES:
        out.append(f"| `{name}` | {kind} | {default or '(unset)'} | {meaning} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
