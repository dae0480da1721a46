#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for compute=slurm's tests and for trying it out.
#
#   scripts/local_slurm.sh start    # idempotent; prints the environment to use (export SLURM_CONF=...)
#   scripts/local_slurm.sh status   # exit 0 when the controller answers and the node is up
#   scripts/local_slurm.sh stop     # stops slurmd and slurmctld (munged is left running)
#   scripts/local_slurm.sh env      # prints the environment to use
#
# Needs Debian's packages (as root): apt-get install -y slurmctld slurmd slurm-client munge
#
# What differs from a production cluster (see the compute=slurm page of the docs): no cgroups
# (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none), no accounting database (sacct does
# not work; ddlkit does not need it), one node that declares more CPUs than the machine has
# (SlurmdParameters=config_overrides) so that multi-rank jobs queue and run, and daemons run as root.
#
# Environment: DDLKIT_SLURM_DIR (default /tmp/ddlkit-slurm) holds the config, state, spool and logs;
# DDLKIT_SLURM_CPUS (default 8) the CPUs the node declares; DDLKIT_SLURM_NODES (default 1) the nodes:
# more than one are as many slurmd on this machine (<host>-1, <host>-2, ...), which a test can take
# down and bring back (scontrol update NodeName=... State=DOWN|RESUME) as a cluster loses a node;
# DDLKIT_SLURM_PORT (default 6817) the controller's port, the nodes' the ones after it (a second
# cluster beside the first needs its own DIR and PORT).
set -euo pipefail

DIR=${DDLKIT_SLURM_DIR:-/tmp/ddlkit-slurm}
CPUS=${DDLKIT_SLURM_CPUS:-8}
NODES=${DDLKIT_SLURM_NODES:-1}
PORT=${DDLKIT_SLURM_PORT:-6817}
CONF=$DIR/slurm.conf
HOST=$(hostname -s)
if [ "$NODES" -eq 1 ]; then
    NAMES=("$HOST")
else
    NAMES=()
    for k in $(seq "$NODES"); do NAMES+=("$HOST-$k"); done
fi
ALL=$(IFS=,; echo "${NAMES[*]}")
NODE=${NAMES[0]}

say() { echo "local_slurm: $*" >&2; }

need_packages() {
    local missing=()
    for cmd in slurmctld slurmd sbatch munged; do
        command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "missing ${missing[*]}: apt-get install -y slurmctld slurmd slurm-client munge"
        exit 3
    fi
}

write_conf() {
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    local mem
    mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
    cat > "$CONF.tmp" <<EOF
# written by scripts/local_slurm.sh: a Slurm cluster on this machine for ddlkit's tests
ClusterName=ddlkit
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a re-queued job may start again after this many seconds (Slurm's default: 120)
AuthInfo=cred_expire=10
CryptoType=crypto/munge
MpiDefault=none
# no cgroups inside these containers: track processes by parentage, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# schedule often: a test cluster should start (and re-start) jobs within seconds
SchedulerParameters=sched_interval=2,bf_interval=2
# the node declares more CPUs than the machine has, so that multi-rank jobs fit
SlurmdParameters=config_overrides
ReturnToService=2
# jobs may re-queue themselves (a preempted or timed-out ddlkit job resumes from its checkpoint)
JobRequeue=1
# ended jobs stay visible to scontrol/squeue this long (seconds)
MinJobAge=600
# seconds between SIGTERM and SIGKILL when a job is cancelled or runs out of time
KillWait=10
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=$PORT
$(k=0; for name in "${NAMES[@]}"; do k=$((k + 1))
    echo "NodeName=$name NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT + k)) CPUs=$CPUS RealMemory=$mem State=UNKNOWN"
  done)
PartitionName=debug Nodes=$ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=batch Nodes=$ALL Default=NO MaxTime=1-00:00:00 State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    if [ -S /run/munge/munge.socket.2 ] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
    if [ ! -s /etc/munge/munge.key ]; then
        if command -v mungekey >/dev/null 2>&1; then mungekey --create --keyfile=/etc/munge/munge.key
        else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
    fi
    chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
    chmod 0700 /etc/munge /var/log/munge /var/lib/munge
    chmod 0755 /run/munge
    chmod 0400 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    say "munged did not start"; exit 1
}

node_up() {
    local state name
    for name in "${NAMES[@]}"; do
        state=$(SLURM_CONF=$CONF sinfo -h -n "$name" -o %t 2>/dev/null | head -n1)
        case "$state" in idle*|mix*|alloc*|comp*) ;; *) return 1 ;; esac
    done
}

# one slurmd per node; with several on this machine, each is told its name
start_slurmd() {
    local name
    for name in "${NAMES[@]}"; do
        pid_alive "$DIR/slurmd-$name.pid" && continue
        if [ "$NODES" -eq 1 ]; then slurmd -f "$CONF"; else slurmd -f "$CONF" -N "$name"; fi
    done
}

start() {
    need_packages
    export PATH=$PATH:/usr/sbin
    start_munge
    [ -f "$CONF" ] && pid_alive "$DIR/slurmctld.pid" || write_conf
    export SLURM_CONF=$CONF
    if ! pid_alive "$DIR/slurmctld.pid"; then
        slurmctld -f "$CONF"
    fi
    for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
    start_slurmd
    for _ in $(seq 150); do node_up && break; sleep 0.2; done
    if ! node_up; then
        # a node left DOWN/DRAIN by an earlier run comes back
        scontrol update NodeName="$ALL" State=RESUME 2>/dev/null || true
        for _ in $(seq 50); do node_up && break; sleep 0.2; done
    fi
    if ! node_up; then
        say "the node did not come up; logs in $DIR/log"; tail -5 "$DIR/log/slurmd.log" >&2 || true; exit 1
    fi
    say "up: $(sinfo -h -o '%P %D %c %t' | tr '\n' ';')"
    print_env
}

stop() {
    export SLURM_CONF=$CONF
    local name pidfiles=()
    for name in "${NAMES[@]}"; do pidfiles+=("$DIR/slurmd-$name.pid"); done
    for pidfile in "${pidfiles[@]}" "$DIR/slurmctld.pid"; do
        if pid_alive "$pidfile"; then
            kill "$(cat "$pidfile")" || true
            for _ in $(seq 50); do pid_alive "$pidfile" || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
    say "stopped"
}

status() {
    export SLURM_CONF=$CONF
    if pid_alive "$DIR/slurmctld.pid" && scontrol ping 2>/dev/null | grep -q UP && node_up; then
        say "running: $(sinfo -h -o '%P %D %c %t' | tr '\n' ';')"
        print_env
        return 0
    fi
    say "not running"
    return 1
}

print_env() { echo "export SLURM_CONF=$CONF"; }

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
