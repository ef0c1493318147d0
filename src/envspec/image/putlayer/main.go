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
// The tar is read once: the untar (in a re-executed copy of this binary chrooted into the staging
// directory) and the tar-split pass read the same chunks from memory, in the same process.
// --own: envspec's maker is writing this tar in this build (not a cached or pulled one): the untar
// runs in this process instead of a chrooted child (the same archive.Unpack and options).
//
//	envspec-put-layer commit --graph DIR --run DIR [--storage-driver overlay] --id ID [--parent ID]
//	    --diff-digest sha256:HEX --staged JSON
//
// makes the layer from a staged directory (JSON: what stage printed last): creates the layer
// record, copies the tar-split record in, moves the directory in (a rename), and sets the digest.
// A layer of that ID already stored with that digest is kept and the staged one removed; one left
// without content by a killed import is made again. Prints the layer's record, with
// "envspec-existing" true where it was kept.
//
//	envspec-put-layer prepare --graph DIR --run DIR [--storage-driver overlay]
//
//	envspec-put-layer image --graph DIR --run DIR [--storage-driver overlay] --id ID --digest sha256:HEX
//	    --top LAYER --name REF --data KEY=FILE ...
//
// makes the image ID on its top layer (unless it is there), stores each FILE as its big data KEY
// (its digest the sha256 of the bytes), and adds the name REF (taken from any other image): what
// `containers-storage create-image`, `set-image-data` and `add-names` do, in one opening of the
// store instead of six processes at the end of every build (issue 44).
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
// arguments, 3 (commit) the staged files were removed by another process using the store before
// they were in the layer (stage the layer again). envspec checks the digest itself: it made the tar and hashed it while writing, or
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
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containers/storage"
	drivers "github.com/containers/storage/drivers"
	"github.com/containers/storage/pkg/archive"
	"github.com/containers/storage/pkg/ioutils"
	"github.com/containers/storage/pkg/reexec"
	"github.com/klauspost/pgzip"
	digest "github.com/opencontainers/go-digest"
	tsstorage "github.com/vbatts/tar-split/tar/storage"
	"golang.org/x/sys/unix"
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
		case "image":
			os.Exit(image(os.Args[2:]))
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

// dataFlags is a repeated KEY=FILE flag.
type dataFlags []string

func (d *dataFlags) String() string     { return strings.Join(*d, ",") }
func (d *dataFlags) Set(v string) error { *d = append(*d, v); return nil }

// image: the image record, its big data and its name (see the top).
func image(args []string) int {
	flags := flag.NewFlagSet("envspec-put-layer image", flag.ContinueOnError)
	sf := addStoreFlags(flags)
	mdigest := flags.String("digest", "", "the manifest's digest")
	top := flags.String("top", "", "the image's top layer")
	name := flags.String("name", "", "the name to give the image")
	var data dataFlags
	flags.Var(&data, "data", "KEY=FILE: a big data item (repeatable)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	md, err := digest.Parse(*mdigest)
	if *sf.graph == "" || *sf.runroot == "" || *sf.id == "" || *top == "" || err != nil {
		return usage("image: --graph, --run, --id, --digest sha256:<64 hex> and --top are required")
	}
	items := map[string][]byte{}
	keys := []string{}
	for _, kv := range data {
		k, file, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return usage("image: --data takes KEY=FILE")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return fail(err)
		}
		items[k] = b
		keys = append(keys, k)
	}
	store, err := sf.open()
	if err != nil {
		return fail(err)
	}
	defer store.Shutdown(false)
	if _, err := store.Image(*sf.id); err != nil {
		if _, cerr := store.CreateImage(*sf.id, nil, *top, "{}", &storage.ImageOptions{Digest: md}); cerr != nil {
			if _, err2 := store.Image(*sf.id); err2 != nil { // not made by another build meanwhile
				return fail(cerr)
			}
		}
	}
	sha := func(b []byte) (digest.Digest, error) { return digest.Canonical.FromBytes(b), nil }
	for _, k := range keys {
		if err := store.SetImageBigData(*sf.id, k, items[k], sha); err != nil {
			return fail(err)
		}
	}
	if *name != "" {
		names, err := store.Names(*sf.id)
		if err != nil {
			return fail(err)
		}
		if err := store.SetNames(*sf.id, append(append([]string{}, names...), *name)); err != nil {
			return fail(err)
		}
	}
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

	root := stagingRoot(*graph, *driver)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fail(err)
	}
	spreadDirs(root)
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
	job := stageJob{src: f, follow: *follow, size: *size, split: ts, out: out}
	var st staged
	switch {
	case *tree != "":
		st, err = job.run()
	case *own:
		job.dest = dir
		st, err = job.run()
	default:
		st, err = job.chrooted(dir)
	}
	if err != nil {
		return fail(err)
	}
	if err := ts.Close(); err != nil {
		return fail(err)
	}
	res := Staged{Staging: dir, TarSplit: tsPath, Size: st.Size, UIDs: st.UIDs, GIDs: st.GIDs, RootSet: st.RootSet}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return 1
	}
	if err := out.Flush(); err != nil {
		return 1
	}
	done = true
	return 0
}

