"""Shared by the end-to-end tests: a private container storage root, torn down whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path


@contextlib.contextmanager
def private_storage(root: Path):
    """Point envspec (ENVSPEC_STORAGE_ROOT) at ``root`` for the block; afterwards remove every
    image, container and mount under it, so a used machine and a fresh one behave alike."""
    from envspec.host import ASK_STORAGE, detect_host

    old = os.environ.get("ENVSPEC_STORAGE_ROOT")
    os.environ["ENVSPEC_STORAGE_ROOT"] = str(root)
    host = detect_host(ask=ASK_STORAGE)
    try:
        yield host
    finally:
        subprocess.run(["podman", *host.storage.args(), "system", "reset", "--force"],
                       capture_output=True, check=False)
        # the overlay driver keeps <root>/overlay bind-mounted on itself after the last user
        mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith((str(root), host.storage.runroot))), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(host.storage.runroot, ignore_errors=True)
        if old is None:
            os.environ.pop("ENVSPEC_STORAGE_ROOT", None)
        else:
            os.environ["ENVSPEC_STORAGE_ROOT"] = old
