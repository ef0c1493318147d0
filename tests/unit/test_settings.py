"""One settings module (issue 41, point 1): every ENVSPEC_* variable is read in envspec/settings.py
(the verifier's in envspec/verify/settings.py), typed, with its default and meaning; docs/usage.md's
list is generated from them; no other module reads one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envspec import settings
from envspec.errors import UsageError
from envspec.verify import settings as vsettings

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "envspec"
OWN = {SRC / "settings.py", SRC / "verify" / "settings.py"}
# a read of a named variable: env.get("ENVSPEC_X"), os.environ["ENVSPEC_X"], os.getenv("ENVSPEC_X")
READ = re.compile(
    r"""(?:\.get|getenv)\(\s*["']ENVSPEC_|(?:environ|env)\[\s*["']ENVSPEC_[A-Z0-9_]+["']\s*\](?!\s*=[^=])"""
)
NAME = re.compile(r"""["'](ENVSPEC_[A-Z0-9_]+)["']""")


def test_docs_list_every_variable():
    text = (ROOT / "docs" / "usage.md").read_text()
    block = text.split("<!-- settings: begin -->\n", 1)[1].split("<!-- settings: end -->", 1)[0]
    assert block == settings.markdown(), "docs/usage.md is stale: python -m envspec.settings"


def test_no_other_module_reads_a_variable():
    reads = []
    for path in sorted(SRC.rglob("*.py")):
        if path in OWN:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if READ.search(line):
                reads.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not reads, "read these through envspec.settings (or verify/settings.py):\n" + "\n".join(
        reads
    )


def test_every_variable_named_in_the_code_is_documented():
    known = {v.name for v in settings.VARIABLES} | {v[0] for v in vsettings.VARIABLES}
    named = {}
    for path in sorted(SRC.rglob("*.py")):
        for m in NAME.finditer(path.read_text()):
            named.setdefault(m.group(1), str(path.relative_to(ROOT)))
    undocumented = {
        k: v for k, v in named.items() if k not in known and not k.startswith("ENVSPEC_CACHE_")
    }
    assert not undocumented, undocumented
    assert len(known) == len(settings.VARIABLES) + len(vsettings.VARIABLES), "a name in both tables"


def test_defaults_and_parsing():
    s = settings.read({"HOME": "/home/u"})
    assert s.cache == Path("/home/u/.cache/envspec") and s.scratch == Path("/dev/shm")
    assert (s.stage_nice, s.maker_nice, s.maker_nice_others) == (10, 0, 10)
    assert (
        s.stage_pipe
        and s.direct_write
        and s.cache_stream
        and s.background_compress
        and s.staged_import
    )
    assert s.put_layer is None and s.cache_from is None and not s.offline
    s = settings.read(
        {
            "HOME": "/h",
            "ENVSPEC_CACHE": "/c",
            "ENVSPEC_STAGE_PIPE": "OFF",
            "ENVSPEC_DIRECT_WRITE": "0",
            "ENVSPEC_PUT_LAYER": "",
            "ENVSPEC_CACHE_FROM": "",
            "ENVSPEC_OFFLINE": "1",
            "ENVSPEC_STAGED_IMPORT": "off",
        }
    )
    assert s.cache == Path("/c") and not s.stage_pipe and not s.direct_write and not s.staged_import
    assert s.put_layer == "" and s.cache_from == "" and s.offline
    with pytest.raises(UsageError, match="ENVSPEC_STAGE_NICE='high' is not a whole number"):
        settings.read({"ENVSPEC_STAGE_NICE": "high"})
