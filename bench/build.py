"""Benchmark: `envspec build` of specs/h100.toml's lock against a plain Containerfile that
installs the same pins with `buildah bud`, on this machine.

    .venv/bin/python bench/build.py [--lock lockfiles/h100-train.lock] [--skip-containerfile] [--json OUT]
    .venv/bin/python bench/build.py --cli [--lock LOCK] [--json OUT]

--cli times the command a user runs, `envspec build LOCK --no-cache`, as a subprocess in a
terminal (a pty, so rich draws its progress as it does for a person), each run in a new storage
root, after the same sync and settle wait (see timed()), next to the unzip floor of this run:
  unzip floor        as below
  warm cache         every wheel and .deb already in the cache, an empty storage root
  empty cache        an empty cache too (wheels from the configured mirrors, .debs from Debian's)
  ... as typed, and with --json added (no progress drawn; twice, and once with the import one
                     layer after the other: ENVSPEC_STAGED_IMPORT=off), whose output carries the
  build's phases (fetch, debs, rootfs, layer GROUP, import GROUP, layout, commit: `seconds` and
  `phases` of `envspec build --json`, docs/build.md); the process's wall time less the build's
  own `seconds` is what the CLI spends around build() (start-up, imports, host detection, exit)
  in-process    build() called here with the same cache and flags (what the suite below times),
                for the difference between the two ways
CPU seconds (user, sys) and MB read from and written to the disk by each run's process tree come
from getrusage; --evict drops the cached wheels and .debs from the page cache before each
warm-cache run (as on a machine where they were fetched long ago).

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
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import emit  # noqa: E402  bench/_common.py (run as a script: its directory is on sys.path)

from envspec import lock as lockmod  # noqa: E402
from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.host import detect_host  # noqa: E402
from envspec.image import BuildahEngine, BuildOptions, RecordingEngine, Reporter, build  # noqa: E402
from envspec.plan import make_plan  # noqa: E402
from envspec.registry.stage import Registry  # noqa: E402
from envspec.wheels.fetch import WheelFetcher  # noqa: E402


def run_build(
    lock: lockmod.Lockfile, engine, cache_dir: Path, reporter: Reporter | None = None, **options
):
    """One build as the CLI runs it: the lock's plan, this machine's mirrors."""
    return build(
        make_plan(lock),
        engine,
        Cache(cache_dir),
        sources.discover().mirrors,
        options=BuildOptions(**{"registry": Registry(), **options}),
        reporter=reporter,
    )


def other_version(name: str, current: str, python_tag: str = "py3") -> dict | None:
    """Another wheel of ``name`` from PyPI's simple API (for the one-package change)."""
    import urllib.request

    req = urllib.request.Request(
        f"https://pypi.org/simple/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    data = json.load(urllib.request.urlopen(req, timeout=60))
    for f in reversed(data["files"]):
        fn = f["filename"]
        if fn.endswith("-py3-none-any.whl") and f"-{current}-" not in fn and not f.get("yanked"):
            version = fn.split("-")[1]
            return {
                "version": version,
                "filename": fn,
                "sha256": f["hashes"]["sha256"],
                "size": f.get("size", 0),
            }
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
        assert self.commit_at is not None and self.t0 is not None, "split() after the commit"
        out = {
            "until_layout_s": round(self.commit_at - self.t0, 1),
            "import_after_layout_s": round(end - self.commit_at, 1),
        }
        if self.import_from:
            out["import_began_s"] = {g: round(t - self.t0, 1) for g, t in self.import_from.items()}
        return out


SETTLE = 61.0  # --settle
EVICT = False  # --evict


def timed(fn, settle: bool = True, phases: Phases | None = None):
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
    cp = subprocess.run(
        ["podman", *engine.host.storage.args(), "image", "inspect", ref],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(cp.stdout)[0]["Size"])


def main() -> int:
    global SETTLE, EVICT
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default=str(ROOT / "lockfiles" / "h100-train.lock"))
    ap.add_argument("--skip-containerfile", action="store_true")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument(
        "--containers-storage",
        default="",
        help="also a cold build with this containers-storage binary",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=SETTLE,
        help="seconds to wait (after a sync) before each big phase; 0: none (see timed())",
    )
    ap.add_argument(
        "--cli",
        action="store_true",
        help="time `envspec build LOCK --no-cache` as a user runs it (a subprocess in a pty), warm and "
        "empty cache, with its phases, against the unzip floor and build() in-process",
    )
    ap.add_argument(
        "--skip-empty-cache", action="store_true", help="--cli: only the warm-cache runs"
    )
    ap.add_argument(
        "--evict",
        action="store_true",
        help="--cli: drop the cache's wheels and .debs from the page cache before each warm-cache run",
    )
    args = ap.parse_args()
    SETTLE = args.settle
    EVICT = args.evict
    if args.cli:
        return main_cli(args)

    lock_path = Path(args.lock)
    if not lock_path.exists():
        lock_path = Path(tempfile.mkdtemp()) / "h100.lock"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "envspec",
                "lock",
                str(ROOT / "specs" / "h100.toml"),
                "-o",
                str(lock_path),
                "-q",
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
    lock = lockmod.load(lock_path)
    plan = make_plan(lock)
    work = Path(
        tempfile.mkdtemp(
            prefix="envspec-bench-", dir=os.environ.get("ENVSPEC_BENCH_DIR", "/var/tmp")
        )
    )
    os.environ["ENVSPEC_STORAGE_ROOT"] = str(work / "storage")
    engine = BuildahEngine()
    res: dict = {
        "lock": str(lock_path),
        "settle_s": SETTLE,
        "wheels": len(plan.wheels),
        "debs": len(plan.debs),
        "wheel_bytes": sum(w.size for w in plan.wheels),
    }
    try:
        # wheels into a separate cache first: the unzip floor and the Containerfile need the files
        mirrors = sources.discover().mirrors
        wcache = Cache(work / "wheel-cache")
        t, paths = timed(lambda: WheelFetcher(wcache, mirrors).fetch_all(plan.wheels), settle=False)
        res["fetch_wheels_s"] = round(t, 1)
        res["unzip_floor_s"] = unzip_floor(plan, paths, work / "unzipped")

        untar = work / "untarred"
        res["untar_floor_s"] = round(untar_layers(plan, paths, mirrors, work, untar), 1)

        # cold builds by the other import paths first, each in its own storage and cache
        others = [
            ("containers-storage import-layer", {"ENVSPEC_PUT_LAYER": "off"}),
            ("skopeo", {"ENVSPEC_IMPORT": "skopeo"}),
        ]
        if args.containers_storage:
            others.append(
                (
                    f"containers-storage import-layer, {args.containers_storage}",
                    {
                        "ENVSPEC_CONTAINERS_STORAGE": args.containers_storage,
                        "ENVSPEC_PUT_LAYER": "off",
                    },
                )
            )
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
                res["cold_by_import"][name] = {
                    "cold_s": round(t, 1),
                    **ph.split(),
                    "digest": img.digest,
                }
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
        res["cold_import"] = (
            (store.put_tool or "containers-storage import-layer") if store else "skopeo"
        )
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
        t, img3 = timed(
            lambda: run_build(
                lock,
                engine,
                cache2,
                no_cache=True,
                reporter=ph2,
                tag="localhost/envspec/bench-again:1",
            ),
            phases=ph2,
        )
        res["no_cache_again_phases"] = ph2.split()
        shutil.rmtree(cache2, ignore_errors=True)
        res["no_cache_again_s"] = round(t, 1)
        res["reproducible"] = img3.digest == img.digest

        if not args.skip_containerfile:
            res.update(containerfile(engine, plan, paths, cache, work))
    finally:
        subprocess.run(
            ["podman", *engine.host.storage.args(), "system", "reset", "--force"],
            capture_output=True,
        )
        mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(work))), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(detect_host(ask=()).storage.runroot, ignore_errors=True)
    emit(res, args.json)
    return 0


