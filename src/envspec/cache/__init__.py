"""envspec's content-addressed cache: where it is (``dirs``), its files and locks (``store.Cache``),
what it holds and its garbage collection (``gc``).

Layout under the cache root (``ENVSPEC_CACHE``, else ``$XDG_CACHE_HOME/envspec``, else
``~/.cache/envspec``: ``envspec.cache.dirs.cache_dir_for``)::

    blobs/sha256/<hex>         fetched wheels, named by their verified sha256 (``envspec.wheels``)
    debs/                      what envspec.debian.fetch_deb keeps
    layers/<key>.tar           finished layer tars, named by the plan's content key
    layers/<key>.json          their diff_id, size, entries (written after the tar: its presence
                               means the tar is complete)
    layers/<key>.<id>.tar.zst  the layer compressed by compressor ``id`` (``image/compress.py``),
    layers/<key>.<id>.json     and its blob digest and size (written after the blob)
    locks/                     flock files: one per layer key, one for importing into storage,
                               cache.lock (shared by running builds, exclusive for ``cache gc``)
    tmp/<pid>-<random>/        work directories; a dead pid's are removed by the next build

Only bytes whose sha256 the lock knows are fetched; each is checked before it enters the cache
(a mismatch raises ``HashMismatch``). Everything enters by atomic rename, so concurrent builds
sharing a cache see a file whole or not at all.
"""
