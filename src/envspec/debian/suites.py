"""The Debian releases envspec can build on: plain data, no imports, so that ``resolve.choose``
(``envspec explain``) can read it without loading the pin model (pydantic) of ``models``."""

# Debian releases envspec can build on, with the Python 3 each ships as `python3` and the
# glibc it ships. Sources: packages.debian.org/bookworm/python3 (3.11.2),
# packages.debian.org/trixie/python3 (3.13.5), libc6 2.36 (bookworm) and 2.41 (trixie).
SUITES: dict[str, dict[str, str]] = {
    "bookworm": {"python": "3.11", "glibc": "2.36", "version": "12"},
    "trixie": {"python": "3.13", "glibc": "2.41", "version": "13"},
}
