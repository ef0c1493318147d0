// envspec-put-layer stores layer tars in containers-storage with the diff digest the caller
// already knows, so containers/storage does not hash the bytes again: the one thing its own
// command line tool (`containers-storage import-layer`) cannot be told. containers/image passes
// the digests the same way when it pulls a layer it has verified itself.
//
//	envspec-put-layer --graph DIR --run DIR [--storage-driver overlay] --id ID [--parent ID]
//	    --diff-digest sha256:HEX [--file TAR] < TAR
//
// stores one layer (PutLayer: the store stays locked while it is untarred) and prints it as JSON.
//
// Or in two steps, so that a layer is untarred while it is still being written and before its
// parent is in the store (the layer's ID, a chain of diff digests, is known only at the end):
//
//	envspec-put-layer stage --graph DIR (--fd N | --file TAR) [--follow] [--size N] [--tree DIR] [--own]
//
// untars the tar into a directory of its own under DIR/DRIVER/envspec-staging, without taking the
// store's lock, as containers/storage's overlay driver would untar it into a layer (the same
// untar, options and tar-split record). stdout: "staging PATH", then "progress N" lines, then
// one JSON line {staging, tar_split, size, uids, gids, root_set}. --follow: the file is
// still being written; at its end this waits for more until a line "end SIZE" comes on stdin
// (stdin closed without it: the maker failed; the staging directory is removed, exit 1).
// --tree: the layer's maker wrote its files into that staging directory itself, beside the tar
// (as the untar would have made them); only the tar-split record and the uid/gid log are made.
// --own: envspec's maker is writing this tar in this build (not a cached or pulled one): the untar
// runs in this process instead of a chrooted child (the same archive.Unpack and options).
//
//	envspec-put-layer commit --graph DIR --run DIR [--storage-driver overlay] --id ID [--parent ID]
//	    --diff-digest sha256:HEX --staged JSON
//
// makes the layer from a staged directory (JSON: what stage printed last): creates the layer
// record, copies the tar-split record in, moves the directory in (a rename), and sets the digest.
// A layer of that ID already stored with that digest is kept and the staged one removed.
//
//	envspec-put-layer prepare --graph DIR --run DIR [--storage-driver overlay]
//
// runs the driver's checks that mount a test overlay (whether the kernel can shift the IDs of a
// lower layer: the overlay driver asks it when it makes its first layer, and records the answer
// under the run root), so that they run before the layers are untarred: unmounting an overlay
// syncs the file system under it, and with gigabytes of staged files still to be written back
// that took seconds in the first commit (issue 44). Nothing is printed.
//
// Exit status: 0 stored, 1 failed (the partial layer and the staging directory are gone), 2 bad
// arguments. envspec checks the digest itself: it made the tar and hashed it while writing, or
// hashes a cached tar (with OpenSSL, three times Go's sha256 here) while it is staged.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/vbatts/tar-split/archive/tar"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containers/storage"
	drivers "github.com/containers/storage/drivers"
	"github.com/containers/storage/pkg/archive"
	"github.com/containers/storage/pkg/chrootarchive"
	"github.com/containers/storage/pkg/ioutils"
	"github.com/containers/storage/pkg/reexec"
	"github.com/klauspost/pgzip"
	digest "github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
	tsstorage "github.com/vbatts/tar-split/tar/storage"
)

// ISA-L's CRC-64 (Debian's libisal-dev): the tar-split record holds the CRC-64 (ISO polynomial,
// reflected, Go's hash/crc64 with crc64.ISO) of every file's bytes; Go 1.19's table-driven one
// runs at 1.4 GB/s here, ISA-L's carry-less multiplication at 16 GB/s, with the same result
// (tests/e2e: the stored layer reassembles byte for byte).

/*
#cgo LDFLAGS: -lisal
#include <isa-l/crc64.h>
*/
import "C"

import "unsafe"

// isalCRC64 is hash.Hash64's part that tar-split's putter uses: Write, then Sum.
type isalCRC64 struct{ crc uint64 }

func (h *isalCRC64) Write(p []byte) (int, error) {
	if len(p) > 0 {
		h.crc = uint64(C.crc64_iso_refl(C.uint64_t(h.crc), (*C.uchar)(unsafe.Pointer(&p[0])), C.uint64_t(len(p))))
	}
	return len(p), nil
}

