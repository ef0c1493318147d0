"""Regenerate the build-stage fixture locks (run from the repository root; needs Debian's mirror):

    python tests/data/build/regen.py

small.lock          hand-written wheels (sha256 from PyPI's simple API), no Debian packages:
                    fast tests of layers, caching, faults; the image cannot run anything.
small-debian.lock   the same wheels plus the Debian closure of envspec's base set for bookworm
                    (envspec.debian.resolve_closure): the image runs under podman.
Both are written by envspec.lock's canonical writer with a real content hash.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "src"))

from envspec import debian, lock  # noqa: E402


def main() -> None:
    data = tomllib.loads((HERE / "small.lock").read_text())
    small = lock.Lockfile.model_validate(data).with_hash()
    (HERE / "small.lock").write_text(lock.dumps(small))
    req = debian.base_packages("bookworm", gpu=False)
    pins = debian.resolve_closure(
        "bookworm", req, cache_dir=Path.home() / ".cache" / "envspec" / "debian"
    )
    data["debian"] = {
        "suite": "bookworm",
        "architecture": "amd64",
        "mirror": debian.CANONICAL_MIRROR,
        "requested": req,
        "packages": [p.model_dump() for p in debian.sorted_pins(pins)],
    }
    data["meta"]["name"] = "build-small-debian"
    data["platform"]["python_full"] = debian.python_full_version(pins, "bookworm")
    full = lock.Lockfile.model_validate(data).with_hash()
    (HERE / "small-debian.lock").write_text(lock.dumps(full))


if __name__ == "__main__":
    main()
