"""Re-record the index responses tests/unit/test_compat_refresh.py replays (needs PyPI).

    python tests/data/compat/record.py            # everything below
    python tests/data/compat/record.py aarch64    # only the aarch64 wheels' METADATA (platform check)

Keeps only what refresh reads, for a few releases: the JSON API's release list, the simple JSON API's
file entries (filename, url, size, hashes, yanked, core-metadata) and, for the wheel refresh reads,
its METADATA headers (the long description dropped), read with range requests like refresh does.
One key is added by hand: a pre-release "2.16.0rc1" in the release list, which refresh must skip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2] / "src"))

from envspec.compat import pypi as r  # noqa: E402

VERSIONS = ["1.13.1", "2.0.0", "2.9.1", "2.14.1", "2.15.0"]


def main() -> None:
    api = json.loads(r.default_fetch(r.JSON_API))
    simple = json.loads(r.default_fetch(r.SIMPLE_API))
    keep_api = {
        "info": {"name": api["info"]["name"], "version": api["info"]["version"]},
        "releases": {
            v: [] for v in VERSIONS + ["2.16.0rc1"] if v in api["releases"] or v.endswith("rc1")
        },
    }
    keys = ("filename", "url", "size", "hashes", "yanked", "core-metadata", "requires-python")
    files = []
    for f in simple["files"]:
        fn = f["filename"]
        if any(fn.startswith(f"torch-{v}-") for v in VERSIONS):
            files.append({k: f[k] for k in keys if k in f})
    keep_simple = {
        "meta": simple["meta"],
        "name": simple["name"],
        "versions": [v for v in simple["versions"] if v in VERSIONS],
        "files": files,
    }
    (HERE / "pypi_torch.json").write_text(json.dumps(keep_api, indent=1, sort_keys=True) + "\n")
    (HERE / "simple_torch.json").write_text(
        json.dumps(keep_simple, indent=1, sort_keys=True) + "\n"
    )
    meta_dir = HERE / "metadata"
    meta_dir.mkdir(exist_ok=True)
    models = [r.PypiFile.model_validate(f) for f in files]
    for v in VERSIONS:
        wheels = r._linux_x86_64_wheels(models, v)
        if not wheels:
            continue
        pick = max(wheels, key=lambda f: r.Version(r.linux_x86_64_pythons([f.filename])[0][-1]))
        raw = r.read_zip_member(pick.url, pick.size, ".dist-info/METADATA", r.default_fetch_range)
        head = raw.decode().split("\n\n", 1)[0] + "\n"  # headers only
        (meta_dir / (pick.filename + ".metadata")).write_text(head)
        print(v, pick.filename)


def record_aarch64() -> None:
    """The METADATA headers of each recorded release's linux-aarch64 wheel that refresh's platform
    check reads (``pypi._linux_aarch64_wheel``), from the recorded file list: `record.py aarch64`."""
    files = json.loads((HERE / "simple_torch.json").read_text())["files"]
    models = [r.PypiFile.model_validate(f) for f in files]
    for v in VERSIONS:
        pick = r._linux_aarch64_wheel(models, v)
        if pick is None:
            continue
        raw = r.read_zip_member(pick.url, pick.size, ".dist-info/METADATA", r.default_fetch_range)
        head = raw.decode().split("\n\n", 1)[0] + "\n"
        (HERE / "metadata" / (pick.filename + ".metadata")).write_text(head)
        print(v, pick.filename)


if __name__ == "__main__":
    record_aarch64() if sys.argv[1:] == ["aarch64"] else main()
