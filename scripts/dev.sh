#!/usr/bin/env bash
# envspec's own set-up and jobs, safe to run twice.
#   scripts/dev.sh setup   install system tools (apt-get) and envspec with its test deps (.venv)
#   scripts/dev.sh main    setup, then lock + build specs/h100.toml (or $ENVSPEC_SPEC), run its verifier, say where the image is
#   scripts/dev.sh test    setup, then the test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="buildah podman skopeo containers-storage runc mmdebstrap docker-registry uidmap fuse-overlayfs openssh-client tini ca-certificates"
# the engines teams run, for tests/e2e/test_docker_e2e.py and test_slurm_e2e.py (each test starts its own daemons)
APT_PACKAGES="$APT_PACKAGES docker.io slurm-wlm munge chromium"  # engines tested end to end; the DB page checked in a browser
# to run (and verify) arm64 images on an amd64 host: qemu-user-static registers its binfmt_misc entries
# with the F flag, so a container's process finds the interpreter (tests/e2e/test_arm64_e2e.py)
APT_PACKAGES="$APT_PACKAGES qemu-user-static binfmt-support"
# the ABI check's unit tests compile small shared objects that export and import mangled torch-like
# symbols (tests/unit/test_abi.py); libstdc++ also demangles the symbols its errors name
APT_PACKAGES="$APT_PACKAGES g++"
# wheels built from sdists run in a sandbox of the lock's own Debian base (its Python and compiler), with
# no network (src/envspec/wheels/sdist.py)
APT_PACKAGES="$APT_PACKAGES bubblewrap"
# a local mirror's wheel enters the cache as a reflink where the file system has them: tested on a
# loop-mounted XFS (tests/e2e/test_cache_files_e2e.py)
APT_PACKAGES="$APT_PACKAGES xfsprogs"
# to compile envspec-put-layer (src/envspec/image/putlayer/main.go) against Debian's containers/storage (and
# ISA-L, whose CRC-64 it records in the tar-split)
GO_PACKAGES="golang-go golang-github-containers-storage-dev golang-github-ulikunitz-xz-dev gcc libc6-dev libisal-dev"
VENV="${ENVSPEC_VENV:-.venv}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

setup_system() {
  local missing=()
  for p in $APT_PACKAGES $GO_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    as_root apt-get update -q
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# binfmt_misc: mounted and the qemu entries enabled, so `envspec run` starts images of the other CPU
# architecture (a container, or a kernel without binfmt_misc, cannot: envspec doctor says so, tests skip)
setup_binfmt() {
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    as_root mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null ||
      { echo "note: cannot mount binfmt_misc here; arm64 images build but do not run on this host"; return 0; }
  fi
  for e in qemu-aarch64 qemu-x86_64; do
    [ "qemu-${e#qemu-}" = "qemu-$(uname -m)" ] && continue
    as_root update-binfmts --enable "$e" 2>/dev/null || true
  done
}

setup_python() {
  if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
  # pip's own configuration (mirrors, find-links) applies; envspec reads it too.
  # (pip warns about every configured mirror page that lacks a package; those lines are noise here)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  # The verifier's tests need a torch; the CPU build is small and is what specs/cpu.toml locks.
  "$VENV/bin/python" -c 'import torch' 2>/dev/null || "$VENV/bin/python" -m pip install -q --disable-pip-version-check 'torch==2.13.0' 2> >(grep -v "is ignored: it is neither" >&2)
}

# envspec-put-layer: containers/storage's PutLayer told the diff digest envspec computed, so a
# layer is untarred into the store once and not hashed twice more (docs/build.md, "Import").
# Built next to the venv's python, where envspec looks for it; rebuilt when its source changes.
setup_put_layer() {
  local src=src/envspec/image/putlayer/main.go out="$VENV/bin/envspec-put-layer"
  if [ -x "$out" ] && [ "$out" -nt "$src" ]; then return; fi
  echo "building $out"
  # GOPATH mode on Debian's packaged Go sources; overlay needs cgo; btrfs/devmapper are not used
  CGO_ENABLED=1 GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="${GOCACHE:-$HOME/.cache/go-build}" \
    go build -trimpath -tags "exclude_graphdriver_btrfs exclude_graphdriver_devicemapper" -o "$out.tmp" "$src"
  mv -f "$out.tmp" "$out"
}

setup() { setup_system; setup_binfmt; setup_python; setup_put_layer; }

case "${1:-}" in
  setup) setup ;;
  main)
    setup
    spec="${ENVSPEC_SPEC:-specs/h100.toml}"
    "$VENV/bin/envspec" lock "$spec"
    # the build ends by saying what it built, where the image is and how to start it (stdout);
    # kept to be said again as the last words, after the verifier's report
    summary="$(mktemp)"
    trap 'rm -f "$summary"' EXIT
    "$VENV/bin/envspec" build "$spec" | tee "$summary"
    rc=0
    # the verifier needs no /workspace: without the mount, no warning about who owns this directory
    "$VENV/bin/envspec" run "$spec" --no-mount -- envspec verify || rc=$?
    echo
    if [ "$rc" = 0 ]; then echo "== done: the image's verifier passed on this machine"; else
      echo "== the image's verifier failed on this machine (exit $rc, report above)"; fi
    cat "$summary"
    exit "$rc"
    ;;
  test)
    setup
    shift
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