def reset_storage(engine, under: Path) -> None:
    subprocess.run(
        ["podman", *engine.host.storage.args(), "system", "reset", "--force"], capture_output=True
    )
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


def peer_containerfile(engine, plan, paths, cache, work) -> Path:
    """The plain way's inputs: envspec's Debian base layer (from the layer cache ``cache``) as
    localhost/bench/base:1 (no other base can be reached here), the lock's wheel files hardlinked
    into ``work/wheels`` (bind-mounted as /wheels), and a Containerfile with one RUN pip install of
    them. Returns the Containerfile's path. Also used by bench/startup.py."""
    from envspec.image.oci import LayerBlob, write_layout

    base = plan.layer("base")
    meta = json.loads(
        cache.__truediv__("layers").joinpath(base.key.split(":")[1] + ".json").read_text()
    )
    blob = LayerBlob(
        "base",
        base.key,
        cache / "layers" / (base.key.split(":")[1] + ".tar"),
        meta["diff_id"],
        meta["size"],
    )
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
        "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    )
    return work / "Containerfile"


def containerfile(engine, plan, paths, cache, work) -> dict:
    """The plain way: one RUN pip install of the same files on top of the same Debian base."""
    peer_containerfile(engine, plan, paths, cache, work)
    wheels = work / "wheels"
    out = {}
    digests = []
    for i in (1, 2):
        argv = [
            "buildah",
            *engine.host.storage.args(),
            "bud",
            "--isolation",
            "chroot",
            "--layers=false",
            "-v",
            f"{wheels}:/wheels:ro",
            "-t",
            f"localhost/bench/containerfile:{i}",
            "-f",
            str(work / "Containerfile"),
            str(work),
        ]
        t, cp = timed(lambda: subprocess.run(argv, capture_output=True, text=True))
        if cp.returncode != 0:
            out["containerfile_error"] = cp.stderr[-2000:]
            return out
        out.setdefault("containerfile_s", []).append(round(t, 1))
        insp = subprocess.run(
            [
                "skopeo",
                "inspect",
                "--raw",
                engine.host.storage.ref(f"localhost/bench/containerfile:{i}"),
            ],
            capture_output=True,
            check=True,
        ).stdout
        import hashlib

        digests.append("sha256:" + hashlib.sha256(insp).hexdigest())
        if i == 1:
            out["containerfile_size"] = podman_size(engine, "localhost/bench/containerfile:1")
            subprocess.run(
                ["buildah", *engine.host.storage.args(), "rmi", "localhost/bench/containerfile:1"],
                capture_output=True,
            )
    out["containerfile_reproducible"] = digests[0] == digests[1]
    return out