// Sum appends the big-endian CRC, as hash/crc64's digest does.
func (h *isalCRC64) Sum(b []byte) []byte {
	s := h.crc
	return append(b, byte(s>>56), byte(s>>48), byte(s>>40), byte(s>>32), byte(s>>24), byte(s>>16), byte(s>>8), byte(s))
}

// crcPutter is tar-split's storage.FilePutter that keeps nothing (its NewDiscardFilePutter)
// with ISA-L's CRC-64.
type crcPutter struct{ buf []byte }

func (c *crcPutter) Put(name string, r io.Reader) (int64, []byte, error) {
	if c.buf == nil {
		c.buf = make([]byte, 1<<20)
	}
	h := &isalCRC64{}
	n, err := io.CopyBuffer(h, r, c.buf)
	return n, h.Sum(nil), err
}

func main() {
	if reexec.Init() { // the untar runs in a re-executed copy of this binary, chrooted
		return
	}
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "stage":
			os.Exit(stage(os.Args[2:]))
		case "commit":
			os.Exit(commit(os.Args[2:]))
		case "prepare":
			os.Exit(prepare(os.Args[2:]))
		}
	}
	os.Exit(put(os.Args[1:]))
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "envspec-put-layer:", err)
	return 1
}

func usage(msg string) int {
	fmt.Fprintln(os.Stderr, "envspec-put-layer:", msg)
	return 2
}

type storeFlags struct {
	graph, runroot, driver, id, parent, diff *string
}

func addStoreFlags(flags *flag.FlagSet) storeFlags {
	return storeFlags{
		graph:   flags.String("graph", "", "the store's graph root"),
		runroot: flags.String("run", "", "the store's run root"),
		driver:  flags.String("storage-driver", "overlay", "the store's driver"),
		id:      flags.String("id", "", "the layer's ID"),
		parent:  flags.String("parent", "", "the parent layer's ID"),
		diff:    flags.String("diff-digest", "", "sha256 of the uncompressed tar"),
	}
}

func (s storeFlags) check() (digest.Digest, bool) {
	d, err := digest.Parse(*s.diff)
	if *s.graph == "" || *s.runroot == "" || *s.id == "" || err != nil || d.Algorithm() != digest.SHA256 {
		return "", false
	}
	return d, true
}

func (s storeFlags) open() (storage.Store, error) {
	return storage.GetStore(storage.StoreOptions{GraphRoot: *s.graph, RunRoot: *s.runroot, GraphDriverName: *s.driver})
}

// prepare: the driver's mounting checks, before any layer is untarred (see the top).
func prepare(args []string) int {
	flags := flag.NewFlagSet("envspec-put-layer prepare", flag.ContinueOnError)
	sf := addStoreFlags(flags)
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *sf.graph == "" || *sf.runroot == "" {
		return usage("prepare: --graph and --run are required")
	}
	store, err := sf.open()
	if err != nil {
		return fail(err)
	}
	defer store.Shutdown(false)
	drv, err := store.GraphDriver()
	if err != nil {
		return fail(err)
	}
	drv.SupportsShifting()
	return 0
}

// put: the whole layer in one PutLayer call.
func put(args []string) int {
	flags := flag.NewFlagSet("envspec-put-layer", flag.ContinueOnError)
	sf := addStoreFlags(flags)
	file := flags.String("file", "", "the tar (default: standard input)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	d, ok := sf.check()
	if !ok {
		return usage("--graph, --run, --id and --diff-digest sha256:<64 hex> are required")
	}
	var in io.Reader = os.Stdin
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		in = f
	}
	store, err := sf.open()
	if err != nil {
		return fail(err)
	}
	defer store.Shutdown(false)
	opts := &storage.LayerOptions{OriginalDigest: d, UncompressedDigest: d}
	layer, _, err := store.PutLayer(*sf.id, *sf.parent, nil, "", false, opts, in)
	if err != nil {
		return fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(layer); err != nil {
		return 1
	}
	return 0
}

// Staged is what stage prints last and commit reads.
type Staged struct {
	Staging  string   `json:"staging"`
	TarSplit string   `json:"tar_split"`
	Size     int64    `json:"size"`
	UIDs     []uint32 `json:"uids"`
	GIDs     []uint32 `json:"gids"`
	RootSet  bool     `json:"root_set"` // the tar has an entry for its root (it set the directory's mode)
}

// follower reads a file that another process is still writing: at its current end it waits
// for more, until it is told the final size.
type follower struct {
	f      *os.File
	off    int64
	mu     sync.Mutex
	final  int64 // -1: not known yet
	closed bool  // the control stream ended without a size
}

func (r *follower) end() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.final, r.closed
}

