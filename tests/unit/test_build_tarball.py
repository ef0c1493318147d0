"""image/tarball.py: deterministic layer tars."""

import hashlib
import io
import os
import tarfile

from envspec.image.tarball import DIRECT_FILE_MIN, TarWriter


def _tree(root):
    (root / "b").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "b" / "x.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "b" / "x.sh", 0o755)
    os.link(root / "a.txt", root / "b" / "hard.txt")
    os.symlink("../a.txt", root / "b" / "link")
    long = root / ("d" * 120)
    long.mkdir()
    (long / ("f" * 120)).write_text("long")


def _write(src, out, **kw):
    w = TarWriter(out, **kw)
    w.add_tree(src, "/root", keep_owners=False)
    return w.close()


def test_same_tree_same_bytes_whatever_the_mtimes(tmp_path):
    _tree(tmp_path / "t1")
    r1 = _write(tmp_path / "t1", tmp_path / "1.tar")
    for p in (tmp_path / "t1").rglob("*"):
        os.utime(p, (12345, 12345), follow_symlinks=False)
    r2 = _write(tmp_path / "t1", tmp_path / "2.tar")
    assert r1 == r2
    assert r1.diff_id == "sha256:" + hashlib.sha256((tmp_path / "1.tar").read_bytes()).hexdigest()
    assert r1.size == (tmp_path / "1.tar").stat().st_size


