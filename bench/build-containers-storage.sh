#!/usr/bin/env bash
# Build containers/storage's command line tool from Debian's own packaged sources with a newer Go
# (bookworm-backports' golang-1.22), for bench/build.py --containers-storage. Debian 12's
# containers-storage is built with Go 1.19, whose SHA-256 does not use the CPU's SHA
# instructions (Go 1.21 added them); the import hashes every layer twice, so this shows what
# the stock tool of a current distribution (Go >= 1.21) does on the same machine.
#   bash bench/build-containers-storage.sh [OUT]   (default OUT: /usr/local/lib/envspec-bench/containers-storage)
set -euo pipefail
out=${1:-/usr/local/lib/envspec-bench/containers-storage}
if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    > /etc/apt/sources.list.d/envspec-bench-backports.sources
  apt-get update -qq
fi
apt-get install -y -qq -t bookworm-backports golang-1.22-go golang-github-containers-storage-dev \
  golang-github-ulikunitz-xz-dev >/dev/null
mkdir -p "$(dirname "$out")"
GOPATH=/usr/share/gocode GO111MODULE=off GOCACHE=$(mktemp -d) \
  /usr/lib/go-1.22/bin/go build -o "$out" github.com/containers/storage/cmd/containers-storage
"$out" version
echo "$out"
