#!/usr/bin/env bash
# Starts (or stops) a one-node Slurm cluster on this machine, for trying gdist
# under srun/sbatch without a real cluster, and for CI.
#
#   deploy/slurm/one-node-cluster.sh start [DIR]   # prints: export SLURM_CONF=DIR/slurm.conf
#   deploy/slurm/one-node-cluster.sh stop  [DIR]
#
# Needs root and Debian's slurm-wlm and munge packages (installed if missing
# and apt-get is there). Everything it writes is under DIR (default
# /tmp/gdist-slurm): the generated slurm.conf, spool and state directories,
# pid and log files. munged runs with the package's key; slurmctld and slurmd
# run as root with the node's real CPU count and memory (from slurmd -C).
set -euo pipefail

cmd=${1:-}
dir=${2:-/tmp/gdist-slurm}

need() {
	if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
		echo "installing slurm-wlm and munge" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
	fi
}

stop() {
	for p in slurmd slurmctld; do
		if [[ -f "$dir/$p.pid" ]]; then
			kill "$(cat "$dir/$p.pid")" 2>/dev/null || true
		fi
	done
	for _ in $(seq 50); do
		pgrep -f "slurm(ctld|d) -f $dir/slurm.conf" >/dev/null || break
		sleep 0.1
	done
	pkill -9 -f "slurm(ctld|d) -f $dir/slurm.conf" 2>/dev/null || true
	if [[ -f "$dir/munged.pid" ]]; then
		kill "$(cat "$dir/munged.pid")" 2>/dev/null || true
	fi
	rm -f "$dir"/*.pid
}

start() {
	need
	stop
	mkdir -p "$dir/spool" "$dir/state" "$dir/munge"
	chown munge:munge "$dir/munge"
	# munged: our own socket, so a system munged (if any) is left alone.
	sudo_munge() { if command -v runuser >/dev/null; then runuser -u munge -- "$@"; else su -s /bin/sh munge -c "$*"; fi; }
	sudo_munge munged --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
		--log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
	cp "$dir/munge/munged.pid" "$dir/munged.pid"
	local node spec
	node=$(hostname -s)
	spec=$(slurmd -C | head -1)
	cat >"$dir/slurm.conf" <<CONF
ClusterName=gdist
SlurmctldHost=$node
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
$spec State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
	slurmctld -f "$dir/slurm.conf"
	slurmd -f "$dir/slurm.conf"
	export SLURM_CONF=$dir/slurm.conf
	for _ in $(seq 100); do
		if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
			echo "export SLURM_CONF=$dir/slurm.conf"
			return 0
		fi
		sleep 0.2
	done
	echo "slurm did not come up; logs in $dir" >&2
	tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
	return 1
}

case $cmd in
start) start ;;
stop) stop ;;
*)
	echo "usage: $0 start|stop [DIR]" >&2
	exit 2
	;;
esac