def test_entries_are_sorted_parents_first_normalised(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    _tree(tmp_path / "t")
    _write(tmp_path / "t", tmp_path / "o.tar")
    with tarfile.open(tmp_path / "o.tar") as tf:
        members = tf.getmembers()
    names = [m.name for m in members]
    assert names[0] == "root"
    assert names.index("root/b") < names.index("root/b/x.sh")
    assert all(
        m.mtime == 1700000000 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == ""
        for m in members
    )
    by = {m.name: m for m in members}
    assert by["root/b/x.sh"].mode == 0o755
    assert by["root/b/link"].issym() and by["root/b/link"].linkname == "../a.txt"
    assert by["root/b/hard.txt"].islnk() and by["root/b/hard.txt"].linkname == "root/a.txt"
    assert ("root/" + "d" * 120 + "/" + "f" * 120) in by  # GNU long names
    raw = (tmp_path / "o.tar").read_bytes()
    assert b"PaxHeader" not in raw and raw.endswith(b"\0" * 1024)


def test_owners_kept_or_overridden(tmp_path):
    (tmp_path / "t" / "workspace").mkdir(parents=True)
    w = TarWriter(tmp_path / "o.tar")
    w.add_tree(tmp_path / "t", "/", owners={"/workspace": (1000, 1000)})
    w.close()
    with tarfile.open(tmp_path / "o.tar") as tf:
        ws = tf.getmember("workspace")
    assert (ws.uid, ws.gid) == (1000, 1000)


def test_a_short_stream_is_an_error_and_abort_removes_the_file(tmp_path):
    import io

    import pytest

    w = TarWriter(tmp_path / "o.tar")
    with pytest.raises(ValueError):
        w.add_file("x", io.BytesIO(b"abc"), 10)
    w.abort()
    assert not (tmp_path / "o.tar").exists()


def _entries(root):
    """path, mode, owner, size, mtime and link target of everything under root (root excluded)."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out.append(
                (
                    os.path.relpath(p, root),
                    st.st_mode,
                    st.st_uid,
                    st.st_gid,
                    0 if os.path.isdir(p) and not os.path.islink(p) else st.st_size,
                    st.st_mtime_ns,
                    os.readlink(p) if os.path.islink(p) else "",
                    st.st_ino if st.st_nlink > 1 and not os.path.isdir(p) else 0,
                )
            )
    return sorted(out)


def test_a_tree_beside_the_tar_is_what_untarring_the_tar_makes(tmp_path):
    """A staged import takes the files a wheel layer's maker made beside its tar instead of
    untarring it (image/importer.py): they must be what an untar of that tar makes."""
    _tree(tmp_path / "src")
    (tmp_path / "made").mkdir()
    w = TarWriter(tmp_path / "t.tar", tree=tmp_path / "made")
    w.add_tree(tmp_path / "src", "/root", keep_owners=False)
    w.add_file("/opt/venv/bin/tool", None, 3, data=b"abc", mode=0o4755)  # set-id bits kept
    w.add_file("/opt/venv/lib/m.py", None, 2, data=b"x\n", mode=0o600, uid=1000, gid=1000)
    big = os.urandom(DIRECT_FILE_MIN + 12345)  # a library: written past the page cache, same result
    w.add_file("/opt/venv/lib/libbig.so", io.BytesIO(big), len(big), mode=0o755, uid=1000)
    res = w.close()
    assert (tmp_path / "made" / "opt/venv/lib/libbig.so").read_bytes() == big
    with open(tmp_path / "t.tar", "rb") as f:
        assert (
            "sha256:" + hashlib.sha256(f.read()).hexdigest() == res.diff_id
        )  # the tar is unchanged by it
    (tmp_path / "untarred").mkdir()
    with tarfile.open(tmp_path / "t.tar") as tf:
        tf.extractall(tmp_path / "untarred", numeric_owner=True)
    made, untarred = _entries(tmp_path / "made"), _entries(tmp_path / "untarred")

    # hardlinks: the same inode within each tree (inode numbers differ between the two)
    def comparable(
        e,
    ):  # Python's tarfile leaves a symlink's own times (containers/storage sets them)
        return e[:5] + ((0,) if e[6] else (e[5],)) + e[6:7]

    assert [comparable(e) for e in made] == [comparable(e) for e in untarred]
    links = [e[0] for e in made if e[7]]
    assert sorted(links) == ["root/a.txt", "root/b/hard.txt"]
    assert {e[5] for e in made} == {w.mtime * 1_000_000_000}
    assert w.uids == {0, 1000} and w.gids == {0, 1000}


# --- the layer file written past the page cache, and the tee to the store's stager ------------------

import errno  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from envspec.image.tarball import DirectFile, PipeTee  # noqa: E402


@pytest.mark.parametrize(
    "size", [0, 1, 4095, 4096, 4097, DirectFile.BUF - 1, DirectFile.BUF, 3 * DirectFile.BUF + 12345]
)
def test_direct_file_holds_exactly_the_bytes_written_in_any_pieces(tmp_path, size):
    data = os.urandom(size)
    f = DirectFile.open(tmp_path / "o.bin")
    i, step = 0, 1
    while i < size:  # pieces of every size, none aligned
        f.write(data[i : i + step])
        i += step
        step = step * 7 % 3_000_001 + 1
    f.close()
    assert (tmp_path / "o.bin").read_bytes() == data


def test_direct_file_is_used_where_o_direct_works_and_a_plain_file_where_refused(
    tmp_path, monkeypatch
):
    f = DirectFile.open(tmp_path / "a")  # /tmp and the cache take O_DIRECT here
    assert f.direct
    f.close()
    real = os.open

    def refuse(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *a)

    monkeypatch.setattr(os, "open", refuse)
    f = DirectFile.open(tmp_path / "b")
    assert not f.direct
    f.write(b"abc" * 5_000_000)
    f.close()
    assert (tmp_path / "b").read_bytes() == b"abc" * 5_000_000
    monkeypatch.undo()
    monkeypatch.setenv("ENVSPEC_DIRECT_WRITE", "off")
    f = DirectFile.open(tmp_path / "c")
    assert not f.direct
    f.close()


def test_direct_file_reports_a_failed_write(tmp_path, monkeypatch):
    f = DirectFile.open(tmp_path / "o.bin")
    real = os.write
    monkeypatch.setattr(
        os,
        "write",
        lambda fd, b: (
            (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left"))
            if fd == f.fd
            else real(fd, b)
        ),
    )
    with pytest.raises(OSError, match="No space"):
        f.write(b"x" * (2 * DirectFile.BUF + 1))
        f.close()


def _fifo_reader(path, got: bytearray, stop_after: int | None = None) -> threading.Thread:
    fd = os.open(
        path, os.O_RDONLY | os.O_NONBLOCK
    )  # as the importer opens it: before the maker writes
    os.set_blocking(fd, True)

    def run():
        with os.fdopen(fd, "rb", buffering=0) as r:
            while True:
                chunk = r.read(65536)
                if not chunk:  # no writer: not yet (wait, as the stager does), or done
                    if got:
                        return
                    time.sleep(0.001)
                    continue
                got.extend(chunk)
                if stop_after is not None and len(got) >= stop_after:
                    return  # the stager went away

    t = threading.Thread(target=run)
    t.start()
    return t


def _piped(tmp_path, big: int, stop_after: int | None = None):
    """A layer of a small tree and one ``big`` file written with a FIFO that a stager-like reader
    reads (up to ``stop_after`` bytes): (its result, what the reader got)."""
    _tree(tmp_path / "t")
    (tmp_path / "t" / "big").write_bytes(os.urandom(big))
    fifo = tmp_path / "o.tar.fifo"
    os.mkfifo(fifo)
    got = bytearray()
    reader = _fifo_reader(fifo, got, stop_after=stop_after)
    res = _write(tmp_path / "t", tmp_path / "o.tar", pipe=fifo)
    reader.join()
    assert res == _write(tmp_path / "t", tmp_path / "plain.tar")  # the same layer as without a FIFO
    return res, bytes(got)


def test_a_layer_written_with_a_pipe_sends_the_stager_the_tar_byte_for_byte(tmp_path):
    _, got = _piped(tmp_path, 3_000_000)
    assert got == (tmp_path / "o.tar").read_bytes()


def test_a_stager_that_stops_reading_ends_the_tee_not_the_layer(tmp_path):
    res, got = _piped(tmp_path, 5_000_000, stop_after=100_000)
    assert 100_000 <= len(got) < res.size


def test_a_fifo_removed_before_any_stager_opened_it_leaves_the_maker_writing_the_file_alone(
    tmp_path,
):
    _tree(tmp_path / "t")
    fifo = tmp_path / "o.tar.fifo"
    os.mkfifo(fifo)
    threading.Timer(0.3, fifo.unlink).start()  # the importer ended before it staged this layer
    res = _write(tmp_path / "t", tmp_path / "o.tar", pipe=fifo)
    assert res == _write(tmp_path / "t", tmp_path / "plain.tar")
    assert PipeTee(tmp_path / "gone.fifo").fd == -1


def test_a_fifo_nobody_opens_is_an_error_after_the_wait(tmp_path):
    fifo = tmp_path / "o.tar.fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="no stager opened"):
        PipeTee(fifo, wait=0.2)
