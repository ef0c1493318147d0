// envspec-put-layer stores one layer tar in containers-storage with the diff digest the caller
// already knows, so containers/storage does not hash the bytes again: the one thing its own
// command line tool (`containers-storage import-layer`) cannot be told. containers/image passes
// the digests the same way when it pulls a layer it has verified itself.
//
//	envspec-put-layer --graph DIR --run DIR [--storage-driver overlay] --id ID [--parent ID]
//	    --diff-digest sha256:HEX [--file TAR] < TAR
//
// It prints the stored layer as JSON. Exit status: 0 stored, 1 failed (the partial layer is
// gone), 2 bad arguments. envspec checks the digest itself: it made the tar and hashed it while
// writing, or hashes a cached tar while feeding it and kills this tool before the end of input
// when the bytes differ (an unfinished layer is not kept).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/containers/storage"
	"github.com/containers/storage/pkg/reexec"
	digest "github.com/opencontainers/go-digest"
)

func main() {
	if reexec.Init() { // the untar runs in a re-executed copy of this binary, chrooted
		return
	}
	os.Exit(run())
}

func run() int {
	flags := flag.NewFlagSet("envspec-put-layer", flag.ContinueOnError)
	graph := flags.String("graph", "", "the store's graph root")
	runroot := flags.String("run", "", "the store's run root")
	driver := flags.String("storage-driver", "overlay", "the store's driver")
	id := flags.String("id", "", "the layer's ID")
	parent := flags.String("parent", "", "the parent layer's ID")
	diff := flags.String("diff-digest", "", "sha256 of the uncompressed tar")
	file := flags.String("file", "", "the tar (default: standard input)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	d, err := digest.Parse(*diff)
	if *graph == "" || *runroot == "" || *id == "" || err != nil || d.Algorithm() != digest.SHA256 {
		fmt.Fprintln(os.Stderr, "envspec-put-layer: --graph, --run, --id and --diff-digest sha256:<64 hex> are required")
		return 2
	}
	var in io.Reader = os.Stdin
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "envspec-put-layer:", err)
			return 1
		}
		defer f.Close()
		in = f
	}
	store, err := storage.GetStore(storage.StoreOptions{GraphRoot: *graph, RunRoot: *runroot, GraphDriverName: *driver})
	if err != nil {
		fmt.Fprintln(os.Stderr, "envspec-put-layer:", err)
		return 1
	}
	defer store.Shutdown(false)
	opts := &storage.LayerOptions{OriginalDigest: d, UncompressedDigest: d}
	layer, _, err := store.PutLayer(*id, *parent, nil, "", false, opts, in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "envspec-put-layer:", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(layer); err != nil {
		return 1
	}
	return 0
}
