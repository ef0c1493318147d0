#!/usr/bin/env bash
# envspec's own set-up and jobs, safe to run twice.
#   scripts/dev.sh setup   install system tools (apt-get) and envspec with its test deps (.venv)
#   scripts/dev.sh main    setup, then lock + build specs/h100.toml (or $ENVSPEC_SPEC) and run its verifier
#   scripts/dev.sh test    setup, then the test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="buildah podman skopeo containers-storage runc mmdebstrap docker-registry uidmap fuse-overlayfs openssh-client tini ca-certificates"
VENV="${ENVSPEC_VENV:-.venv}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

setup_system() {
  local missing=()
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    as_root apt-get update -q
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

setup_python() {
  if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
  # pip's own configuration (mirrors, find-links) applies; envspec reads it too.
  # (pip warns about every configured mirror page that lacks a package; those lines are noise here)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  # The verifier's tests need a torch; the CPU build is small and is what specs/cpu.toml locks.
  "$VENV/bin/python" -c 'import torch' 2>/dev/null || "$VENV/bin/python" -m pip install -q --disable-pip-version-check 'torch==2.13.0' 2> >(grep -v "is ignored: it is neither" >&2)
}

setup() { setup_system; setup_python; }

case "${1:-}" in
  setup) setup ;;
  main)
    setup
    spec="${ENVSPEC_SPEC:-specs/h100.toml}"
    "$VENV/bin/envspec" lock "$spec"
    "$VENV/bin/envspec" build "$spec"
    "$VENV/bin/envspec" run "$spec" -- envspec verify
    ;;
  test)
    setup
    shift
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