# --- --cli: the command as users run it --------------------------------------------------------------


def envspec_argv() -> list[str]:
    """The envspec command of this venv (its console script, as a user types it), on this checkout's code."""
    script = Path(sys.executable).parent / "envspec"
    return [str(script)] if script.exists() else [sys.executable, "-m", "envspec"]


def cli_env(cache: Path, storage: Path) -> dict[str, str]:
    # PYTHONPATH: this checkout's code, as the in-process suite imports it
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "ENVSPEC_CACHE": str(cache),
        "ENVSPEC_STORAGE_ROOT": str(storage),
    }


def usage(with_self: bool = False) -> tuple[float, float, float, float]:
    """(user s, sys s, MB read from the disk, MB written) of the finished children, and of this
    process too with ``with_self`` (getrusage's block counts are in 512-byte units: reads the page
    cache served are not counted)."""
    import resource

    rows = [resource.getrusage(resource.RUSAGE_CHILDREN)]
    if with_self:
        rows.append(resource.getrusage(resource.RUSAGE_SELF))
    return (
        sum(r.ru_utime for r in rows),
        sum(r.ru_stime for r in rows),
        sum(r.ru_inblock for r in rows) * 512 / 1e6,
        sum(r.ru_oublock for r in rows) * 512 / 1e6,
    )


def usage_row(before: tuple[float, ...], after: tuple[float, ...]) -> dict:
    d = [b - a for a, b in zip(before, after)]
    return {
        "cpu_user_s": round(d[0], 1),
        "cpu_sys_s": round(d[1], 1),
        "disk_read_mb": round(d[2]),
        "disk_write_mb": round(d[3]),
    }