// staged is what one pass over a layer's tar learns: its size and what containers/storage's
// tarlog records (the owners each entry names, whether the tar sets its root).
type staged struct {
	Size    int64    `json:"size"`
	UIDs    []uint32 `json:"uids"`
	GIDs    []uint32 `json:"gids"`
	RootSet bool     `json:"root_set"`
}

// stageJob: one pass over the tar at src that writes its tar-split record (gzip) into split and,
// where dest is set, untars it there; "progress N" lines go to out.
type stageJob struct {
	src    *os.File
	follow bool  // src is still being written: "end SIZE" comes on stdin
	size   int64 // -1: src's size now (not following), or unknown until "end"
	split  *os.File
	out    *bufio.Writer
	dest   string
}

const untarChild = "envspec-stage-untar"

func init() {
	reexec.Register(untarChild, untarMain)
}

// chrooted runs the job in a re-executed copy of this binary chrooted into dir, as
// containers/storage's overlay driver untars a layer (chrootarchive), so that no entry of a tar
// from elsewhere (the layer cache, a registry) reaches outside dir before its digest is checked.
// Unlike chrootarchive, the child reads the tar itself and makes the tar-split record in the same
// pass (issue 44: the tar no longer goes through a second pipe, from this process to the untar).
func (j stageJob) chrooted(dir string) (staged, error) {
	rr, rw, err := os.Pipe()
	if err != nil {
		return staged{}, err
	}
	defer rr.Close()
	cmd := reexec.Command(untarChild, dir, strconv.FormatBool(j.follow), strconv.FormatInt(j.size, 10))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{j.src, j.split, rw} // 3: the tar, 4: the tar-split record, 5: the result
	if err := cmd.Start(); err != nil {
		rw.Close()
		return staged{}, fmt.Errorf("starting the chrooted untar: %w", err)
	}
	rw.Close()
	var st staged
	derr := json.NewDecoder(rr).Decode(&st)
	if err := cmd.Wait(); err != nil {
		return staged{}, fmt.Errorf("the chrooted untar failed: %w", err)
	}
	if derr != nil {
		return staged{}, fmt.Errorf("the chrooted untar said nothing: %w", derr)
	}
	return st, nil
}

// untarMain is the child's: chroot into its directory, then the job on the descriptors it was given.
func untarMain() {
	die := func(err error) {
		fmt.Fprintln(os.Stderr, "envspec-put-layer (untar):", err)
		os.Exit(1)
	}
	if len(os.Args) != 4 {
		die(errors.New("usage: DIR FOLLOW SIZE"))
	}
	follow, err1 := strconv.ParseBool(os.Args[2])
	size, err2 := strconv.ParseInt(os.Args[3], 10, 64)
	if err1 != nil || err2 != nil {
		die(errors.New("bad arguments"))
	}
	// A plain chroot: this process runs only the untar, and the tar's entries, not code, are
	// what must not reach outside (every thread of a Go process shares its root: CLONE_FS).
	if err := unix.Chroot(os.Args[1]); err != nil {
		die(err)
	}
	if err := unix.Chdir("/"); err != nil {
		die(err)
	}
	out := bufio.NewWriter(os.Stdout)
	job := stageJob{src: os.NewFile(3, "tar"), follow: follow, size: size, split: os.NewFile(4, "tar-split"),
		out: out, dest: "/"}
	st, err := job.run()
	if err != nil {
		die(err)
	}
	if err := json.NewEncoder(os.NewFile(5, "result")).Encode(st); err != nil {
		die(err)
	}
	os.Exit(0)
}

