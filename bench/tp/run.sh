#!/bin/sh
# Runs every part of bench/tp RUNS times (default 3), each run paired and
# interleaved inside (-reps repetitions, medians), printing the load before
# each: the commands behind BENCHMARKS.md's tensor-parallelism tables.
#
#	sh bench/tp/run.sh [RUNS]
set -eu
runs=${1:-3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/tp" ./bench/tp
go build -o "$dir/gdistrun" ./cmd/gdistrun
bench() {
	echo "## $* ($(uptime | sed 's/.*load/load/'))"
	"$@" 2>&1 | grep -v 'gdistrun: GOMAXPROCS\|wrote timeline'
}
for i in $(seq "$runs"); do
	echo "# run $i of $runs"
	bench "$dir/tp" -part cache -reps 3
	bench "$dir/gdistrun" -n 2 -- "$dir/tp" -part serve -reps 5 -tokens 64
	bench "$dir/gdistrun" -n 2 -- "$dir/tp" -part tpgen -reps 5 -tokens 32
	bench "$dir/gdistrun" -n 2 -- "$dir/tp" -part tptrain -reps 3
done
GDIST_TRANSPORT=shm bench "$dir/gdistrun" -n 2 -- "$dir/tp" -part allreduce
GDIST_TRANSPORT=tcp bench "$dir/gdistrun" -n 2 -- "$dir/tp" -part allreduce