def evict(cache: Path) -> None:
    """Drop the cache's wheels and .debs from the page cache (POSIX_FADV_DONTNEED on each file,
    nothing else on the machine): a build that reads them from the disk, as on a machine where
    they were fetched long ago."""
    for f in [*cache.glob("blobs/sha256/*"), *cache.glob("debs/**/*.deb")]:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(
    argv: list[str], env: dict[str, str], cols: int = 120, rows: int = 40
) -> tuple[int, str]:
    """Run ``argv`` with a terminal of ``cols`` x ``rows`` on stdin, stdout and stderr (so rich draws
    its live progress as it does for a person); its exit status and what it wrote."""
    import fcntl
    import pty
    import struct
    import termios
    import threading

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**env, "TERM": env.get("TERM", "xterm-256color")}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, cwd=ROOT
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # a terminal reads what is written, or the writer blocks
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the last writer closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    rc = proc.wait()
    reader.join(5)
    os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def cli_build(
    lock_path: Path,
    cache: Path,
    storage: Path,
    *,
    as_json: bool,
    extra: tuple[str, ...] = (),
    env_extra: dict[str, str] | None = None,
) -> dict:
    """One `envspec build LOCK --no-cache` in a new storage root, timed (after the settle wait)."""
    argv = [
        *envspec_argv(),
        "build",
        str(lock_path),
        "--no-cache",
        *extra,
        *(["--json"] if as_json else []),
    ]
    env = {**cli_env(cache, storage), **(env_extra or {})}
    if SETTLE:
        os.sync()
        time.sleep(SETTLE)
    if EVICT:
        evict(cache)
    u0 = usage()
    t = time.monotonic()
    if as_json:  # --json draws nothing: no terminal needed, and stdout is the JSON
        cp = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
        rc, out = cp.returncode, cp.stdout + cp.stderr
    else:
        rc, out = run_in_pty(argv, env)
    wall = time.monotonic() - t
    row: dict = {
        "command": " ".join(
            [
                *(f"{k}={v}" for k, v in (env_extra or {}).items()),
                "envspec",
                *argv[len(envspec_argv()) :],
            ]
        ),
        "wall_s": round(wall, 1),
        **usage_row(u0, usage()),
        "rc": rc,
    }
    if rc != 0:
        row["output_tail"] = out[-3000:]
        return row
    if as_json:
        built = json.loads(cp.stdout)
        row["digest"] = built["digest"]
        row["build_s"] = built["seconds"]
        row["outside_build_s"] = round(wall - built["seconds"], 2)
        row["phases"] = phase_table(built["phases"])
        row["image"] = built["image"]
        row["layers"] = [{"group": lay["group"], "size": lay["size"]} for lay in built["layers"]]
        row["layers_bytes"] = sum(lay["size"] for lay in built["layers"])
    else:
        text = ANSI.sub("", out.replace("\r", "\n"))
        row["last_lines"] = [ln.strip() for ln in text.splitlines() if ln.strip()][-8:]
    return row


def phase_table(phases: list[dict]) -> dict[str, list[float]]:
    """{phase: [start s, end s]} since the build began."""
    return {p["name"]: [round(p["start_s"], 1), round(p["end_s"], 1)] for p in phases}


def in_process_build(lock, cache: Path, storage: Path) -> dict:
    """build() called here, with the CLI's flags (--no-cache), the same cache, a new storage root."""
    old = os.environ.get("ENVSPEC_STORAGE_ROOT")
    os.environ["ENVSPEC_STORAGE_ROOT"] = str(storage)
    try:
        engine = BuildahEngine()
        if SETTLE:
            os.sync()
            time.sleep(SETTLE)
        if EVICT:
            evict(cache)
        u0 = usage(with_self=True)
        t = time.monotonic()
        img = run_build(lock, engine, cache, no_cache=True)
        wall = time.monotonic() - t
        u1 = usage(with_self=True)
    finally:
        if old is None:
            os.environ.pop("ENVSPEC_STORAGE_ROOT", None)
        else:
            os.environ["ENVSPEC_STORAGE_ROOT"] = old
    return {
        "wall_s": round(wall, 1),
        **usage_row(u0, u1),
        "digest": img.digest,
        "build_s": round(img.seconds, 1),
        "phases": phase_table([p.to_json() for p in img.phases]),
    }


def drop_storage(storage: Path) -> None:
    """A storage root and its run root (detect_host's rule for ENVSPEC_STORAGE_ROOT), unmounted and removed."""
    env = {**os.environ, "ENVSPEC_STORAGE_ROOT": str(storage)}
    st = detect_host(ask=(), env=env).storage
    subprocess.run(
        ["podman", *st.args(), "system", "reset", "--force"], capture_output=True, env=env
    )
    mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(storage))), reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)
    shutil.rmtree(storage, ignore_errors=True)
    shutil.rmtree(st.runroot, ignore_errors=True)


