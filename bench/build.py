"""Benchmark: `envspec build` of specs/h100.toml's lock against a plain Containerfile that
installs the same pins with `buildah bud`, on this machine.

    .venv/bin/python bench/build.py [--lock lockfiles/h100-train.lock] [--skip-containerfile] [--json OUT]

Measures (each in its own storage root and cache under a temp dir, removed at the end):
  unzip floor     unzip of the same wheels (`unzip -q`, one after another) into a temp dir
  untar floor     `tar -x` of the image's layer tars into a temp dir: the file creation any
                  import into containers-storage pays
  cold            envspec build, empty cache and storage (wheels from the configured mirrors),
                  once per import path: envspec-put-layer beside the layer makers (the default;
                  built by scripts/dev.sh setup, found beside this python), containers-storage's
                  own import-layer (ENVSPEC_PUT_LAYER=off), skopeo (ENVSPEC_IMPORT=skopeo), and,
                  with --containers-storage PATH, another build of containers-storage's tool
                  (bench/build-containers-storage.sh: Go 1.22)
  no-op           the same lock again
  one package     the lock with one team package moved to another version
  no-cache again  a second `--no-cache` build in a new cache: same digest?
  containerfile   FROM an image of envspec's Debian base layer (no other base can be reached
                  here), RUN ensurepip + pip install --no-deps of the same wheel files
                  (bind-mounted), `buildah bud --isolation chroot`; twice, for its digest
Sizes: the sum of layer sizes (uncompressed, as stored) and podman's image size.
Before each big phase: sync, then --settle seconds (default 61) of waiting (see timed()).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from envspec import lock as lockmod  # noqa: E402
from envspec import sources  # noqa: E402
from envspec.build import BuildahEngine, BuildOptions, RecordingEngine, Reporter, build  # noqa: E402
from envspec.host import detect_host  # noqa: E402
from envspec.build.fetch import Cache, WheelFetcher  # noqa: E402
from envspec.plan import make_plan  # noqa: E402


def run_build(lock: lockmod.Lockfile, engine, cache_dir: Path, reporter: Reporter | None = None, **options):
    """One build as the CLI runs it: the lock's plan, this machine's mirrors."""
    return build(make_plan(lock), engine, Cache(cache_dir), sources.discover().mirrors,
                 options=BuildOptions(**options), reporter=reporter)


def other_version(name: str, current: str, python_tag: str = "py3") -> dict | None:
    """Another wheel of ``name`` from PyPI's simple API (for the one-package change)."""
    import urllib.request

    req = urllib.request.Request(f"https://pypi.org/simple/{name}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    data = json.load(urllib.request.urlopen(req, timeout=60))
    for f in reversed(data["files"]):
        fn = f["filename"]
        if fn.endswith("-py3-none-any.whl") and f"-{current}-" not in fn and not f.get("yanked"):
            version = fn.split("-")[1]
            return {"version": version, "filename": fn, "sha256": f["hashes"]["sha256"], "size": f.get("size", 0)}
    return None


class Phases(Reporter):
    """Times the phases of one build: until the layout is written (fetch, rootfs, layers, and
    with containers-storage's tool the import of what was made meanwhile) and what is left of the
    import after that; and when each layer's import began (a layer's import begins once it is
    made and the layer below it is in)."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.commit_at = None
        self.import_from: dict[str, float] = {}

    def importing(self, group, sent):
        self.import_from.setdefault(group, time.monotonic())

    def committing(self, ref, digest):
        self.commit_at = time.monotonic()

    def split(self):
        end = time.monotonic()
        out = {"until_layout_s": round(self.commit_at - self.t0, 1),
               "import_after_layout_s": round(end - self.commit_at, 1)}
        if self.import_from:
            out["import_began_s"] = {g: round(t - self.t0, 1) for g, t in self.import_from.items()}
        return out


SETTLE = 61.0  # --settle


def timed(fn, settle: bool = True, phases: "Phases | None" = None):
    """Time ``fn``. ``settle``: first write out dirty pages (``sync``) and wait SETTLE seconds, so
    that a phase does not pay for the one before it: ext4 does not reuse an inode freed less than
    60 s ago (``recently_deleted``, 300 s more while its block is dirty) and scans on for another,
    which made file creation after the previous phase's deletions up to a third slower here."""
    if settle and SETTLE:
        os.sync()
        time.sleep(SETTLE)
    t = time.monotonic()
    if phases is not None:  # its clock starts with the build, not before the wait
        phases.t0 = t
    out = fn()
    return time.monotonic() - t, out


def podman_size(engine, ref: str) -> int:
    cp = subprocess.run(["podman", *engine.host.storage.args(), "image", "inspect", ref], capture_output=True,
                        text=True, check=True)
    return int(json.loads(cp.stdout)[0]["Size"])


def main() -> int:
    global SETTLE
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default=str(ROOT / "lockfiles" / "h100-train.lock"))
    ap.add_argument("--skip-containerfile", action="store_true")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--containers-storage", default="", help="also a cold build with this containers-storage binary")
    ap.add_argument("--settle", type=float, default=SETTLE,
                    help="seconds to wait (after a sync) before each big phase; 0: none (see timed())")
    args = ap.parse_args()
    SETTLE = args.settle

    lock_path = Path(args.lock)
    if not lock_path.exists():
        lock_path = Path(tempfile.mkdtemp()) / "h100.lock"
        subprocess.run([sys.executable, "-m", "envspec", "lock", str(ROOT / "specs" / "h100.toml"), "-o",
                        str(lock_path), "-q"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    lock = lockmod.load(lock_path)
    plan = make_plan(lock)
    work = Path(tempfile.mkdtemp(prefix="envspec-bench-", dir=os.environ.get("ENVSPEC_BENCH_DIR", "/var/tmp")))
    os.environ["ENVSPEC_STORAGE_ROOT"] = str(work / "storage")
    engine = BuildahEngine()
    res: dict = {"lock": str(lock_path), "settle_s": SETTLE, "wheels": len(plan.wheels), "debs": len(plan.debs),
                 "wheel_bytes": sum(w.size for w in plan.wheels)}
    try:
        # wheels into a separate cache first: the unzip floor and the Containerfile need the files
        mirrors = sources.discover().mirrors
        wcache = Cache(work / "wheel-cache")
        t, paths = timed(lambda: WheelFetcher(wcache, mirrors).fetch_all(plan.wheels), settle=False)
        res["fetch_wheels_s"] = round(t, 1)
        floor = work / "unzipped"

        def unzip_all():
            for w in plan.wheels:
                subprocess.run(["unzip", "-q", "-o", str(paths[w.sha256]), "-d", str(floor)], check=True)

        t, _ = timed(unzip_all)
        res["unzip_floor_s"] = round(t, 1)
        shutil.rmtree(floor)

        untar = work / "untarred"
        res["untar_floor_s"] = round(untar_layers(plan, paths, mirrors, work, untar), 1)

        # cold builds by the other import paths first, each in its own storage and cache
        others = [("containers-storage import-layer", {"ENVSPEC_PUT_LAYER": "off"}),
                  ("skopeo", {"ENVSPEC_IMPORT": "skopeo"})]
        if args.containers_storage:
            others.append((f"containers-storage import-layer, {args.containers_storage}",
                           {"ENVSPEC_CONTAINERS_STORAGE": args.containers_storage, "ENVSPEC_PUT_LAYER": "off"}))
        res["cold_by_import"] = {}
        for name, env in others:
            sub = work / ("other-" + str(len(res["cold_by_import"])))
            old_env = {k: os.environ.get(k) for k in [*env, "ENVSPEC_STORAGE_ROOT"]}
            os.environ.update(env)
            os.environ["ENVSPEC_STORAGE_ROOT"] = str(sub / "storage")
            try:
                eng = BuildahEngine()
                ph = Phases()
                t, img = timed(lambda: run_build(lock, eng, sub / "cache", reporter=ph), phases=ph)
                res["cold_by_import"][name] = {"cold_s": round(t, 1), **ph.split(), "digest": img.digest}
            finally:
                reset_storage(eng, sub)
                shutil.rmtree(sub, ignore_errors=True)
                for k, v in old_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

        cache = work / "cache"
        ph = Phases()
        t, img = timed(lambda: run_build(lock, engine, cache, reporter=ph), phases=ph)
        res["cold_s"] = round(t, 1)
        res["cold_phases"] = ph.split()
        store = engine.storage_cli()
        res["cold_import"] = (store.put_tool or "containers-storage import-layer") if store else "skopeo"
        res["digest"] = img.digest
        res["layers"] = [{"group": lay.group, "size": lay.size} for lay in img.layers]
        res["layers_bytes"] = sum(lay.size for lay in img.layers)
        res["podman_size"] = podman_size(engine, img.image)
        t, again = timed(lambda: run_build(lock, engine, cache), settle=False)
        res["noop_s"] = round(t, 1)
        assert again.digest == img.digest

        changed = None
        for w in (w for w in lock.wheels if w.group == "team"):
            alt = other_version(w.name, w.version)
            if alt:
                data = lock.model_dump(mode="json", exclude_none=True)
                next(x for x in data["wheels"] if x["name"] == w.name).update(alt)
                changed = lockmod.Lockfile.model_validate(data).with_hash()
                res["changed_package"] = f"{w.name} {w.version} -> {alt['version']}"
                break
        if changed:
            t, img2 = timed(lambda: run_build(changed, engine, cache), settle=False)
            res["one_package_s"] = round(t, 1)
            res["one_package_rebuilt"] = [lay.group for lay in img2.layers if not lay.cached]

        # a second cold build in a new cache, image named but its layers already in storage
        cache2 = work / "cache2"
        cache2.mkdir()
        (cache2 / "debs").symlink_to(cache / "debs")  # the .debs were fetched once (network)
        ph2 = Phases()
        t, img3 = timed(lambda: run_build(lock, engine, cache2, no_cache=True, reporter=ph2,
                                          tag="localhost/envspec/bench-again:1"), phases=ph2)
        res["no_cache_again_phases"] = ph2.split()
        shutil.rmtree(cache2, ignore_errors=True)
        res["no_cache_again_s"] = round(t, 1)
        res["reproducible"] = img3.digest == img.digest

        if not args.skip_containerfile:
            res.update(containerfile(engine, plan, paths, cache, work))
    finally:
        subprocess.run(["podman", *engine.host.storage.args(), "system", "reset", "--force"], capture_output=True)
        mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(work))), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(detect_host(ask=()).storage.runroot, ignore_errors=True)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


