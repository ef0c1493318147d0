"""Regenerate the recorded apt data the unit tests of envspec.debian read.

    python tests/data/debian/record.py [CACHE_DIR]

Needs apt and the Debian mirror. Writes, for bookworm/amd64:
  lists/<pocket>_Packages   the stanzas of NAMES from each pocket's real Packages index
  apt/<case>.txt            apt-get's real output for each case of CASES (stdout then stderr)
Review the diff like code: the unit tests assert on names and versions found here.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "src"))

from envspec.debian.closure import AptRoot, security_mirror_for  # noqa: E402
from envspec.debian.models import CANONICAL_MIRROR  # noqa: E402
from envspec.debian.reporter import DebianReporter  # noqa: E402

NAMES = {
    "tini",
    "libc6",
    "libgcc-s1",
    "gcc-12-base",
    "liblzma5",
    "python3",
    "python3-venv",
    "mawk",
    "exim4-daemon-light",
    "exim4-daemon-heavy",
}
CASES = {
    "print-uris-tini": ["tini", "liblzma5"],
    "unmet-exim": ["exim4-daemon-light", "exim4-daemon-heavy"],
    "virtual-awk": ["awk"],
    "version-missing": ["python3=0.1-1"],
}


def main(cache_dir: Path) -> None:
    root = AptRoot(
        "bookworm",
        mirror=CANONICAL_MIRROR,
        security_mirror=security_mirror_for(CANONICAL_MIRROR),
        architecture="amd64",
        components=("main",),
        cache_dir=cache_dir,
        keyring=Path("/usr/share/keyrings/debian-archive-keyring.gpg"),
    )
    rep = DebianReporter()
    root.update(max_age=6 * 3600, offline=False, reporter=rep)
    (HERE / "lists").mkdir(exist_ok=True)
    (HERE / "apt").mkdir(exist_ok=True)
    for path, pocket, _repo in root.index_files(rep):
        keep = [
            st
            for st in path.read_text().split("\n\n")
            if st.startswith("Package: ") and st.split("\n", 1)[0][len("Package: ") :] in NAMES
        ]
        (HERE / "lists" / f"{pocket}_Packages").write_text("\n\n".join(keep) + "\n")
    for case, req in CASES.items():
        proc = root.run(
            ["install", "--print-uris", "-y", "-q", "--no-install-recommends", "--", *req], rep
        )
        (HERE / "apt" / f"{case}.txt").write_text(proc.stdout + proc.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache" / "envspec")
