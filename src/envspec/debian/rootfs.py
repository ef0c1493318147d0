"""Build time: a runnable root filesystem from pinned .debs, without running maintainer scripts.

Like apko and distroless, the tree is laid down, not installed: each package's data is
unpacked in name order into a merged-/usr layout, and the few things the maintainer scripts of
the base set would have done are done here, from files the packages ship:

- dpkg's database (/var/lib/dpkg/status, info/*.list, *.md5sums, *.conffiles) so `dpkg -l`
  and SBOM scanners see every package;
- users and groups from base-passwd's passwd.master/group.master, sshd's user when
  openssh-server is there, and the image's non-root user with home /workspace;
- /etc/ssl/certs/ca-certificates.crt and its per-certificate links (update-ca-certificates);
- /etc/ld.so.cache, by the image's own (static) ldconfig run with -r; for a tree of another
  CPU architecture than the builder's (arm64 on amd64), which cannot run it without emulation,
  written by ``ldcache`` in Python (no binary of the image runs at build time);
- the alternatives symlinks of the set (cc -> gcc, awk -> mawk, ...), /etc/shells,
  /etc/nsswitch.conf, /etc/localtime (UTC), sshd_config, base-files' default dot files and
  directories, /tmp and /var/tmp with mode 1777.

Nothing written depends on the host, the clock or the order of the pins: the caller tars the
tree with fixed mtimes and owners taken from the tree.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import platform
import posixpath
import re
import shutil
import stat
import subprocess
import tarfile
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from envspec.errors import BuildError, UsageError

from .certs import subject_hash
from .debfile import DebFile
from .ldcache import write_cache
from .models import DebPin
from .reporter import DebianReporter

# The builder's own architecture, as Debian names it: a tree of another one gets its ld.so.cache
# from ldcache.py (its ldconfig cannot run here without emulation).
HOST_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(
    platform.machine(), platform.machine()
)

# The top-level directories Debian's merged /usr turns into links to their /usr counterparts.
USRMERGE = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "libo32")
ALWAYS_MERGED = ("bin", "sbin", "lib", "lib64")  # made even when no package ships into them

# Alternatives that maintainer scripts (update-alternatives) would have made, for the base set
# and common [system] packages: (link, target, present when this file exists). The target is
# the highest-priority alternative Debian registers for that link.
ALTERNATIVES = (
    ("usr/bin/cc", "gcc", "usr/bin/gcc"),
    ("usr/bin/c89", "c89-gcc", "usr/bin/c89-gcc"),
    ("usr/bin/c99", "c99-gcc", "usr/bin/c99-gcc"),
    ("usr/bin/c++", "g++", "usr/bin/g++"),
    ("usr/bin/awk", "mawk", "usr/bin/mawk"),
    ("usr/bin/nawk", "mawk", "usr/bin/mawk"),
    ("usr/bin/which", "which.debianutils", "usr/bin/which.debianutils"),  # trixie
    ("usr/bin/pager", "less", "usr/bin/less"),
    ("usr/bin/editor", "vim.basic", "usr/bin/vim.basic"),
    ("usr/bin/vi", "vim.basic", "usr/bin/vim.basic"),
    ("usr/bin/sh", "dash", "usr/bin/dash"),  # shipped by dash itself on bookworm
)
SHELLS = (
    "bin/sh",
    "usr/bin/sh",
    "bin/bash",
    "usr/bin/bash",
    "bin/rbash",
    "usr/bin/rbash",
    "bin/dash",
    "usr/bin/dash",
)
SSHD_UID = 100  # adduser --system gives the first free id from 100 in a fresh Debian
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")

_MINIMAL_PASSWD = [
    "root:x:0:0:root:/root:/bin/bash",
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
]
_MINIMAL_GROUP = ["root:x:0:", "shadow:x:42:", "nogroup:x:65534:"]


def _check_rootfs_args(
    pins: list[DebPin], deb_paths: dict[str, Path], dest: Path, user: str, ids: tuple[int, int]
) -> None:
    """``make_rootfs``'s arguments: a user name and ids an image can have, a .deb for every pin,
    an empty destination."""
    uid, gid = ids
    if not _USER_RE.match(user) or user == "root":
        raise UsageError(
            f"{user!r} cannot be the image's user (lowercase letters, digits, _ and -; not root)",
            reference="bad-image-user",
        )
    if not (1 <= uid < 65534 and 1 <= gid < 65534):
        raise UsageError(
            f"uid/gid {uid}/{gid} out of range for the image's user (1..65533)",
            reference="bad-image-user",
        )
    missing = sorted(p.name for p in pins if p.name not in deb_paths)
    if missing:
        raise BuildError(f"no .deb given for: {', '.join(missing)}", step="rootfs")
    if dest.exists() and any(dest.iterdir()):
        raise BuildError(
            f"{dest} is not empty; make_rootfs needs an empty directory", step="rootfs"
        )


def _unpack_all(
    tree: _Tree,
    ordered: list[DebPin],
    deb_paths: dict[str, Path],
    reporter: DebianReporter,
    jobs: int,
) -> None:
    """Every package laid into ``tree``, strictly in the order given."""
    # Packages decompress in worker processes (lzma keeps the GIL for much of its work), a few
    # ahead of the one being laid down; they are laid down strictly in name order.
    jobs = jobs or min(4, os.cpu_count() or 1)
    pool = None
    if jobs > 1 and len(ordered) > 1:
        # fork is cheap and safe in a single-threaded caller; with other threads alive (progress
        # bars, parallel downloads) a forked child may inherit a held lock: use a fork server.
        ctx = multiprocessing.get_context("fork" if threading.active_count() == 1 else "forkserver")
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
    try:
        window: deque[tuple[DebPin, Future[bytes] | None]] = deque()
        todo = iter(ordered)

        def submit(p: DebPin) -> None:
            path = str(deb_paths[p.name])
            window.append((p, pool.submit(_data_tar, path) if pool else None))

        for pin in todo:
            submit(pin)
            if len(window) > 2 * jobs:
                break
        while window:
            pin, fut = window.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                submit(nxt)
            deb = DebFile(deb_paths[pin.name])
            data = fut.result() if fut else deb.data_tar_bytes()
            reporter.unpacking(pin)
            tree.unpack(pin, deb, data)
            del data
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)


def make_rootfs(
    pins: list[DebPin],
    deb_paths: dict[str, Path],
    dest: Path,
    *,
    user: str = "envspec",
    uid: int = 1000,
    gid: int | None = None,
    reporter: DebianReporter | None = None,
    jobs: int = 0,
) -> None:
    """Lay the pinned packages into ``dest`` (absent or empty) as a runnable root filesystem.

    ``deb_paths`` maps each pin's name to its checked .deb (fetch_deb's result). The tree is
    the same for the same pins and arguments on any host; run as root to keep the packages'
    owners (as a non-root user every file belongs to the caller).
    """
    reporter = reporter or DebianReporter()
    gid = uid if gid is None else gid
    dest = Path(dest)
    _check_rootfs_args(pins, deb_paths, dest, user, (uid, gid))
    tree = _Tree(dest, reporter)
    tree.start()
    ordered = sorted(pins, key=lambda p: (p.name, p.architecture))

    _unpack_all(tree, ordered, deb_paths, reporter, jobs)
    tree.write_dpkg_database()
    tree.fix_base_files()
    tree.fix_users(user, uid, gid)
    tree.fix_certificates()
    tree.fix_alternatives()
    tree.fix_misc()
    arch = next((p.architecture for p in ordered if p.architecture != "all"), HOST_DEBIAN_ARCH)
    if arch == HOST_DEBIAN_ARCH:
        tree.run_ldconfig()
    else:
        tree.write_ldcache(arch)
    if tree.overwritten:
        shown = ", ".join(f"/{p} ({a} -> {b})" for p, a, b in tree.overwritten[:5])
        more = f" and {len(tree.overwritten) - 5} more" if len(tree.overwritten) > 5 else ""
        reporter.warning(
            f"{len(tree.overwritten)} file(s) shipped by two packages; the later name won: {shown}{more}"
        )


class _Tree:
    def __init__(self, dest: Path, reporter: DebianReporter) -> None:
        self.dest = dest
        self.reporter = reporter
        self.as_root = os.geteuid() == 0
        self.owner: dict[str, str] = {}  # canonical path -> package that wrote it
        self.overwritten: list[tuple[str, str, str]] = []
        self.status: dict[tuple[str, str], str] = {}  # (name, arch) -> status stanza
        self.packages: set[str] = set()
        self._dirs: dict[str, str] = {}

    # -- paths ---------------------------------------------------------------------------
    @staticmethod
    def canonical(name: str) -> str:
        """A tar member name as a path relative to the root, with merged /usr applied."""
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts):
            raise BuildError(f"refusing a path with '..' in a package: {name}", step="rootfs")
        if parts and parts[0] in USRMERGE:
            parts.insert(0, "usr")
        return "/".join(parts)

    def resolve(self, rel: str, *, follow_last: bool) -> Path:
        """The host path of ``rel`` inside the root, following symlinks as the image would."""
        todo = [p for p in rel.split("/") if p not in ("", ".")]
        done: list[str] = []
        hops = 0
        while todo:
            comp = todo.pop(0)
            if comp == "..":
                if done:
                    done.pop()
                continue
            cur = self.dest.joinpath(*done, comp)
            if (todo or follow_last) and cur.is_symlink():
                hops += 1
                if hops > 40:
                    raise BuildError(f"too many symlinks resolving /{rel}", step="rootfs")
                target = os.readlink(cur)
                if target.startswith("/"):
                    done = []
                todo = [p for p in target.split("/") if p not in ("", ".")] + todo
                continue
            done.append(comp)
        return self.dest.joinpath(*done)

    def path(self, rel: str) -> Path:
        return self.resolve(rel, follow_last=False)

    def mkdirs(self, rel: str, mode: int = 0o755) -> Path:
        p = self.resolve(rel, follow_last=True)
        if not p.is_dir():
            if not p.parent.is_dir():
                self.mkdirs(str(p.parent.relative_to(self.dest)))
            p.mkdir()
            os.chmod(p, mode)
        return p

    def chown(self, p: Path | str, uid: int, gid: int) -> None:
        if self.as_root:
            os.lchown(p, uid, gid)

    def write(
        self,
        rel: str,
        data: bytes | str,
        mode: int = 0o644,
        uid: int = 0,
        gid: int = 0,
        replace: bool = True,
    ) -> Path | None:
        p = self.path(rel)
        if p.exists() or p.is_symlink():
            if not replace:
                return None
            if p.is_dir() and not p.is_symlink():
                raise BuildError(f"cannot write /{rel}: a directory is there", step="rootfs")
            p.unlink()
        self.mkdirs(posixpath.dirname(rel))
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        self.chown(p, uid, gid)
        os.chmod(p, mode)
        return p

    def symlink(self, rel: str, target: str, *, replace: bool = False) -> bool:
        p = self.path(rel)
        if p.exists() or p.is_symlink():
            if not replace or (p.is_dir() and not p.is_symlink()):
                return False
            p.unlink()
        self.mkdirs(posixpath.dirname(rel))
        os.symlink(target, p)
        return True

    def exists(self, rel: str) -> bool:
        p = self.path(rel)
        return p.exists() or p.is_symlink()

    # -- unpacking -----------------------------------------------------------------------
    def start(self) -> None:
        self.dest.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dest, 0o755)
        self.mkdirs("usr")
        for d in ALWAYS_MERGED:
            self.mkdirs(f"usr/{d}")
            os.symlink(f"usr/{d}", self.dest / d)

    def _ensure_merged(self, top: str) -> None:
        if top in USRMERGE and not (self.dest / top).is_symlink():
            self.mkdirs(f"usr/{top}")
            os.symlink(f"usr/{top}", self.dest / top)

    def unpack(self, pin: DebPin, deb: DebFile, data: bytes) -> None:
        control = deb.control()
        cfields = dict(control)
        if cfields.get("Package") != pin.name or cfields.get("Version") != pin.version:
            raise BuildError(
                f"{deb.path} holds {cfields.get('Package')} {cfields.get('Version')}, "
                f"not {pin.name} {pin.version}",
                step="rootfs",
            )
        files = deb.control_files()
        conffiles = {
            ln.split()[-1] for ln in files.get("conffiles", b"").decode().splitlines() if ln.strip()
        }
        conf_md5: dict[str, str] = {}
        listed: list[str] = ["/."]
        with deb.open_tar(data) as tf:
            for ti in tf:
                rel = self.canonical(ti.name)
                if not rel:
                    continue
                orig = "/" + "/".join(p for p in ti.name.split("/") if p not in ("", "."))
                listed.append(orig)
                top = orig.split("/")[1]
                self._ensure_merged(top)
                if orig == "/" + top and top in USRMERGE and (ti.issym() or ti.isdir()):
                    continue  # /bin itself (trixie's base-files ships bin -> usr/bin): already made
                self._member(pin, tf, ti, rel, orig, conffiles, conf_md5)
        self._record(pin, control, files, listed, conffiles, conf_md5)

    def _dir(self, rel: str) -> str:
        """The host path of directory ``rel`` (made if missing), cached: most members of a
        package share a few directories."""
        hit = self._dirs.get(rel)
        if hit is None:
            hit = self._dirs[rel] = str(self.mkdirs(rel))
        return hit

    def _member_dir(
        self,
        pin: DebPin,
        ti: tarfile.TarInfo,
        rel: str,
        orig: str,
        target: str,
        st: os.stat_result | None,
    ) -> None:
        """A package's directory entry: made, or a shared directory given this package's owner
        and mode; a symlink to a directory stays, as dpkg leaves it; a file there is an error."""
        mode = ti.mode & 0o7777
        if st is None:
            os.mkdir(target)
            self.chown(target, ti.uid, ti.gid)
            os.chmod(target, mode)
        elif stat.S_ISDIR(st.st_mode):
            self.chown(target, ti.uid, ti.gid)  # shared directory: the later package's mode
            os.chmod(target, mode)
        elif not (stat.S_ISLNK(st.st_mode) and self.resolve(rel, follow_last=True).is_dir()):
            raise BuildError(
                f"{pin.name} ships directory {orig} where another package put a file",
                step="rootfs",
            )

    def _member(
        self,
        pin: DebPin,
        tf: tarfile.TarFile,
        ti: tarfile.TarInfo,
        rel: str,
        orig: str,
        conffiles: set[str],
        conf_md5: dict[str, str],
    ) -> None:
        target = os.path.join(self._dir(posixpath.dirname(rel)), posixpath.basename(rel))
        mode = ti.mode & 0o7777
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            st = None
        if ti.isdir():
            self._member_dir(pin, ti, rel, orig, target, st)
            return
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                if ti.issym() and not os.listdir(target):
                    os.rmdir(target)
                    self._dirs.clear()
                else:
                    raise BuildError(
                        f"{pin.name} ships {orig} where another package put a directory",
                        step="rootfs",
                    )
            else:
                prev = self.owner.get(rel, "?")
                if prev != pin.name:
                    self.overwritten.append((rel, prev, pin.name))
                os.unlink(target)
        self.owner[rel] = pin.name
        if ti.isreg():
            src = tf.extractfile(ti)
            assert src is not None  # a regular file has its bytes
            data = src.read()
            with open(target, "xb") as out:
                out.write(data)
            if orig in conffiles:
                conf_md5[orig] = hashlib.md5(data, usedforsecurity=False).hexdigest()
            self.chown(target, ti.uid, ti.gid)
            os.chmod(target, mode)  # after chown, which clears set-id bits
        elif ti.issym():
            os.symlink(ti.linkname, target)
            self.chown(target, ti.uid, ti.gid)
        elif ti.islnk():
            os.link(self.path(self.canonical(ti.linkname)), target)
        else:
            self.reporter.warning(f"{pin.name}: skipped {orig}, a {_kind(ti)} (not made in images)")

    def _record(
        self,
        pin: DebPin,
        control: list[tuple[str, str]],
        files: dict[str, bytes],
        listed: list[str],
        conffiles: set[str],
        conf_md5: dict[str, str],
    ) -> None:
        fields = [(k, v) for k, v in control if k not in ("Package", "Status", "Conffiles")]
        out = [f"Package: {pin.name}", "Status: install ok installed"]
        conf = [f" {c} {conf_md5.get(c, 'newconffile')}" for c in sorted(conffiles)]
        for k, v in fields:
            if k == "Description" and conf:
                out.append("Conffiles:\n" + "\n".join(conf))
                conf = []
            out.append(f"{k}: {v}")
        if conf:
            out.append("Conffiles:\n" + "\n".join(conf))
        self.status[(pin.name, pin.architecture)] = "\n".join(out) + "\n"
        self.packages.add(pin.name)
        multi_same = dict(control).get("Multi-Arch") == "same"
        base = f"{pin.name}:{pin.architecture}" if multi_same else pin.name
        info = "var/lib/dpkg/info"
        self.mkdirs(info)
        self.write(f"{info}/{base}.list", "\n".join(listed) + "\n")
        if "md5sums" in files:
            self.write(f"{info}/{base}.md5sums", files["md5sums"])
        if "conffiles" in files:
            self.write(f"{info}/{base}.conffiles", files["conffiles"])

    def write_dpkg_database(self) -> None:
        for d in (
            "var/lib/dpkg/info",
            "var/lib/dpkg/updates",
            "var/lib/dpkg/triggers",
            "var/lib/dpkg/alternatives",
            "var/lib/dpkg/parts",
        ):
            self.mkdirs(d)
        self.write("var/lib/dpkg/status", "\n".join(self.status[k] for k in sorted(self.status)))
        self.write("var/lib/dpkg/info/format", "1\n")  # the multiarch layout: NAME:ARCH.list
        self.write("var/lib/dpkg/available", "")
        self.write("var/lib/dpkg/diversions", "")
        self.write("var/lib/dpkg/statoverride", "")
        self.reporter.fixup("dpkg database")

    # -- what maintainer scripts would have done ----------------------------------------
    def _copy_default(self, src: str, dst: str, mode: int = 0o644) -> None:
        s = self.path(src)
        if s.is_file() and not self.exists(dst):
            self.write(dst, s.read_bytes(), mode=mode)
            self.reporter.fixup(f"/{dst}")

    def fix_base_files(self) -> None:
        # base-files' postinst: default dot files and /etc/profile, FHS directories.
        self._copy_default("usr/share/base-files/dot.profile", "root/.profile")
        self._copy_default("usr/share/base-files/dot.bashrc", "root/.bashrc")
        self._copy_default("usr/share/base-files/profile", "etc/profile")
        self._copy_default("usr/share/base-files/motd", "etc/motd")
        # libc-bin's postinst installs the default name service switch.
        self._copy_default("usr/share/libc-bin/nsswitch.conf", "etc/nsswitch.conf")
        for d in (
            "mnt",
            "srv",
            "opt",
            "etc/opt",
            "var/opt",
            "media",
            "home",
            "root",
            "run",
            "proc",
            "sys",
            "dev",
            "var/log",
            "var/cache",
            "var/lib",
            "usr/local/bin",
            "usr/local/lib",
            "usr/local/include",
            "usr/local/sbin",
            "usr/local/src",
            "usr/local/etc",
            "usr/local/games",
            "usr/local/share/man",
        ):
            self.mkdirs(d)
        os.chmod(self.path("root"), 0o700)
        self.mkdirs("run/lock")
        os.chmod(self.path("run/lock"), 0o1777)
        for link, target in (
            ("var/run", "/run"),
            ("var/lock", "/run/lock"),
            ("usr/local/man", "share/man"),
        ):
            p = self.path(link)
            if p.is_dir() and not p.is_symlink() and not any(p.iterdir()):
                p.rmdir()
            self.symlink(link, target)
        if self.exists("etc/dpkg/origins/debian"):
            self.symlink("etc/dpkg/origins/default", "debian")
        if self.exists("usr/share/zoneinfo/Etc/UTC"):  # tzdata's postinst, answering UTC
            self.symlink("etc/localtime", "/usr/share/zoneinfo/Etc/UTC", replace=True)
            self.write("etc/timezone", "Etc/UTC\n")
        py_local = (
            sorted(p.name for p in self.path("usr/lib").glob("python3.*") if p.is_dir())
            if self.path("usr/lib").is_dir()
            else []
        )
        for name in py_local:  # python3.X-minimal's postinst
            self.mkdirs(f"usr/local/lib/{name}/dist-packages")
        self.reporter.fixup("base-files directories and defaults")

    def _master(self, rel: str, fallback: list[str]) -> list[str]:
        p = self.path(rel)
        lines = p.read_text().splitlines() if p.is_file() else list(fallback)
        out = []
        for ln in lines:
            parts = ln.split(":")
            if len(parts) >= 3 and parts[1] == "*":
                parts[1] = "x"  # the password lives in /etc/shadow
            out.append(":".join(parts))
        return out

    def fix_users(self, user: str, uid: int, gid: int) -> None:
        passwd = self._master("usr/share/base-passwd/passwd.master", _MINIMAL_PASSWD)
        group = self._master("usr/share/base-passwd/group.master", _MINIMAL_GROUP)
        names = {ln.split(":")[0] for ln in passwd}
        uids = {int(ln.split(":")[2]) for ln in passwd}
        gnames = {ln.split(":")[0] for ln in group}
        gids = {int(ln.split(":")[2]) for ln in group}
        if self.exists("usr/sbin/sshd") and "sshd" not in names:
            # openssh-server's postinst: a system user for privilege separation.
            passwd.append(f"sshd:x:{SSHD_UID}:65534::/run/sshd:/usr/sbin/nologin")
            uids.add(SSHD_UID)
            names.add("sshd")
            self.mkdirs("run/sshd")
        if user in names or user in gnames or uid in uids or gid in gids:
            raise UsageError(
                f"the image's user {user} ({uid}:{gid}) clashes with a Debian system user or group",
                hint="pick another name, or a uid/gid of 1000 or more",
                reference="bad-image-user",
            )
        shell = "/bin/bash" if self.exists("usr/bin/bash") else "/bin/sh"
        passwd.append(f"{user}:x:{uid}:{gid}::/workspace:{shell}")
        group.append(f"{user}:x:{gid}:")
        shadow_gid = next((int(ln.split(":")[2]) for ln in group if ln.startswith("shadow:")), 0)
        # "*": no password can log in; empty last-change field: no password ageing, so PAM does
        # not ask to change an expired password on an ssh key login.
        shadow = [f"{ln.split(':')[0]}:*::0:99999:7:::" for ln in passwd]
        gshadow = [f"{ln.split(':')[0]}:*::" for ln in group]
        self.write("etc/passwd", "\n".join(passwd) + "\n")
        self.write("etc/group", "\n".join(group) + "\n")
        self.write("etc/shadow", "\n".join(shadow) + "\n", mode=0o640, gid=shadow_gid)
        self.write("etc/gshadow", "\n".join(gshadow) + "\n", mode=0o640, gid=shadow_gid)
        ws = self.mkdirs("workspace")
        self.chown(ws, uid, gid)
        os.chmod(ws, 0o755)
        self.reporter.fixup("users")

    def fix_certificates(self) -> None:
        # ca-certificates' postinst (update-ca-certificates): every Mozilla root is enabled,
        # linked as /etc/ssl/certs/NAME.pem and by subject hash, and concatenated in name order.
        mozilla = self.path("usr/share/ca-certificates/mozilla")
        if not mozilla.is_dir():
            return
        certs = sorted(p.name for p in mozilla.iterdir() if p.name.endswith(".crt"))
        self.mkdirs("etc/ssl/certs")
        self.write(
            "etc/ca-certificates.conf",
            "# Generated by envspec: every certificate ca-certificates ships is enabled.\n"
            + "".join(f"mozilla/{c}\n" for c in certs),
        )
        bundle = []
        hashes: dict[str, int] = {}
        for c in certs:
            pem = (mozilla / c).read_bytes()
            bundle.append(pem if pem.endswith(b"\n") else pem + b"\n")
            link = c[: -len(".crt")] + ".pem"
            self.symlink(
                f"etc/ssl/certs/{link}", f"/usr/share/ca-certificates/mozilla/{c}", replace=True
            )
            try:
                h = subject_hash(pem)
            except ValueError as e:
                self.reporter.warning(f"no subject hash link for {c}: {e}")
                continue
            n = hashes.get(h, 0)
            hashes[h] = n + 1
            self.symlink(f"etc/ssl/certs/{h}.{n}", link, replace=True)
        self.write("etc/ssl/certs/ca-certificates.crt", b"".join(bundle))
        self.reporter.fixup("CA certificates")

    def fix_alternatives(self) -> None:
        for link, target, when in ALTERNATIVES:
            if self.exists(when) and not self.exists(link):
                self.symlink(link, target)
                self.reporter.fixup(f"/{link} -> {target}")

    def fix_misc(self) -> None:
        shells = [f"/{s}" for s in SHELLS if self.exists(s)]
        if shells:
            self.write(
                "etc/shells",
                "# /etc/shells: valid login shells\n" + "".join(s + "\n" for s in shells),
            )
        self._copy_default("usr/share/openssh/sshd_config", "etc/ssh/sshd_config")
        for d in ("tmp", "var/tmp"):
            p = self.mkdirs(d)
            os.chmod(p, 0o1777)

    def write_ldcache(self, architecture: str) -> None:
        self.reporter.fixup("/etc/ld.so.cache")
        write_cache(self.dest, architecture)

    def run_ldconfig(self) -> None:
        # The image's own ldconfig is static; running it (not the host's) keeps the cache's
        # format and content independent of the host. -r makes it chroot into the tree.
        own = self.resolve("usr/sbin/ldconfig", follow_last=True)
        binary = str(own) if own.is_file() else shutil.which("ldconfig") or "/sbin/ldconfig"
        argv = [binary, "-r", str(self.dest)]
        if not self.as_root:
            argv = ["unshare", "--map-root-user", *argv]
        self.reporter.fixup("/etc/ld.so.cache")
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(
                "ldconfig could not build /etc/ld.so.cache",
                step="rootfs",
                argv=argv,
                returncode=proc.returncode,
                stderr_tail=proc.stderr,
            )
        aux = self.path("var/cache/ldconfig/aux-cache")
        if aux.exists():  # holds inode numbers and ctimes of the host: not reproducible
            aux.unlink()


def _data_tar(path: str) -> bytes:
    """Worker-process side of make_rootfs: one package's uncompressed data.tar."""
    return DebFile(Path(path)).data_tar_bytes()


def _kind(ti: tarfile.TarInfo) -> str:
    if ti.ischr():
        return "character device"
    if ti.isblk():
        return "block device"
    if ti.isfifo():
        return "fifo"
    return f"tar type {ti.type!r}"


__all__ = ["make_rootfs"]
