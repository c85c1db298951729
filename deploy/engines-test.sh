#!/usr/bin/env bash
# Runs examples/mnist for one epoch on 2 ranks under every launcher gdist
# supports that can run on one machine — gdistrun, Slurm's srun and sbatch
# (a one-node cluster started by deploy/slurm/one-node-cluster.sh), Open
# MPI's mpirun, and torchrun (Debian's python3-torch) — and checks that each reaches the expected accuracy, that the
# ranks end with identical parameters, and that all launchers produce the
# same parameters bit for bit (the same fnv64a hash).
#
#   sudo deploy/engines-test.sh            # all engines (installs slurm-wlm, munge, openmpi-bin, python3-torch)
#   deploy/engines-test.sh gdistrun openmpi
#
# Needs root for Slurm (its daemons) and installs missing Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
engines=("$@")
[[ ${#engines[@]} -gt 0 ]] || engines=(gdistrun slurm openmpi torchrun)
work=$(mktemp -d /tmp/gdist-engines.XXXXXX)
chmod 0755 "$work" # munged runs as the munge user and needs to reach its directory
slurmdir=$work/slurm
cleanup() {
	if [[ -f $slurmdir/slurm.conf ]]; then
		deploy/slurm/one-node-cluster.sh stop "$slurmdir" || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/mnist" ./examples/mnist
go build -o "$work/gdistrun" ./cmd/gdistrun
GDIST_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export GDIST_TOKEN GOMAXPROCS=1
args=(-epochs 1)

# check NAME LOG: the log must hold the final accuracy and the identical-
# parameters line; prints the hash.
check() {
	local name=$1 log=$2 acc hash
	acc=$(grep -oE 'final test accuracy [0-9.]+%' "$log" | grep -oE '[0-9.]+' | head -1 || true)
	hash=$(grep -oE 'parameters identical on all 2 ranks .*fnv64a [0-9a-f]+' "$log" | grep -oE '[0-9a-f]+$' | head -1 || true)
	if [[ -z $acc || -z $hash ]]; then
		echo "FAIL $name: no final accuracy or identical-parameters line" >&2
		cat "$log" >&2
		return 1
	fi
	if ! awk -v a="$acc" 'BEGIN { exit !(a >= 95.0) }'; then
		echo "FAIL $name: test accuracy $acc% < 95%" >&2
		return 1
	fi
	echo "ok   $name: test accuracy $acc%, parameters identical on both ranks, fnv64a $hash" >&2
	echo "$hash"
}

declare -A hashes
for e in "${engines[@]}"; do
	log=$work/$e.log
	start=$(date +%s%N)
	case $e in
	gdistrun)
		"$work/gdistrun" -n 2 -- "$work/mnist" "${args[@]}" >"$log" 2>&1
		hashes[$e]=$(check "gdistrun -n 2" "$log")
		;;
	slurm)
		command -v srun >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }
		eval "$(deploy/slurm/one-node-cluster.sh start "$slurmdir")"
		# srun directly: no variable but the token (and GOMAXPROCS) is set.
		env -u MASTER_ADDR -u MASTER_PORT srun -n 2 --label "$work/mnist" "${args[@]}" >"$log" 2>&1
		hashes[srun]=$(check "srun -n 2" "$log")
		# The sbatch script, waited for.
		(cd "$work" && sbatch --wait --ntasks=2 --output="$work/sbatch.log" \
			"$OLDPWD/deploy/slurm/mnist.sbatch" "$work/mnist" "${args[@]}" >/dev/null)
		hashes[sbatch]=$(check "sbatch mnist.sbatch" "$work/sbatch.log")
		deploy/slurm/one-node-cluster.sh stop "$slurmdir"
		;;
	openmpi)
		command -v mpirun >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin >/dev/null; }
		root=()
		[[ $(id -u) -ne 0 ]] || root=(--allow-run-as-root)
		mpirun "${root[@]}" -np 2 -x GDIST_TOKEN -x GOMAXPROCS "$work/mnist" "${args[@]}" >"$log" 2>&1
		hashes[$e]=$(check "mpirun -np 2 -x GDIST_TOKEN" "$log")
		;;
	torchrun)
		# Debian's torch 1.13 on Python 3.11: its "--redirects 0" default
		# trips over an enum change (AttributeError in to_map); 2 works.
		/usr/bin/python3 -c 'import torch' 2>/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null; }
		# --standalone: torchrun's store takes MASTER_PORT, gdist the next one.
		/usr/bin/python3 /usr/bin/torchrun --standalone --nproc_per_node 2 --redirects 2 --tee 2 \
			--no_python "$work/mnist" "${args[@]}" >"$log" 2>&1
		hashes[$e]=$(check "torchrun --standalone --nproc_per_node 2" "$log")
		;;
	*)
		echo "unknown engine $e (gdistrun, slurm, openmpi, torchrun)" >&2
		exit 2
		;;
	esac
	ms=$((($(date +%s%N) - start) / 1000000))
	printf '     %s took %d.%03d s\n' "$e" $((ms / 1000)) $((ms % 1000)) >&2
done

first=""
for k in "${!hashes[@]}"; do
	if [[ -z $first ]]; then
		first=${hashes[$k]}
	elif [[ ${hashes[$k]} != "$first" ]]; then
		echo "FAIL: launchers disagree on the trained parameters:" >&2
		for j in "${!hashes[@]}"; do echo "  $j ${hashes[$j]}" >&2; done
		exit 1
	fi
done
echo "engines: ${#hashes[@]} passed, 0 failed (identical parameters across ${!hashes[*]}: fnv64a $first)"