func (r *follower) Read(p []byte) (int, error) {
	for {
		final, closed := r.end()
		if final >= 0 && r.off >= final {
			if r.off > final {
				return 0, fmt.Errorf("the tar is longer (%d bytes) than its maker says (%d)", r.off, final)
			}
			return 0, io.EOF
		}
		want := p
		if final >= 0 && int64(len(want)) > final-r.off {
			want = want[:final-r.off]
		}
		n, err := r.f.Read(want)
		r.off += int64(n)
		if n > 0 {
			return n, nil
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		switch {
		case final >= 0: // told the size, and the file ends before it
			return 0, fmt.Errorf("the tar ends at %d bytes, before the %d its maker says", r.off, final)
		case closed:
			return 0, errors.New("the layer's maker stopped before the end of the tar")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counter counts what passes, and reports progress every 64 MiB.
type counter struct {
	n, next int64
	w       io.Writer
	report  func(int64)
}

func (c *counter) Write(p []byte) (int, error) {
	c.w.Write(p)
	c.n += int64(len(p))
	if c.n >= c.next {
		c.report(c.n)
		c.next = c.n + 64<<20
	}
	return len(p), nil
}

func stage(args []string) int {
	flags := flag.NewFlagSet("envspec-put-layer stage", flag.ContinueOnError)
	graph := flags.String("graph", "", "the store's graph root")
	driver := flags.String("storage-driver", "overlay", "the store's driver")
	fd := flags.Int("fd", -1, "the tar as an open file descriptor")
	file := flags.String("file", "", "the tar")
	follow := flags.Bool("follow", false, "the tar is still being written: wait for 'end SIZE' on stdin")
	size := flags.Int64("size", -1, "the tar's size (checked)")
	tree := flags.String("tree", "", "the layer's files are there already (made beside the tar): record only its tar-split")
	own := flags.Bool("own", false, "envspec's maker is writing this tar in this build: untar it in this process, not in a chrooted child")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *graph == "" || (*fd < 0) == (*file == "") {
		return usage("stage: --graph and one of --fd or --file are required")
	}
	var f *os.File
	if *fd >= 0 {
		f = os.NewFile(uintptr(*fd), "tar")
	} else {
		var err error
		if f, err = os.Open(*file); err != nil {
			return fail(err)
		}
	}
	defer f.Close()
	in := &follower{f: f, final: *size}
	if *follow {
		go func() { // the control stream: "end SIZE" once the maker has closed the file
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				if line := sc.Text(); strings.HasPrefix(line, "end ") {
					if n, err := strconv.ParseInt(strings.TrimSpace(line[4:]), 10, 64); err == nil && n >= 0 {
						in.mu.Lock()
						in.final = n
						in.mu.Unlock()
						return
					}
				}
			}
			in.mu.Lock()
			in.closed = true
			in.mu.Unlock()
		}()
	} else if *size < 0 {
		st, err := f.Stat()
		if err != nil {
			return fail(err)
		}
		in.final = st.Size()
	}

	root := stagingRoot(*graph, *driver)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fail(err)
	}
	var dir string
	var err error
	if *tree != "" { // envspec wrote the files itself: they are its to remove
		if filepath.Dir(*tree) != root {
			return usage("stage: --tree must be a directory in " + root)
		}
		dir = *tree
	} else if dir, err = os.MkdirTemp(root, fmt.Sprintf("%d-", os.Getpid())); err != nil {
		return fail(err)
	}
	tsPath := dir + ".tar-split.gz"
	done := false
	defer func() {
		if !done {
			if *tree == "" {
				os.RemoveAll(dir)
			}
			os.Remove(tsPath)
		}
	}()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "staging %s\n", dir)
	out.Flush()

	ts, err := os.OpenFile(tsPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fail(err)
	}
	defer ts.Close()
	// what containers/storage's applyDiffWithOptions does around the driver's untar
	compressor, err := pgzip.NewWriterLevel(ts, pgzip.BestSpeed)
	if err != nil {
		return fail(err)
	}
	if err := compressor.SetConcurrency(1024*1024, 1); err != nil {
		return fail(err)
	}
	uids, gids := map[uint32]struct{}{}, map[uint32]struct{}{}
	rootSet := false
	// what containers/storage's tarlog records (the owners each entry names, whether the tar sets
	// its root), read from the headers the tar-split pass parses anyway, not by a second parse
	logHeader := func(h *tar.Header) {
		if n := strings.Trim(h.Name, "/"); n == "" || n == "." {
			rootSet = true
		}
		if !strings.HasPrefix(filepath.Base(h.Name), archive.WhiteoutPrefix) {
			uids[uint32(h.Uid)] = struct{}{}
			gids[uint32(h.Gid)] = struct{}{}
		}
	}
	cnt := &counter{w: io.Discard, report: func(n int64) {
		fmt.Fprintf(out, "progress %d\n", n)
		out.Flush()
	}}
	// buffered: the tar reader asks for 512-byte headers, and each read of the file is a syscall
	src := io.TeeReader(bufio.NewReaderSize(in, 1<<20), cnt)
	opts := &archive.TarOptions{WhiteoutFormat: archive.OverlayWhiteoutFormat}
	var untarred chan error
	var toUntar *os.File
	if *tree == "" {
		// A tar from elsewhere (the layer cache, a registry) is untarred chrooted into the staging
		// directory, as containers/storage's overlay driver does, so that no entry reaches outside
		// it before the tar's digest is checked. One envspec is making now holds only the wheels'
		// files and directories under paths it chose; untarring it here saves the copy of every
		// byte through a pipe into a child (2 of 11 CPU-s for h100-train's torch layer).
		// The untar reads a pipe of 1 MiB that the tar-split pass below writes every byte into
		// as it reads it, one copy and few wake-ups (issue 44: a tenth of the stager's CPU went
		// to handing the bytes between goroutines and a 64 KiB pipe).
		pr, pw, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		_, _ = unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, 1<<20) // best effort: a smaller pipe works too
		toUntar = pw
		untar := chrootarchive.UntarUncompressed
		if *own {
			untar = archive.UntarUncompressed
		}
		untarred = make(chan error, 1)
		go func() {
			err := untar(pr, dir, opts)
			if err == nil { // the padding after the tar's end: read, so the writer never blocks on it
				_, err = io.Copy(io.Discard, pr)
			}
			pr.Close() // a writer still writing (the untar failed) gets EPIPE, not a wait
			untarred <- err
		}()
		src = io.TeeReader(src, pw)
	}
	err = disassemble(src, tsstorage.NewJSONPacker(compressor), &crcPutter{}, logHeader)
	if toUntar != nil {
		toUntar.Close()
		if uerr := <-untarred; uerr != nil {
			return fail(uerr) // the untar's own error says more than a broken pipe
		}
	}
	if err != nil {
		return fail(err)
	}
	if err := compressor.Close(); err != nil {
		return fail(err)
	}
	if err := ts.Close(); err != nil {
		return fail(err)
	}
	res := Staged{Staging: dir, TarSplit: tsPath, Size: cnt.n,
		UIDs: sorted(uids), GIDs: sorted(gids), RootSet: rootSet}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return 1
	}
	if err := out.Flush(); err != nil {
		return 1
	}
	done = true
	return 0
}

