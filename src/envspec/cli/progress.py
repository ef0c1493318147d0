"""`envspec build`'s progress bars (rich) for the build's events: the core only reports events
(``image.Reporter``). Imported by the build command when it builds, not when the command line
starts (rich and the image stage are not loaded for `envspec explain`)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from envspec.cli.common import console
from envspec.image import LayerInfo, Reporter

SOURCE_WORDS = {
    "made": "made",
    "local": "from the local cache",
    "registry": "from the registry cache",
    "store": "in the store already",
}


class BuildProgress:
    """The bars and lines of one build (``quiet``: warnings only); ``reporter`` gets the events."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.con = console(stderr=True)
        self.reporter = _Events(self)
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> BuildProgress:
        if not self.quiet:
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.con,
                transient=True,
            )
            self.progress.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.progress is not None:
            self.progress.__exit__(kind, exc, tb)

    def task(self, kind: str) -> None:
        """One more file to fetch on the ``kind`` bar."""
        if self.progress is None:
            return
        if kind not in self.tasks:
            self.tasks[kind] = self.progress.add_task("fetching files", total=0)
        self.progress.update(
            self.tasks[kind], total=(self.progress.tasks[self.tasks[kind]].total or 0) + 1
        )

    def sent(self, desc: str, sent: int) -> None:
        """One bar per layer on its way into containers-storage (its size is known only once
        it is made, so the bar counts bytes)."""
        if self.progress is None:
            return
        with self.lock:  # layers go into the store from several threads at once
            if desc not in self.tasks:
                self.tasks[desc] = self.progress.add_task(desc, total=None)
        self.progress.update(self.tasks[desc], description=f"{desc} {sent / 1e6:,.0f} MB")

    def done(self, kind: str) -> None:
        if self.progress is not None and kind in self.tasks:
            self.progress.advance(self.tasks[kind])

    def line(self, text: str) -> None:
        if not self.quiet:
            (self.progress.console if self.progress else self.con).print(text, markup=False)

    def warn(self, message: str) -> None:  # printed even with --quiet
        (self.progress.console if self.progress else self.con).print(
            f"warning: {message}", markup=False
        )


class _Events(Reporter):
    """The build's events, as bars and lines of ``out``."""

    def __init__(self, out: BuildProgress) -> None:
        self.out = out

    def fetching(self, name: str, filename: str, size: int) -> None:
        self.out.task("fetch")

    def fetched(self, name: str, filename: str, path: Path) -> None:
        self.out.done("fetch")

    def layer_started(self, group: str, pins: int, cached: bool) -> None:
        self.out.line(
            f"layer {group}: building ({pins} pins)" if pins else f"layer {group}: building"
        )

    def layer_built(self, layer: LayerInfo) -> None:
        self.out.line(
            f"layer {layer.group:<8} {layer.digest[:19]}  {layer.size / 1e6:9.1f} MB"
            f"  {SOURCE_WORDS.get(layer.source, layer.source)}"
        )

    def importing(self, group: str, sent: int) -> None:
        self.out.sent(f"into containers-storage: {group}", sent)

    def committing(self, ref: str, digest: str) -> None:
        self.out.line(f"tagging {ref} ({digest[:19]})")

    def pushed(self, dest: str, digest: str) -> None:
        self.out.line(f"pushed {dest}@{digest}")

    def source_building(self, name: str, version: str) -> None:
        self.out.line(
            f"building {name} {version} from its sdist (in the lock's Debian base, no network)"
        )

    def source_progress(self, name: str, version: str, step: str) -> None:
        self.out.line(f"  {name}: {step}")

    def source_built(
        self, name: str, version: str, wheel: str, seconds: float, cached: bool
    ) -> None:
        self.out.line(
            f"built {wheel}" + (" (cached: same inputs)" if cached else f" in {seconds:.1f} s")
        )

    def warning(self, message: str) -> None:
        self.out.warn(message)
