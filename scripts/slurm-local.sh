#!/usr/bin/env bash
# A one-node Slurm cluster on this Debian/Ubuntu machine, to try `ember ablate --launcher slurm`
# locally and to test it (CI runs the Slurm integration test against it).
#
#   sudo scripts/slurm-local.sh up       install slurm-wlm + munge if missing, write slurm.conf,
#                                        start munged, slurmctld and slurmd; wait for the node
#   sudo scripts/slurm-local.sh down     stop the daemons `up` started (munged only if `up` started it)
#   sudo scripts/slurm-local.sh down --purge   ...and forget every job (the controller's saved state)
#   scripts/slurm-local.sh status        what runs, and the node's state
#
# It needs root (apt, /etc/slurm, the daemons) and no systemd: the daemons are started by hand
# and stopped through their PID files. The cluster is one node (this machine, all its CPUs and
# memory) and one partition, `debug`. Nothing is touched when /etc/slurm/slurm.conf exists and
# was not written by this script: a machine that already has Slurm should use its own.
#
# Verified on Debian 12 (slurm-wlm 22.05, munge 0.5.15): install ~30 s, start < 1 s.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# Written by ember's scripts/slurm-local.sh"
RUN=/run/slurm
OURS_MUNGE=$RUN/ember-started-munged      # present when `up` started munged (so `down` stops it)

die() { echo "slurm-local.sh: $*" >&2; exit 1; }

# A daemon is alive when its PID file names a process that is not a zombie (where PID 1 does
# not reap orphans promptly, a stopped daemon lingers as <defunct>, and kill -0 still succeeds).
alive() { [ -f "$1" ] && ps -o stat= -p "$(cat "$1")" 2>/dev/null | grep -vq Z; }

need_root() { [ "$(id -u)" -eq 0 ] || die "$1 needs root: sudo $0 $1"; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get: install Slurm (slurmctld, slurmd, sbatch) and munge with this system's package manager"
    echo "installing slurm-wlm and munge (Debian packages)..."
    apt-get update -q || die "apt-get update failed (is the network or a package mirror reachable?)"
    # The packages' postinst scripts try to start the services and are denied where there is no
    # init system ("policy-rc.d denied execution"): harmless, they are started below.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge \
        || die "apt-get install slurm-wlm munge failed"
}

write_conf() {
    if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        die "$CONF exists and was not written by this script: this machine has a Slurm configuration of its own; use that cluster, or move the file away to let this script set up a one-node one"
    fi
    local host node
    host=$(hostname -s)
    # This machine's CPUs, sockets, cores, threads and memory, as slurmd sees them.
    node=$(slurmd -C | head -1)
    [[ $node == NodeName=* ]] || die "slurmd -C did not describe this machine: $node"
    mkdir -p /etc/slurm
    cat >"$CONF" <<EOF
$MARK: a one-node cluster on $host.
ClusterName=ember
# The node talks to itself over loopback, so the host name need not resolve.
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# How long a credential lives; also how long a requeued job waits before it may start again
# (the default, 120 s, makes every requeue slow).
AuthInfo=cred_expire=10
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups and no accounting database: processes are tracked by parentage, and finished
# jobs are listed in the completion log (sacct does not work without slurmdbd).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MailProg=/bin/true
ReturnToService=2
JobRequeue=1
# A job that exits 85 asks to be queued again (ember's cell script falls back to it).
RequeueExit=85
MaxArraySize=10001
# Finished jobs stay visible to squeue/scontrol for 10 minutes.
MinJobAge=600
KillWait=30
InactiveLimit=0
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    install -d -o munge -g munge -m 0755 /run/munge
    [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    if ! alive /run/munge/munged.pid; then
        runuser -u munge -- /usr/sbin/munged   # daemonizes; PID in /run/munge/munged.pid
        touch "$OURS_MUNGE"
    fi
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n </dev/null | unmunge >/dev/null || die "munge does not work: see /var/log/munge/munged.log"
}

up() {
    need_root up
    install_packages
    write_conf
    install -d -m 0755 $RUN /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
    start_munge
    alive $RUN/slurmctld.pid || slurmctld   # each daemonizes and writes its PID file
    alive $RUN/slurmd.pid || slurmd
    for _ in $(seq 150); do
        if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            sinfo
            return
        fi
        sleep 0.2
    done
    sinfo || true
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
    die "the node did not come up within 30 s (the logs above say why)"
}

down() {
    need_root down
    # slurmctld saves its state and stops itself and slurmd.
    scontrol shutdown 2>/dev/null || true
    for _ in $(seq 50); do
        alive $RUN/slurmctld.pid || alive $RUN/slurmd.pid || break
        sleep 0.2
    done
    for f in $RUN/slurmctld.pid $RUN/slurmd.pid; do
        if alive $f; then kill "$(cat $f)"; fi
    done
    if [ -f "$OURS_MUNGE" ]; then
        if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)"; fi
        rm -f "$OURS_MUNGE"
    fi
    if [ "${1:-}" = --purge ]; then
        rm -rf /var/spool/slurmctld/* /var/spool/slurmd/*
    fi
    status
}

status() {
    local any=0
    for f in /run/munge/munged.pid $RUN/slurmctld.pid $RUN/slurmd.pid; do
        if alive $f; then echo "running: $(basename $f .pid) (pid $(cat $f))"; any=1; fi
    done
    if [ $any = 0 ]; then echo "no Slurm daemon runs"; else sinfo 2>/dev/null || true; fi
}

case "${1:-}" in
    up) up ;;
    down) down "${2:-}" ;;
    status) status ;;
    *) die "usage: $0 up | down [--purge] | status" ;;
esac