// disassemble reads the tar r to its end and packs its tar-split record into p, as tar-split's
// asm.NewInputTarStream does (the same entries in the same order: the raw header bytes as
// segments, each file's name, size and CRC-64, the padding and whatever follows the tar's end),
// but in this goroutine and with every header handed to logHeader: no pipe to another goroutine
// for the bytes, no second parse of the tar for its owners.
func disassemble(r io.Reader, p tsstorage.Packer, fp tsstorage.FilePutter, logHeader func(*tar.Header)) error {
	segment := func(b []byte) error {
		if len(b) == 0 {
			return nil
		}
		_, err := p.AddEntry(tsstorage.Entry{Type: tsstorage.SegmentType, Payload: b})
		return err
	}
	tr := tar.NewReader(r)
	tr.RawAccounting = true
	for {
		hdr, err := tr.Next()
		if err == io.EOF || (err == nil && hdr == nil) {
			if err := segment(tr.RawBytes()); err != nil { // the end: its blocks of zeros
				return err
			}
			break
		}
		if err != nil {
			return err
		}
		logHeader(hdr)
		if err := segment(tr.RawBytes()); err != nil {
			return err
		}
		var csum []byte
		if hdr.Size > 0 {
			if _, csum, err = fp.Put(hdr.Name, tr); err != nil {
				return err
			}
		}
		entry := tsstorage.Entry{Type: tsstorage.FileType, Size: hdr.Size, Payload: csum}
		entry.SetName(hdr.Name)
		if _, err := p.AddEntry(entry); err != nil {
			return err
		}
		if err := segment(tr.RawBytes()); err != nil {
			return err
		}
	}
	// what follows the tar's end (more zeros, or anything) is part of its bytes: kept, in pieces
	buf := make([]byte, 1<<20)
	for {
		n, err := r.Read(buf)
		if err != nil && err != io.EOF {
			return err
		}
		if _, aerr := p.AddEntry(tsstorage.Entry{Type: tsstorage.SegmentType, Payload: buf[:n]}); aerr != nil {
			return aerr
		}
		if err == io.EOF {
			return nil
		}
	}
}

