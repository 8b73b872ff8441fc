#!/usr/bin/env bash
# A real Slurm on this one host, for the tests and demos of `gembench submit` (docs/cluster.md).
#
#   scripts/slurm_local.sh start    install Debian's slurm-wlm and munge (root, apt), write a minimal
#                                   /etc/slurm/slurm.conf (this host's CPUs and memory from `slurmd -C`,
#                                   partition `debug`, no cgroups, 127.0.0.1 only), start munged,
#                                   slurmctld and the slurmd, wait until `sinfo` shows every node idle
#   scripts/slurm_local.sh stop     cancel every job, stop the daemons, check that none is left
#   scripts/slurm_local.sh status   sinfo and squeue (exit 1 if the controller does not answer)
#
# The cluster is $GEMBENCH_SLURM_NODES nodes (default 2) named local1, local2, ...: one slurmd each
# (`slurmd -N localK` on its own port), all on this host, which share its CPUs and memory out
# (2 cores: 1 each; one node has them all), so a 2-node job runs two torchrun agents here. Debian's slurm-wlm runs several slurmd on one host;
# a build that cannot leaves one node idle, and start says so. State, spool, logs and pid files
# live in $GEMBENCH_SLURM_DIR (default /var/tmp/gembench-slurm); the controller's state is kept from
# one start to the next, so job ids (and the result and log names made of them) are never reused.
# An /etc/slurm/slurm.conf that this script did not write is never replaced.
set -euo pipefail

DIR="${GEMBENCH_SLURM_DIR:-/var/tmp/gembench-slurm}"
NODES="${GEMBENCH_SLURM_NODES:-2}"
CONF=/etc/slurm/slurm.conf
MARK="# written by gembench scripts/slurm_local.sh"
WAIT_S=60

say() { echo "slurm_local: $*" >&2; }
die() {
    say "$*"
    exit 1
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return
    fi
    [[ $(id -u) -eq 0 ]] || die "not root: cannot install slurm-wlm and munge (run as root, or install them)"
    command -v apt-get >/dev/null || die "no apt-get: install slurmctld, slurmd and munge with this system's packages"
    say "installing Debian's slurm-wlm and munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

# Another Slurm's configuration (a real cluster's) is never replaced, its daemons and jobs never touched.
ours() { [[ ! -e $CONF ]] || grep -qxF "$MARK" "$CONF"; }

write_conf() {
    local host hardware cpus memory
    host=$(hostname)
    # this host as slurmd sees it (CPUs, sockets, cores, memory), shared out between the nodes
    hardware=$(slurmd -C | head -n 1)
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hardware")
    memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hardware")
    if ((NODES == 1)); then
        hardware=${hardware#NodeName=* }
    else
        hardware="CPUs=$((cpus / NODES > 0 ? cpus / NODES : 1)) RealMemory=$((memory / NODES))"
    fi
    mkdir -p "$DIR"/state "$DIR"/log /etc/slurm
    cat >"$CONF" <<CONF
$MARK
ClusterName=gembench-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
NodeName=local[1-$NODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] $hardware
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating the munge key"
        runuser -u munge -- mungekey --create --keyfile /etc/munge/munge.key
    fi
    running /run/munge/munged.pid || runuser -u munge -- munged
}

wait_idle() {
    local idle=0 i
    for ((i = 0; i < WAIT_S; i++)); do
        idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | wc -l)
        if ((idle == NODES)); then
            say "up: partition debug, $(sinfo -h -o '%D node(s) %N, %c CPUs and %m MB each, %T')"
            return
        fi
        sleep 1
    done
    sinfo -N >&2 || true
    if ((idle == 1 && NODES > 1)); then
        die "one node of $NODES idle after ${WAIT_S}s: this Slurm may not run several slurmd on one host" \
            "(built without --enable-multiple-slurmd); GEMBENCH_SLURM_NODES=1 gives one node; logs in $DIR/log/"
    fi
    die "the nodes are not idle after ${WAIT_S}s; logs in $DIR/log/"
}

start() {
    install_packages
    [[ $(id -u) -eq 0 ]] || die "not root: slurmctld and slurmd run as root here"
    ours || die "$CONF exists and was not written by this script: not replacing it (move it away to use this one)"
    if running "$DIR/slurmctld.pid" && running "$DIR/slurmd-local1.pid"; then
        wait_idle
        return
    fi
    stop_daemons
    rm -rf "$DIR"/log "$DIR"/spool-* # the controller's state stays: job ids go on from the last start's
    write_conf
    start_munge
    slurmctld -i # -i: a state file that no longer fits the configuration is dropped, not fatal
    local k
    for ((k = 1; k <= NODES; k++)); do
        slurmd -N "local$k"
    done
    wait_idle
}

# Stop one daemon by its pid file and wait (bounded) until it has exited.
stop_pid() {
    local file=$1 pid i
    running "$file" || return 0
    pid=$(cat "$file")
    kill "$pid"
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
}

stop_daemons() {
    local i file
    if running "$DIR/slurmctld.pid"; then
        scancel --quiet --user=root 2>/dev/null || true
        for ((i = 0; i < 60; i++)); do # a job's processes end before their slurmd does
            [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
            sleep 1
        done
    fi
    for file in "$DIR"/slurmd-*.pid; do
        stop_pid "$file"
    done
    stop_pid "$DIR/slurmctld.pid"
    stop_pid /run/munge/munged.pid
}

stop() {
    ours || die "$CONF was not written by this script: not stopping that Slurm"
    stop_daemons
    local left="" name
    for name in slurmctld slurmd slurmstepd munged; do
        left+=" $(pgrep -x "$name" || true)"
    done
    left=$(echo $left)
    [[ -z $left ]] || die "still running after stop: $(ps -o pid=,comm= -p "${left// /,}" | tr '\n' ' ')"
    say "stopped: no slurmctld, slurmd, slurmstepd or munged left"
}

status() {
    sinfo || exit 1
    squeue
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
