"""Import into containers-storage while the layers are still being made.

The import (untarring every layer into the store) costs about as much as making the layers, so
it runs beside them: a thread takes the layers in image order and feeds each one's finished tar
file to ``envspec-put-layer`` (or ``containers-storage import-layer``, which hashes it twice
more) while later layers are still being made. Layer IDs are containers/image's chain of
diff_ids (``engine.chain_id``); the stored diff digest must equal the one the maker computed,
or the layer is dropped and the build stops. The image itself (config, manifest, name) is made
only after every layer is in, by ``finish``. Nothing here decides what a layer holds.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from envspec.build.engine import Cancelled, StorageCLI, chain_id
from envspec.errors import HashMismatch


@dataclass
class LayerFile:
    """A layer tar and the future of its maker, whose result carries ``diff_id`` and ``size``;
    ``path`` is where the tar is once the maker is done (the cache, or the work directory)."""

    group: str
    path: Path
    made: Future

    def result(self, cancel: threading.Event) -> dict:
        while not self.made.done():
            if cancel.is_set():
                raise Cancelled()
            wait([self.made], timeout=0.1)
        return self.made.result()


@dataclass
class Importer:
    """Imports ``layers`` (bottom first) in a thread: ``start``, then ``finish`` (waits, raises
    what went wrong, names the image) or ``abort`` (stops the import, drops the partial layer)."""

    store: StorageCLI
    layers: Sequence[LayerFile]
    on_progress: Callable[[str, int], None] = lambda group, sent: None
    on_stored: Callable[[str, float, float], None] = lambda group, start, end: None  # a layer this import stored, when
    cancel: threading.Event = field(default_factory=threading.Event)
    top: str = ""
    stored: list[str] = field(default_factory=list)  # groups this import stored (the others were there)
    _error: BaseException | None = None
    _thread: threading.Thread | None = None

    def start(self) -> "Importer":
        self._thread = threading.Thread(target=self._run, name="envspec-import", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with self.store.locked():
                parent = ""
                for lay in self.layers:
                    # containers/image's chain of diff_ids, so `podman pull` of this image into this
                    # store finds our layers and image (a chain of content keys would let the import
                    # start before a layer is finished, but then a pull back here makes its own
                    # layers and fails on the image ID, which is the config digest either way)
                    made = lay.result(self.cancel)
                    want = made["diff_id"]
                    layer_id = chain_id(parent, want)

                    def progress(n: int, g: str = lay.group) -> None:
                        self.on_progress(g, n)

                    # a layer made in this build was hashed by its maker as it was written; one
                    # taken from the layer cache is hashed again on its way into the store
                    start = time.monotonic()
                    have, ours = self.store.put_layer(
                        layer_id, parent, lay.path, int(made["size"]), name=lay.group, diff_id=want,
                        check=bool(made.get("cached")), cancel=self.cancel, progress=progress)
                    if have != want:
                        if ours:
                            self.store.delete_layer(layer_id)
                        raise HashMismatch(
                            f"containers-storage holds {have or 'nothing'} as the {lay.group} layer "
                            f"{layer_id[:12]}, but this build made {want}", step="import layer",
                            hint=("the layer's file changed while it was imported; build again" if ours else
                                  "the store's layer of this ID holds other bytes (changed on disk?); remove "
                                  "the images using it (`podman rmi`) and build again"))
                    if ours:
                        self.stored.append(lay.group)
                        self.on_stored(lay.group, start, time.monotonic())
                    parent = layer_id
                self.top = parent
        except BaseException as e:  # noqa: BLE001 (handed to the caller by finish)
            self._error = e

    def join(self) -> str:
        """Wait for every layer; the top layer's ID. Raises what the import raised."""
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(0.2)
        if self._error is not None:
            raise self._error
        return self.top

    def finish(self, config: bytes, manifest: bytes, ref: str) -> None:
        top = self.join()
        with self.store.locked():
            self.store.put_image(config, manifest, top, ref)

    def abort(self) -> None:
        self.cancel.set()
        if self._thread is not None:
            while self._thread.is_alive():
                self._thread.join(0.2)
