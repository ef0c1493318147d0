"""Events the Debian stages report. The core never prints: the CLI turns these into progress
bars and warnings, tests record them. Every hook is a no-op here, except ``warning``, which
goes to the ``envspec.debian`` logger."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .models import DebPin

log = logging.getLogger("envspec.debian")


class DebianReporter:
    def index_fresh(self, suite: str, age_s: float) -> None:
        """The cached indexes are young enough; no download."""

    def index_updating(self, suite: str) -> None:
        """`apt-get update` is about to run."""

    def index_updated(self, suite: str, seconds: float) -> None:
        """`apt-get update` and the index rebuild finished."""

    def warning(self, message: str) -> None:
        """Something the user should know that does not stop the stage (stale indexes...).

        The default goes to the ``envspec.debian`` logger, so a caller that passes no reporter
        does not lose it."""
        log.warning("%s", message)

    def command(self, argv: list[str]) -> None:
        """An external command is about to run (logged for -v)."""

    def fetching(self, pin: DebPin, url: str) -> None:
        """A .deb download starts."""

    def fetched(self, pin: DebPin, path: Path, cached: bool) -> None:
        """A .deb is in the cache and checked (cached=True: no download was needed)."""

    def unpacking(self, pin: DebPin) -> None:
        """A .deb's data is being laid into the root filesystem."""

    def fixup(self, what: str) -> None:
        """make_rootfs did one of the things maintainer scripts would have done."""


class RecordingReporter(DebianReporter):
    """Keeps every event as (hook name, args) for tests."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[object, ...]]] = []

    def names(self) -> list[str]:
        return [e[0] for e in self.events]


def _recorder(hook: str) -> Callable[..., None]:
    def record(self: RecordingReporter, *args: object) -> None:
        self.events.append((hook, args))

    return record


for _hook in [n for n, v in vars(DebianReporter).items() if callable(v) and not n.startswith("_")]:
    setattr(RecordingReporter, _hook, _recorder(_hook))