// stagingRoot: beside the driver's layer directories (a rename into one of them must not cross
// the private mount overlay puts on its home), but not the driver's own staging directory.
func stagingRoot(graph, driver string) string {
	return filepath.Join(graph, driver, "envspec-staging")
}

func sorted(m map[uint32]struct{}) []uint32 {
	out := make([]uint32, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func commit(args []string) int {
	flags := flag.NewFlagSet("envspec-put-layer commit", flag.ContinueOnError)
	sf := addStoreFlags(flags)
	stagedJSON := flags.String("staged", "", "what `stage` printed last")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	d, ok := sf.check()
	var st Staged
	if !ok || json.Unmarshal([]byte(*stagedJSON), &st) != nil || st.Staging == "" {
		return usage("commit: --graph, --run, --id, --diff-digest sha256:<64 hex> and --staged JSON are required")
	}
	defer os.RemoveAll(st.Staging) // gone once moved in; removed on any failure
	defer os.Remove(st.TarSplit)
	if filepath.Dir(st.Staging) != stagingRoot(*sf.graph, *sf.driver) {
		return usage("commit: --staged names a directory that stage did not make in this store")
	}
	store, err := sf.open()
	if err != nil {
		return fail(err)
	}
	defer store.Shutdown(false)
	layer, err := store.CreateLayer(*sf.id, *sf.parent, nil, "", false, nil)
	if errors.Is(err, storage.ErrDuplicateID) {
		if have, err2 := store.Layer(*sf.id); err2 == nil && have.UncompressedDigest == d {
			json.NewEncoder(os.Stdout).Encode(have)
			return 0
		}
	}
	if err != nil {
		return fail(err)
	}
	ok = false
	defer func() {
		if !ok {
			store.DeleteLayer(layer.ID)
		}
	}()
	// containers/storage keeps each layer's tar-split record beside layers.json (layers.go's
	// tspath); `store.Diff` rebuilds our exact tar from it and the files
	// (a copy: it is small, and a rename would cross overlay's private mount of its home)
	tsdata, err := os.ReadFile(st.TarSplit)
	if err != nil {
		return fail(err)
	}
	if err := ioutils.AtomicWriteFile(filepath.Join(*sf.graph, *sf.driver+"-layers", layer.ID+".tar-split.gz"), tsdata, 0o600); err != nil {
		return fail(err)
	}
	if !st.RootSet { // the untar left our directory's mode: take the one the driver gave the layer
		diff, err := store.DifferTarget(layer.ID)
		if err != nil {
			return fail(err)
		}
		fi, err := os.Stat(diff)
		if err != nil {
			return fail(err)
		}
		if err := os.Chmod(st.Staging, fi.Mode().Perm()); err != nil {
			return fail(err)
		}
	}
	staging := filepath.Join(*sf.graph, *sf.driver, "staging")
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return fail(err)
	}
	moved := filepath.Join(staging, "envspec-"+filepath.Base(st.Staging))
	if err := os.Rename(st.Staging, moved); err != nil {
		return fail(err)
	}
	defer os.RemoveAll(moved)
	out := &drivers.DriverWithDifferOutput{Size: st.Size, UIDs: st.UIDs, GIDs: st.GIDs, UncompressedDigest: d}
	if err := store.ApplyDiffFromStagingDirectory(layer.ID, moved, out, nil); err != nil {
		return fail(err)
	}
	stored, err := store.Layer(layer.ID)
	if err != nil {
		return fail(err)
	}
	ok = true
	if err := json.NewEncoder(os.Stdout).Encode(stored); err != nil {
		return 1
	}
	return 0
}
