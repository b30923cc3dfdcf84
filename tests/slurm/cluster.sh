#!/usr/bin/env bash
# Start or stop a real single-node SLURM cluster on this machine, for the workflow's SLURM test.
#   bash tests/slurm/cluster.sh start   # installs slurm-wlm + munge if missing (needs root), writes slurm.conf, starts daemons
#   bash tests/slurm/cluster.sh stop
# Minimal configuration: proctrack/linuxproc, task/none, no accounting storage, a large MinJobAge
# (so squeue still reports finished jobs to Snakemake's status checks).
set -euo pipefail
action=${1:-start}
conf_dir=/etc/slurm
state=/var/spool/dpsad-slurm
host=$(hostname -s)

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null; then
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "SLURM is not installed and this user is not root: cannot install slurm-wlm and munge" >&2
        exit 3
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # without the recommended plugins (HDF5, ROCm, InfluxDB and their -dev packages): the test needs the basic ones
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

write_config() {
    local cpus mem
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    mkdir -p "$conf_dir" "$state/ctld" "$state/d" /var/log/slurm
    cat > "$conf_dir/slurm.conf" <<CONF
ClusterName=dpsad-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MinJobAge=86400
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
    mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    # a munged left from an earlier install may run without its socket: restart it unless it answers
    if pgrep -x munged >/dev/null && ! munge -n >/dev/null 2>&1; then
        pkill -x munged || true
        sleep 1
    fi
    pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged --force 2>/dev/null || /usr/sbin/munged --force
}

start() {
    install_packages
    write_config
    start_munge
    if pgrep -x slurmctld >/dev/null && ! timeout 20 sinfo -h >/dev/null 2>&1; then
        # daemons from an earlier start that cannot be reached (a lost munge socket): start anew
        pkill -x slurmd 2>/dev/null || true
        pkill -x slurmctld 2>/dev/null || true
        for _ in $(seq 1 30); do pgrep -x 'slurmctld|slurmd' >/dev/null || break; sleep 1; done
    fi
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 1 60); do
        if sinfo -h -o '%T' 2>/dev/null | grep -q -E '^(idle|mixed|allocated)'; then
            scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
            echo "SLURM is up on $host"
            return 0
        fi
        scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    echo "SLURM did not become ready; slurmctld log tail:" >&2
    tail -n 20 /var/log/slurm/slurmctld.log >&2 || true
    exit 4
}

stop() {
    scancel --user="$(id -un)" >/dev/null 2>&1 || true
    scontrol shutdown >/dev/null 2>&1 || true
    sleep 1
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    rm -rf "$state"
    # Our config gone, scontrol fails at once; with it and no daemons, every later Snakemake start
    # waits ~9 s while the SLURM executor plugin's import asks `scontrol show config`.
    if grep -qx "ClusterName=dpsad-test" "$conf_dir/slurm.conf" 2>/dev/null; then
        rm -f "$conf_dir/slurm.conf"
    fi
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
