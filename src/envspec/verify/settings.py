"""The ``ENVSPEC_*`` variables the verifier reads, in one place (it runs inside images and imports
nothing else from envspec, so it does not share ``envspec/settings.py``). docs/usage.md lists them
with the host's (``python -m envspec.settings``)."""

from __future__ import annotations

import os
from collections.abc import Mapping

LOCK = "ENVSPEC_LOCK"
VERIFY = "ENVSPEC_VERIFY"
PLATFORM = "ENVSPEC_PLATFORM"
IMAGE_DIGEST = "ENVSPEC_IMAGE_DIGEST"
FAKE_ROOT = "ENVSPEC_FAKE_ROOT"
FAKE_FINGERPRINT = "ENVSPEC_FAKE_FINGERPRINT"
FAKE_FINGERPRINT_TASK = "ENVSPEC_FAKE_FINGERPRINT_TASK"
RESULT_DIR = "ENVSPEC_VERIFY_RESULT_DIR"

# (name, what it takes, default, what it does)
VARIABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        LOCK,
        "path",
        "the image's lock (/opt/envspec/envspec.lock)",
        "the lock `envspec verify` checks the machine against; --lock wins",
    ),
    (
        VERIFY,
        "text",
        "warn",
        "the image's start-up check: off, warn (report and go on) or strict (stop on a failure or a warning)",
    ),
    (
        PLATFORM,
        "text",
        "this machine's",
        "the platform section of a multi-platform lock a host-mode verify reads (linux-x86_64, linux-aarch64)",
    ),
    (IMAGE_DIGEST, "text", "", "the image's digest, set in the image: the fingerprint's image"),
    (
        FAKE_ROOT,
        "path",
        "/",
        "test hook: /proc, /dev, /sys and NVML are read under this directory; every report says so",
    ),
    (
        FAKE_FINGERPRINT,
        "text",
        "",
        "test hook: key=value pairs (or JSON) that replace this rank's fingerprint entries",
    ),
    (
        FAKE_FINGERPRINT_TASK,
        "number",
        "",
        "test hook: only the Slurm task of this SLURM_PROCID fakes its fingerprint",
    ),
    (
        RESULT_DIR,
        "path",
        "",
        "set by the multi-node launcher: where each rank leaves its exit code",
    ),
)


def get(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The raw value of one of ``VARIABLES`` (None where unset)."""
    assert any(v[0] == name for v in VARIABLES), name
    return (os.environ if env is None else env).get(name)
