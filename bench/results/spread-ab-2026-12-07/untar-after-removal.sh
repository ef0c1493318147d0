#!/bin/bash
# Two tars of 20,000 small files each untarred at once into two new directories of a staging area,
# right after two others of the same size were removed beside it (as a node's pull after `podman rmi`),
# with the staging area's ext4 top-directory flag (T) or without (N). Root, on the file system under test.
#   bash untar-after-removal.sh N|T LABEL      (prints: LABEL N|T SECONDS)
set -e
P=${P:-/var/lib/containers/exp/overlay}
mkdir -p /dev/shm/exp "$P"
for part in a b; do
  [ -f /dev/shm/exp/$part.tar ] || python3 - "$part" <<'PY'
import io, os, sys, tarfile
with tarfile.open(f"/dev/shm/exp/{sys.argv[1]}.tar", "w") as t:
    for d in range(400):
        for f in range(50):
            data = os.urandom(1500)
            ti = tarfile.TarInfo(f"site-packages/pkg{d}/mod{f}.py"); ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
PY
done
mkdir -p $P/old1 $P/old2
tar -xf /dev/shm/exp/a.tar -C $P/old1 & tar -xf /dev/shm/exp/b.tar -C $P/old2; wait
sync
rm -rf $P/old1 $P/old2 $P/envspec-staging
sync; echo 3 > /proc/sys/vm/drop_caches
mkdir -p $P/envspec-staging
[ "$1" = T ] && chattr +T $P/envspec-staging
mkdir $P/envspec-staging/1-x $P/envspec-staging/2-x
s=$(date +%s.%N)
tar -xf /dev/shm/exp/a.tar -C $P/envspec-staging/1-x & tar -xf /dev/shm/exp/b.tar -C $P/envspec-staging/2-x; wait
e=$(date +%s.%N)
echo "$2 $1 $(echo "$e - $s" | bc)"
rm -rf $P/envspec-staging