def reset_storage(engine, under: Path) -> None:
    subprocess.run(["podman", *engine.host.storage.args(), "system", "reset", "--force"], capture_output=True)
    mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(under))), reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)
    shutil.rmtree(engine.host.storage.runroot, ignore_errors=True)


def untar_layers(plan, paths, mirrors, work: Path, dest: Path) -> float:
    """`tar -x` of the image's layers (made here, untimed, in a scratch cache) into ``dest``."""
    scratch = work / "untar-cache"
    img = build(plan, RecordingEngine(), Cache(scratch), mirrors, options=BuildOptions(tag=""))
    tars = [Cache(scratch).layer_tar(lay.key) for lay in img.layers if lay.group != "envspec"]

    def untar():
        for i, tar in enumerate(tars):
            (dest / str(i)).mkdir(parents=True)
            subprocess.run(["tar", "-xf", str(tar), "-C", str(dest / str(i))], check=True)

    t, _ = timed(untar)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return t


def containerfile(engine, plan, paths, cache, work) -> dict:
    """The plain way: one RUN pip install of the same files on top of the same Debian base."""
    from envspec.build.oci import LayerBlob, write_layout

    base = plan.layer("base")
    meta = json.loads(cache.__truediv__("layers").joinpath(base.key.split(":")[1] + ".json").read_text())
    blob = LayerBlob("base", base.key, cache / "layers" / (base.key.split(":")[1] + ".tar"), meta["diff_id"],
                     meta["size"])
    layout = work / "base-oci"
    write_layout(layout, plan, [blob], entrypoint=[], cmd=[], user="root", ref_name="base")
    engine.import_image(layout, "localhost/bench/base:1")
    wheels = work / "wheels"
    wheels.mkdir()
    for w in plan.wheels:
        os.link(paths[w.sha256], wheels / w.filename)
    names = " ".join(f"/wheels/{w.filename}" for w in plan.wheels)
    (work / "Containerfile").write_text(
        "FROM localhost/bench/base:1\n"
        "RUN /opt/venv/bin/python -m ensurepip --default-pip && "
        f"/opt/venv/bin/python -m pip install --no-deps --no-index --no-cache-dir {names}\n"
    )
    out = {}
    digests = []
    for i in (1, 2):
        argv = ["buildah", *engine.host.storage.args(), "bud", "--isolation", "chroot", "--layers=false",
                "-v", f"{wheels}:/wheels:ro", "-t", f"localhost/bench/containerfile:{i}", "-f",
                str(work / "Containerfile"), str(work)]
        t, cp = timed(lambda: subprocess.run(argv, capture_output=True, text=True))
        if cp.returncode != 0:
            out["containerfile_error"] = cp.stderr[-2000:]
            return out
        out.setdefault("containerfile_s", []).append(round(t, 1))
        insp = subprocess.run(["skopeo", "inspect", "--raw", engine.host.storage.ref(f"localhost/bench/containerfile:{i}")],
                              capture_output=True, check=True).stdout
        import hashlib

        digests.append("sha256:" + hashlib.sha256(insp).hexdigest())
        if i == 1:
            out["containerfile_size"] = podman_size(engine, "localhost/bench/containerfile:1")
            subprocess.run(["buildah", *engine.host.storage.args(), "rmi", "localhost/bench/containerfile:1"],
                           capture_output=True)
    out["containerfile_reproducible"] = digests[0] == digests[1]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