def fetch_debs(plan, cache: Path) -> int:
    """The base layer's .debs into ``cache``/debs (where a build with ENVSPEC_CACHE=``cache`` looks),
    from the lock's Debian mirror; how many."""
    base = plan.layer("base")
    if base.debs:
        from envspec import debian

        lk = plan.lock
        debian.fetch_debs(
            list(base.debs),
            cache_dir=cache / "debs",
            mirrors=debian.mirror_list(
                (lk.debian.mirror if lk.debian else "") or debian.CANONICAL_MIRROR
            ),
        )
    return len(base.debs)


def unzip_floor(plan, paths: dict, dest: Path) -> float:
    """The floor: every wheel of the plan unzipped into ``dest`` (then removed), timed."""

    def unzip_all():
        for w in plan.wheels:
            subprocess.run(["unzip", "-q", "-o", str(paths[w.sha256]), "-d", str(dest)], check=True)

    t, _ = timed(unzip_all)
    shutil.rmtree(dest)
    return round(t, 1)


def main_cli(args) -> int:
    lock_path = Path(args.lock).resolve()
    lock = lockmod.load(lock_path)
    plan = make_plan(lock)
    work = Path(
        tempfile.mkdtemp(
            prefix="envspec-bench-cli-", dir=os.environ.get("ENVSPEC_BENCH_DIR", "/var/tmp")
        )
    )
    res: dict = {
        "mode": "cli",
        "lock": str(lock_path.relative_to(ROOT) if lock_path.is_relative_to(ROOT) else lock_path),
        "settle_s": SETTLE,
        "evict": EVICT,
        "wheels": len(plan.wheels),
        "debs": len(plan.debs),
        "wheel_bytes": sum(w.size for w in plan.wheels),
        "envspec": " ".join(envspec_argv()),
    }
    storages: list[Path] = []

    def storage() -> Path:
        storages.append(work / f"storage-{len(storages)}")
        return storages[-1]

    try:
        # the warm cache: every wheel and .deb fetched (untimed), as after a first build
        cache = work / "cache"
        mirrors = sources.discover().mirrors
        t, paths = timed(
            lambda: WheelFetcher(Cache(cache), mirrors).fetch_all(plan.wheels), settle=False
        )
        res["fetch_wheels_s"] = round(t, 1)
        fetch_debs(plan, cache)
        res["unzip_floor_s"] = unzip_floor(plan, paths, work / "unzipped")

        runs: dict = {}
        # a local build keeps its layers uncompressed (docs/build.md, "Which digest"); the last run
        # names --compression zstd, compressing them as a push would, for the comparison
        # and, between two runs of the default, every layer written through the page cache and read
        # back by its stager from its file, as before c053b5f (2026-12-03; docs/build.md, "Every byte
        # written once through the page cache"; on 2026-12-02 this row ran ENVSPEC_LAYER_TREES=all
        # (6291705), before that ENVSPEC_STAGED_IMPORT=off (727c10c))
        page_cache = {"ENVSPEC_DIRECT_WRITE": "off", "ENVSPEC_STAGE_PIPE": "off"}
        for name, as_json, extra, env in (
            ("warm_cache", False, (), {}),
            ("warm_cache_json", True, (), {}),
            ("warm_cache_json_page_cache", True, (), page_cache),
            ("warm_cache_json_again", True, (), {}),
            ("warm_cache_zstd_json", True, ("--compression", "zstd"), {}),
        ):
            st = storage()
            runs[name] = cli_build(
                lock_path, cache, st, as_json=as_json, extra=extra, env_extra=env
            )
            drop_storage(st)
        st = storage()
        runs["warm_cache_in_process"] = in_process_build(lock, cache, st)
        drop_storage(st)
        if not args.skip_empty_cache:
            for name, as_json in (("empty_cache", False), ("empty_cache_json", True)):
                st, empty = storage(), work / f"cache-{name}"
                runs[name] = cli_build(lock_path, empty, st, as_json=as_json)
                drop_storage(st)
                shutil.rmtree(empty, ignore_errors=True)
        for row in runs.values():
            if res["unzip_floor_s"] and "wall_s" in row:
                row["x_unzip_floor"] = round(row["wall_s"] / res["unzip_floor_s"], 2)
        res["runs"] = runs
        digests = {
            r.get("digest") for name, r in runs.items() if r.get("digest") and "zstd" not in name
        }
        res["one_digest"] = len(digests) == 1
    finally:
        for st in storages:
            if st.exists():
                drop_storage(st)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    emit(res, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
