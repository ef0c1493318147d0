"""The Debian part of envspec: the closure at lock time (``resolve_closure``), the .debs and
the root filesystem at build time (``fetch_deb``/``fetch_debs``, ``make_rootfs``).
See docs/debian.md."""

from .closure import resolve_closure, security_mirror_for
from .fetch import SNAPSHOT_ENV, candidate_urls, fetch_deb, fetch_debs, mirror_list
from .models import (CANONICAL_MIRROR, SUITES, DebPin, base_packages, glibc_version,
                     python_full_version, sorted_pins, suite_for_python)
from .reporter import DebianReporter, RecordingReporter
from .rootfs import make_rootfs

__all__ = [
    "CANONICAL_MIRROR", "SNAPSHOT_ENV", "SUITES", "DebPin", "DebianReporter", "RecordingReporter",
    "base_packages", "candidate_urls", "fetch_deb", "fetch_debs", "glibc_version", "make_rootfs",
    "mirror_list", "python_full_version", "resolve_closure", "security_mirror_for", "sorted_pins",
    "suite_for_python",
]
