#!/bin/sh
# bench/peers/run.sh: gdist beside Open MPI on this machine, in one run.
#
# Installs Debian's Open MPI (openmpi-bin, libopenmpi-dev) if mpicc, mpirun
# or Open MPI's headers are missing, builds bench/peers/mpi/mpi_peer.c with mpicc and bench/peers with
# go into a temporary directory (removed on exit; nothing is written into the
# repository), and runs the comparison: the same ping-pongs, streams and
# all-reduces through Open MPI (shared memory, vader) and through gdist
# (shared memory), in interleaved rounds, with the ratios gdist / Open MPI.
# Arguments are passed to bench/peers (-rounds, -bind, -pp-sizes, ...; see
# go doc ./bench/peers).
#
#     bench/peers/run.sh
#     bench/peers/run.sh -rounds 9 -bind none
set -eu

cd "$(dirname "$0")/../.."

# openmpi-bin alone brings mpicc without mpi.h (libopenmpi-dev has it).
has_headers() {
	echo '#include <mpi.h>' | mpicc -E -x c - >/dev/null 2>&1
}
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1 || ! has_headers; then
	sudo=
	if [ "$(id -u)" -ne 0 ]; then
		sudo=sudo
	fi
	echo "peers: installing Open MPI (openmpi-bin libopenmpi-dev)" >&2
	$sudo apt-get update -q >&2
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends openmpi-bin libopenmpi-dev >&2
fi

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT INT TERM
mpicc -O2 -o "$build/mpi_peer" bench/peers/mpi/mpi_peer.c
go build -o "$build/peers" ./bench/peers
echo "peers: $(mpirun --version 2>/dev/null | head -n 1); $(go version)" >&2
"$build/peers" -mpi "$build/mpi_peer" "$@"
