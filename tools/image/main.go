// Command image writes the ipledger container image (make image): a
// docker-archive tarball holding the binaries `make build` wrote (the four of
// ipledger and portmap). It is a
// build tool, not an installed binary.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ipledger/ipledger/internal/image"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding the built binaries")
	out := flag.String("out", "bin/ipledger-image.tar", "docker-archive to write")
	tag := flag.String("tag", "ipledger:dev", "image reference in the archive")
	flag.Parse()
	spec, err := image.IpledgerSpec(*bin, *tag)
	if err == nil {
		err = image.WriteFile(spec, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}