// run: the pass itself. The tar is read once, in chunks of 1 MiB that the untar and the tar-split
// pass both read from memory (no pipe between them, no copy through the kernel).
func (j stageJob) run() (staged, error) {
	in := &follower{f: j.src, final: j.size}
	if j.follow {
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
	} else if j.size < 0 {
		fi, err := j.src.Stat()
		if err != nil {
			return staged{}, err
		}
		in.final = fi.Size()
	}
	// what containers/storage's applyDiffWithOptions does around the driver's untar
	compressor, err := pgzip.NewWriterLevel(j.split, pgzip.BestSpeed)
	if err != nil {
		return staged{}, err
	}
	if err := compressor.SetConcurrency(1024*1024, 1); err != nil {
		return staged{}, err
	}
	uids, gids := map[uint32]struct{}{}, map[uint32]struct{}{}
	rootSet := false
	// what containers/storage's tarlog records, read from the headers the tar-split pass parses
	// anyway, not by a second parse
	logHeader := func(h *tar.Header) {
		if n := strings.Trim(h.Name, "/"); n == "" || n == "." {
			rootSet = true
		}
		if !strings.HasPrefix(filepath.Base(h.Name), archive.WhiteoutPrefix) {
			uids[uint32(h.Uid)] = struct{}{}
			gids[uint32(h.Gid)] = struct{}{}
		}
	}
	var next, total int64
	progress := func(n int64) {
		total = n
		if n >= next {
			fmt.Fprintf(j.out, "progress %d\n", n)
			j.out.Flush()
			next = n + 64<<20
		}
	}
	packer := tsstorage.NewJSONPacker(compressor)
	if j.dest == "" {
		// buffered: the tar reader asks for 512-byte headers, and each read of the file is a syscall
		src := &countReader{r: bufio.NewReaderSize(in, 1<<20), report: progress}
		err = disassemble(src, packer, &crcPutter{}, logHeader)
	} else {
		err = splitAndUntar(in, j.dest, packer, logHeader, progress)
	}
	if err != nil {
		return staged{}, err
	}
	if err := compressor.Close(); err != nil {
		return staged{}, err
	}
	return staged{Size: total, UIDs: sorted(uids), GIDs: sorted(gids), RootSet: rootSet}, nil
}

// countReader reports the bytes read so far after each read.
type countReader struct {
	r      io.Reader
	n      int64
	report func(int64)
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.report(c.n)
	return n, err
}

// splitAndUntar reads r once and hands every chunk to two readers, each in a goroutine of its
// own: containers/storage's untar into dest (archive.Unpack, the overlay driver's options) and
// the tar-split pass (disassemble). A chunk's buffer is used again once both have read it.
func splitAndUntar(r io.Reader, dest string, p tsstorage.Packer, logHeader func(*tar.Header), progress func(int64)) error {
	const nbuf, size = 8, 1 << 20
	free := make(chan *chunk, nbuf)
	for i := 0; i < nbuf; i++ {
		free <- &chunk{buf: make([]byte, size)}
	}
	abort := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(abort) }) }
	untarIn := &chunkReader{ch: make(chan *chunk, nbuf), free: free, abort: abort}
	splitIn := &chunkReader{ch: make(chan *chunk, nbuf), free: free, abort: abort}

	untarred := make(chan error, 1)
	go func() {
		opts := &archive.TarOptions{WhiteoutFormat: archive.OverlayWhiteoutFormat, ExcludePatterns: []string{}}
		err := archive.Unpack(untarIn, dest, opts)
		if err == nil { // the padding after the tar's end: read, so the reader never waits on it
			_, err = io.Copy(io.Discard, untarIn)
		}
		if err != nil {
			stop()
		}
		untarred <- err
	}()
	split := make(chan error, 1)
	go func() {
		err := disassemble(splitIn, p, &crcPutter{}, logHeader)
		if err != nil {
			stop()
		}
		split <- err
	}()

	var n int64
	var rerr error
read:
	for {
		var c *chunk
		select {
		case c = <-free:
		case <-abort:
			break read
		}
		k, err := io.ReadFull(r, c.buf)
		if k > 0 {
			n += int64(k)
			c.n = k
			atomic.StoreInt32(&c.refs, 2)
			for _, to := range []*chunkReader{untarIn, splitIn} {
				select {
				case to.ch <- c:
				case <-abort:
					break read
				}
			}
			progress(n)
		} else {
			free <- c
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			rerr = err
			stop()
			break
		}
	}
	untarIn.end(rerr)
	splitIn.end(rerr)
	uerr, serr := <-untarred, <-split
	switch {
	case rerr != nil:
		return rerr
	case uerr != nil && uerr != errAborted:
		return uerr // the untar's own error says more than the other side's stop
	case serr != nil && serr != errAborted:
		return serr
	case uerr != nil:
		return uerr
	}
	return serr
}

var errAborted = errors.New("the other reader of the tar failed")

// chunk: a buffer read once from the tar, released when both readers are past it.
type chunk struct {
	buf  []byte
	n    int
	refs int32
}

// chunkReader is one reader's side of splitAndUntar: the chunks in order, then the end.
type chunkReader struct {
	ch    chan *chunk
	free  chan *chunk
	abort chan struct{}
	cur   *chunk
	off   int
	err   error // after the last chunk: io.EOF, or why the tar could not be read (set before ch is closed)
}

