#!/usr/bin/env bash
# A one-node SLURM cluster on this (Debian/Ubuntu) machine, with accounting (slurmdbd on MariaDB, so
# that `sacct` sees every job): for trying workflow/profiles/slurm and for its tests. Run as root.
#   bash workflow/cluster/slurm.sh up       install the packages (once) and start munge, MariaDB,
#                                           slurmdbd, slurmctld and slurmd; idempotent
#   bash workflow/cluster/slurm.sh down     stop them (packages, configuration and accounting stay)
#   bash workflow/cluster/slurm.sh status   sinfo and the daemons
# Environment (optional): DPACE_SLURM_CPUS (default: every core), DPACE_SLURM_MEM_MB (default: 80% of
# memory), DPACE_SLURM_PARTITION (default: cpu), DPACE_SLURM_ACCOUNT (default: dpace, created for root).
# One-time cost (apt-get install + first start) is printed by `up`; README, "On a cluster".
set -euo pipefail

CLUSTER=dpace
PARTITION="${DPACE_SLURM_PARTITION:-cpu}"
ACCOUNT="${DPACE_SLURM_ACCOUNT:-dpace}"
NODE="$(hostname -s)"
CPUS="${DPACE_SLURM_CPUS:-$(nproc)}"
MEM_MB="${DPACE_SLURM_MEM_MB:-$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)}"
STATE=/var/lib/dpace-slurm
LOGS=/var/log/dpace-slurm
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)

log() { echo "slurm.sh: $*" >&2; }
running() { pgrep -x "$1" >/dev/null; }

need_root() {
  if [ "$(id -u)" != 0 ]; then log "run as root (it installs packages and starts daemons)"; exit 1; fi
}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

write_config() {
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" "$LOGS" /run/munge /var/run/slurm
  cat > /etc/slurm/slurm.conf.new <<CONF
# Written by dpace workflow/cluster/slurm.sh: one node, one partition, accounting through slurmdbd.
ClusterName=$CLUSTER
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=/var/run/slurm/slurmctld.pid
SlurmdPidFile=/var/run/slurm/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
# jobs end promptly: the time limit is checked often, a killed job's processes get 5 s
KillWait=5
OverTimeLimit=0
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
# sacct's Comment column: the Snakemake rule (and wildcards) of each job
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
NodeName=$NODE CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
  if ! cmp -s /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf 2>/dev/null; then
    mv /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf
    CONFIG_CHANGED=1
  else
    rm /etc/slurm/slurm.conf.new
  fi
  cat > /etc/slurm/slurmdbd.conf <<CONF
# Written by dpace workflow/cluster/slurm.sh
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=/var/run/slurm/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=dpace-slurm
StorageLoc=slurm_acct_db
CONF
  chmod 600 /etc/slurm/slurmdbd.conf
}

start_munge() {
  if ! running munged; then
    [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
      || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
    chown munge:munge /etc/munge/munge.key /run/munge 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    mkdir -p /var/log/munge /var/lib/munge && chown munge:munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged
  fi
}

start_mariadb() {
  if ! mysqladmin ping --silent >/dev/null 2>&1; then
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    (setsid mysqld_safe >/dev/null 2>&1 &)
    for _ in $(seq 60); do mysqladmin ping --silent >/dev/null 2>&1 && break; sleep 1; done
  fi
  mysql -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'dpace-slurm';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

wait_for() {  # wait_for <seconds> <command...>
  local limit=$1; shift
  for _ in $(seq "$limit"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  return 1
}

up() {
  need_root
  SECONDS=0
  CONFIG_CHANGED=0
  install_packages
  local installed=$SECONDS
  write_config
  start_munge
  start_mariadb
  if ! running slurmdbd; then slurmdbd; fi
  wait_for 60 sacctmgr -n list cluster || { log "slurmdbd did not answer; see $LOGS/slurmdbd.log"; exit 1; }
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
  if [ "$CONFIG_CHANGED" = 1 ]; then  # a new node size or partition: restart the controller and node
    pkill -x slurmctld || true; pkill -x slurmd || true
    wait_for 30 bash -c '! pgrep -x slurmctld && ! pgrep -x slurmd' || true
  fi
  running slurmctld || slurmctld
  running slurmd || slurmd
  wait_for 60 scontrol ping || { log "slurmctld did not answer; see $LOGS/slurmctld.log"; exit 1; }
  if ! sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT"; then
    sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" >/dev/null
  fi
  if ! sacctmgr -n -P list assoc user=root account="$ACCOUNT" format=user | grep -qx root; then
    sacctmgr -i add user root account="$ACCOUNT" cluster="$CLUSTER" >/dev/null
  fi
  scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
  wait_for 60 bash -c "sinfo -h -N -o %t | grep -qE '^(idle|mix|alloc)'" \
    || { log "the node is not up: $(sinfo -N -h -o '%N %t %E')"; exit 1; }
  log "up: partition $PARTITION, node $NODE ($CPUS CPUs, $MEM_MB MB), account $ACCOUNT;" \
      "packages ${installed}s, total ${SECONDS}s"
}

down() {
  need_root
  for d in slurmd slurmctld slurmdbd; do pkill -x "$d" || true; done
  wait_for 30 bash -c '! pgrep -x slurmd && ! pgrep -x slurmctld && ! pgrep -x slurmdbd' || true
  if mysqladmin ping --silent >/dev/null 2>&1; then mysqladmin -u root shutdown || true; fi
  pkill -x munged || true
  wait_for 10 bash -c '! pgrep -x munged' || true
  log "down"
}

status() {
  for d in munged mariadbd slurmdbd slurmctld slurmd; do
    printf '%-10s %s\n' "$d" "$(pgrep -x "$d" >/dev/null && echo running || echo stopped)"
  done
  sinfo 2>/dev/null || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
