#!/bin/bash
# Bring up a real single-node SLURM (Debian bookworm, slurm 22.05) on this host, as root,
# without systemd and without cgroups, for tests/test_schedulers.py (marker `slurm`).
# Adapted from ../shared/reference/slurm_up.sh (verified there); pitfalls kept in comments.
#
# Usage (as root):  bash scripts/ci/slurm_up.sh
#   SKIP_APT_UPDATE=1     skip apt-get update (when the caller already ran it)
#   CI_USER=name          non-root job user to create (default shardship-test)
#   JOB_PYTHON=path       interpreter the job user must be able to run (e.g. .venv/bin/python);
#                         its directories (and the repo) get o+x (search only, never read)
# Stop with scripts/ci/slurm_down.sh.
set -euo pipefail
T0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
CI_USER=${CI_USER:-shardship-test}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  [ "${SKIP_APT_UPDATE:-0}" = 1 ] || apt-get update -qq
  # policy-rc.d in this image denies service start during install (harmless: we start by hand)
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

H=$(hostname -s)
getent hosts "$H" >/dev/null || echo "127.0.0.1 $H" >> /etc/hosts
# "NodeName=<host> CPUs=.. Boards=.. SocketsPerBoard=.. CoresPerSocket=.. ThreadsPerCore=.. RealMemory=.."
NODELINE=$(slurmd -C | head -n1)

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
chown slurm: /var/lib/slurm/slurmctld /var/log/slurm
# No accounting daemon: job state comes from squeue / `scontrol show job` (sacct does not work).
# DefMemPerCPU: without it a job asking for no memory gets the whole node and blocks the rest.
# KillWait=5: a job past its wall clock gets SIGKILL 5 s after SIGTERM (default 30) -> faster tests.
# MinJobAge=3600: finished jobs stay visible to `scontrol show job` for an hour (default 300 s).
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=${H}
AuthType=auth/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=256
KillWait=5
MinJobAge=3600
${NODELINE} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

# munged must run as user munge and needs its runtime dir (systemd normally creates it)
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
install -d -o munge -g munge -m 0755 /run/munge
running /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null

running /run/slurmctld.pid || /usr/sbin/slurmctld   # daemonizes; drops privileges to SlurmUser
running /run/slurmd.pid || /usr/sbin/slurmd         # daemonizes; runs as root

for i in $(seq 60); do
  [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break
  sleep 1
done
[ "$(sinfo -h -o %T)" = idle ] || { echo "slurm node not idle"; tail -n 30 /var/log/slurm/slurm*.log; exit 1; }
echo "slurm up after $(( $(date +%s)-T0 ))s"

# ---- the non-root job user (tests submit as this user, as on a real cluster) ----
. "$HERE/job_user.sh"

# ---- smoke test: a 2-task job as the job user reaches COMPLETED ----
D=$(mktemp -d /tmp/slurm_smoke.XXXX); chmod 777 "$D"
j=$(runuser -u "$CI_USER" -- sbatch --parsable -n2 -o "$D/user_%j.out" --wrap 'id -un; srun hostname')
for i in $(seq 60); do [ -z "$(squeue -h -j "$j" 2>/dev/null)" ] && break; sleep 1; done
cat "$D"/user_*.out
scontrol show job "$j" | grep -q 'JobState=COMPLETED' || { echo "smoke job $j did not complete"; scontrol show job "$j"; exit 1; }
rm -rf "$D"
echo "slurm smoke job done after $(( $(date +%s)-T0 ))s"