func (c *chunkReader) end(err error) {
	if err == nil {
		err = io.EOF
	}
	c.err = err
	close(c.ch)
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for c.cur == nil || c.off == c.cur.n {
		if c.cur != nil {
			c.release()
		}
		select {
		case k, ok := <-c.ch:
			if !ok {
				return 0, c.err
			}
			c.cur, c.off = k, 0
		case <-c.abort:
			return 0, errAborted
		}
	}
	n := copy(p, c.cur.buf[c.off:c.cur.n])
	c.off += n
	return n, nil
}

func (c *chunkReader) release() {
	if atomic.AddInt32(&c.cur.refs, -1) == 0 {
		c.free <- c.cur
	}
	c.cur = nil
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

// fsTopdirFl: ext4's "top of directory hierarchy" inode flag (FS_TOPDIR_FL, `chattr +T`).
const fsTopdirFl = 0x00020000

// spreadDirs marks dir with ext4's top-directory flag, where it has not got it: the directories
// made in it (one per staged layer) are then placed by ext4's Orlov allocator as top-level
// directories are, each in a block group with above-average free inodes, not in its parent's. On
// an ext4 without a journal, making a file steps, one inode at a time, over the inodes of its
// group deleted in the last minute (find_inode_bit, recently_deleted): after a node removed an
// image, a layer untarred beside it paid that for each of its files (issue 59). Best effort: a
// file system without the flag (XFS, tmpfs) or without the right to set it changes nothing;
// ENVSPEC_SPREAD_STAGING=off (envspec's setting) leaves it out.
func spreadDirs(dir string) {
	switch strings.ToLower(strings.TrimSpace(os.Getenv("ENVSPEC_SPREAD_STAGING"))) {
	case "0", "off", "no", "false": // envspec's settings: off
		return
	}
	f, err := os.Open(dir)
	if err != nil {
		return
	}
	defer f.Close()
	fd := int(f.Fd())
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&fsTopdirFl != 0 {
		return
	}
	_ = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopdirFl))
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
		if have, err2 := store.Layer(*sf.id); err2 == nil {
			switch have.UncompressedDigest {
			case d: // stored by another build meanwhile, or before: kept
				return printLayer(have, true)
			case "": // left without content by a killed import: made again
				if err := store.DeleteLayer(*sf.id); err != nil {
					return fail(err)
				}
				layer, err = store.CreateLayer(*sf.id, *sf.parent, nil, "", false, nil)
			}
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
	moved, err := moveToDriverStaging(st.Staging, filepath.Join(*sf.graph, *sf.driver, "staging"))
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(moved)
	out := &drivers.DriverWithDifferOutput{Size: st.Size, UIDs: st.UIDs, GIDs: st.GIDs, UncompressedDigest: d}
	if err := store.ApplyDiffFromStagingDirectory(layer.ID, moved, out, nil); err != nil {
		if _, serr := os.Lstat(moved); errors.Is(serr, fs.ErrNotExist) {
			// another process's Cleanup ran under the layer store's lock, which the apply waits
			// for: the staged files are all gone, none half-moved into the layer
			fmt.Fprintf(os.Stderr, "envspec-put-layer: %v: the staged files were removed from the driver's staging directory by another process using this store (buildah or podman empties it as it ends); stage the layer again\n", err)
			return exitStagingEmptied
		}
		return fail(err)
	}
	stored, err := store.Layer(layer.ID)
	if err != nil {
		return fail(err)
	}
	ok = true
	return printLayer(stored, false)
}

// exitStagingEmptied: commit's staged files were removed before they were in the layer.
const exitStagingEmptied = 3

// moveToDriverStaging moves a staged directory into the overlay driver's own staging directory,
// the one place ApplyDiffFromStagingDirectory takes a layer's files from. Any other process that
// opens this store (buildah, podman, containers-storage) removes that directory as it ends (the
// driver's Cleanup, on the store's Shutdown): one gone between its making and the rename is made
// again.
func moveToDriverStaging(dir, staging string) (string, error) {
	moved := filepath.Join(staging, "envspec-"+filepath.Base(dir))
	for tries := 1; ; tries++ {
		if err := os.MkdirAll(staging, 0o700); err != nil {
			return "", err
		}
		err := os.Rename(dir, moved)
		if err == nil {
			return moved, nil
		}
		if _, serr := os.Lstat(dir); serr != nil || !errors.Is(err, fs.ErrNotExist) || tries == 10 {
			return "", err
		}
	}
}

// printLayer prints the layer's record as containers/storage writes it, with "envspec-existing":
// whether it was in the store already (this call stored nothing).
func printLayer(layer *storage.Layer, existing bool) int {
	b, err := json.Marshal(layer)
	if err != nil {
		return fail(err)
	}
	rec := map[string]interface{}{}
	if err := json.Unmarshal(b, &rec); err != nil {
		return fail(err)
	}
	rec["envspec-existing"] = existing
	if err := json.NewEncoder(os.Stdout).Encode(rec); err != nil {
		return 1
	}
	return 0
}
