#!/usr/bin/env bash
# A one-node SLURM cluster on this Debian/Ubuntu machine, for trying `hydra/launcher=slurm` and for the tests in
# tests/slurm/ (.ci/run starts it before them and stops it after). Needs root.
#
#   scripts/slurm_local.sh start    # apt-get install slurm-wlm munge if missing; munged, slurmctld, slurmd
#   scripts/slurm_local.sh status   # sinfo; exit 0 when the node takes jobs
#   scripts/slurm_local.sh stop     # stop the daemons this script started (and cancel the cluster's jobs)
#
# An optional owner token (`start ci-123` ... `stop ci-123`; default `manual`) is recorded when start launches the
# daemons; stop stops them only for the same token (`stop --force`: whoever started them), so a script that found
# a cluster already running (another session's, another CI run's) leaves it and its jobs alone when it stops.
#
# The node is this machine (`hostname -s`) with its CPUs and memory, in one partition, `debug` (default).
# Containers have no cgroup control for SLURM, so processes are tracked by the process tree
# (ProctrackType=proctrack/linuxproc) and tasks are not bound (TaskPlugin=task/none). Preemption and timeouts
# requeue jobs (JobRequeue=1), as on a production cluster. Everything it writes lives in $GRPOLAB_SLURM_DIR
# (default /tmp/grpolab-slurm: state, logs, pid files) plus /etc/slurm/slurm.conf, where the client commands
# (sbatch, srun, squeue, scontrol) look; an existing slurm.conf that this script did not write is left alone
# and the script stops with a message.
set -euo pipefail

STATE="${GRPOLAB_SLURM_DIR:-/tmp/grpolab-slurm}"
CONF=/etc/slurm/slurm.conf
MARK="# written by grpolab scripts/slurm_local.sh"

die() { echo "slurm_local.sh: error: $*" >&2; exit 1; }

ensure_installed() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || die "slurmctld/slurmd/munged are not installed and apt-get is not available"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null; } \
    || die "apt-get install slurm-wlm munge failed"
}

write_conf() {
  local host cpus mem_mb
  host="$(hostname -s)"
  cpus="$(nproc --all)"
  mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))   # slurmd refuses more than it sees
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; move it away or run SLURM yourself"
  fi
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
  # A requeued job that starts again on this node within the second its old allocation was killed in fails with
  # "Job credential revoked" (slurmd compares the new credential's time with the revocation's, in whole seconds),
  # and SLURM marks it FAILED instead of running it. A 1.2 s epilog keeps the node busy past that second.
  printf '#!/bin/sh\nsleep 1.2\n' > "$STATE/epilog.sh"
  chmod +x "$STATE/epilog.sh"
  cat > "$CONF" <<EOF
$MARK
ClusterName=grpolab
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
Epilog=$STATE/epilog.sh
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (munged, slurmctld and slurmd run as root here)"
  ensure_installed
  write_conf
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
    chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    if id munge >/dev/null 2>&1; then runuser -u munge -- /usr/sbin/munged; else /usr/sbin/munged --force; fi
    touch "$STATE/munged.ours"
  fi
  local started=""
  running "$STATE/slurmctld.pid" || { slurmctld -i; started=1; }
  running "$STATE/slurmd.pid" || { slurmd; started=1; }
  [ -z "$started" ] || echo "${1:-manual}" > "$STATE/started_by"
  for _ in $(seq 1 60); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc|plnd)'; then
      echo "slurm_local.sh: one-node cluster up: $(sinfo -h -o '%P %D %c cpus %m MB %t')"; return 0
    fi
    sleep 0.5
  done
  die "the node did not come up within 30 s; see $STATE/slurmctld.log and $STATE/slurmd.log"
}

stop_pid() {  # stop_pid <pidfile> <name>
  running "$1" || return 0
  local pid; pid="$(cat "$1")"
  kill "$pid"
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
}

stop() {
  local token="${1:-manual}" owner
  owner="$(cat "$STATE/started_by" 2>/dev/null || echo "<no token recorded>")"
  if [ "$token" != "--force" ] && [ "$owner" != "$token" ]; then
    echo "slurm_local.sh: the cluster was started by $owner, not $token: left running (stop --force stops it)"
    return 0
  fi
  squeue -h -o %i 2>/dev/null | xargs -r scancel --quiet 2>/dev/null || true   # its jobs end with its daemons
  stop_pid "$STATE/slurmd.pid" slurmd
  stop_pid "$STATE/slurmctld.pid" slurmctld
  if [ -f "$STATE/munged.ours" ]; then
    stop_pid /run/munge/munged.pid munged
    rm -f "$STATE/munged.ours"
  fi
  rm -f "$STATE/started_by"
  echo "slurm_local.sh: stopped"
}

status() {
  sinfo -h -o '%P %D %c cpus %m MB %t' 2>/dev/null && sinfo -h -o %t | grep -qE '^(idle|mix|alloc|comp|plnd)' \
    || { echo "slurm_local.sh: no cluster answers" >&2; return 1; }
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  status) status ;;
  *) echo "usage: $0 start [owner] | stop [owner|--force] | status" >&2; exit 2 ;;
esac
