#!/bin/bash
# Bring up a real TWO-node SLURM 22.05 on this one machine (Debian bookworm), as root, without
# systemd: slurmctld on the host, one slurmd per node in its own network namespace (own IP) and
# UTS namespace (own hostname), joined to the host by veth pairs on a private /24 that exists
# only inside this machine. Two partitions, so `train where` and `train submit --partitions`
# have something to choose between:
#   debug  node1,node2  (default; multi-node jobs)        short  node2 only
# Each node also has 2 GRES "gpu"s backed by /dev/null and /dev/zero (slurm 22.05 drops a
# count-only gpu line without File=; task/none never touches the devices), so a rendered
# `--gres=gpu:N` is accepted and scheduled as on a GPU cluster while the job runs on CPU (a CPU
# torch sees no CUDA; SLURM only sets CUDA_VISIBLE_DEVICES). For tests/test_lightning_2node.py.
# For tests/test_schedulers.py and tests/test_slurm_2node.py (marker `slurm`); the one-node
# tests run on it too. Adapted from ../shared/reference/slurm_2node_up.sh (verified there).
#
# Usage (as root):  bash scripts/ci/slurm_2node_up.sh
#   SKIP_APT_UPDATE=1  skip apt-get update        CI_USER=name  non-root job user (shardship-test)
#   JOB_PYTHON=path    interpreter the job user must be able to run (its directories get o+x)
#   SLURM_NET=10.201   node N is $SLURM_NET.N.2, the host side of its link $SLURM_NET.N.1
# Stop with scripts/ci/slurm_2node_down.sh; kill / restart one node with scripts/ci/slurm_node.sh.
# Pitfalls, each hit while writing the reference:
#  - `ip netns exec` remounts /sys, which hides /sys/fs/cgroup: slurmd then dies with
#    "Unable to initialize cgroup plugin". Enter the namespace with `nsenter --net=` instead.
#  - Without its own UTS namespace every node's hostname is the host's, so torchrun's c10d
#    rendezvous on no node believes it hosts the store, and all agents time out.
#  - SlurmctldHost must name this host's real hostname; give the controller's address in ().
#  - Spool dir, pid and log files need %n so the two slurmd do not share them.
#  - A one-node SLURM of slurm_up.sh is stopped first (both write /etc/slurm/slurm.conf), and
#    this cluster keeps its state elsewhere: slurmctld refuses to start on a StateSaveLocation
#    written under another ClusterName ("fatal: CLUSTER NAME MISMATCH"), silently as a daemon.
# Both nodes share this machine's memory and cores: each claims all cores and half the RAM
# (RealMemory), which is what `sinfo -o %m` reports to the per-node RAM check.
set -euo pipefail
trap 'echo "slurm_2node_up.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
T0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
CI_USER=${CI_USER:-shardship-test}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
NET=${SLURM_NET:-10.201}

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v nsenter >/dev/null \
   || ! command -v ip >/dev/null; then
  [ "${SKIP_APT_UPDATE:-0}" = 1 ] || apt-get update -qq
  # policy-rc.d in this image denies service start during install (harmless: we start by hand)
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge iproute2 util-linux >/dev/null
fi
# a one-node SLURM of slurm_up.sh (its slurmd has /run/slurmd.pid; ours have /run/slurmd.nodeN.pid)
[ ! -s /run/slurmd.pid ] || bash "$HERE/slurm_down.sh"

H=$(hostname -s)
getent hosts "$H" >/dev/null || echo "127.0.0.1 $H" >> /etc/hosts
echo 1 > /proc/sys/net/ipv4/ip_forward   # node1 <-> node2 through this host (no procps needed)
for n in 1 2; do
  ip netns list | grep -qw "sn$n" && continue
  ip netns add "sn$n"
  ip link add "vh$n" type veth peer name "vn$n"
  ip link set "vn$n" netns "sn$n"
  ip addr add "$NET.$n.1/24" dev "vh$n"; ip link set "vh$n" up
  nsenter --net="/var/run/netns/sn$n" ip addr add "$NET.$n.2/24" dev "vn$n"
  nsenter --net="/var/run/netns/sn$n" ip link set "vn$n" up
  nsenter --net="/var/run/netns/sn$n" ip link set lo up
  nsenter --net="/var/run/netns/sn$n" ip route add default via "$NET.$n.1"
  grep -q " node$n\$" /etc/hosts || echo "$NET.$n.2 node$n" >> /etc/hosts
done
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
NODECFG="CPUs=$(nproc) RealMemory=$MEM_MB Gres=gpu:2"
STATE=/var/lib/slurm/slurmctld-2node
mkdir -p /etc/slurm $STATE /var/log/slurm
chown -R slurm /var/lib/slurm /var/log/slurm
# No accounting daemon: job state comes from squeue / `scontrol show job` (sacct does not work).
# DefMemPerCPU: without it a job asking for no memory gets the whole node and blocks the rest.
# KillWait=5: SIGKILL 5 s after SIGTERM (default 30). MinJobAge=3600: finished jobs stay
# visible to `scontrol show job` for an hour. SlurmdTimeout=20: a node whose slurmd is gone is
# DOWN after ~20 s (default 300), and its job is requeued (--requeue) instead of waiting.
echo "Name=gpu File=/dev/null,/dev/zero" > /etc/slurm/gres.conf
cat > /etc/slurm/slurm.conf <<CFG
ClusterName=ci2
GresTypes=gpu
SlurmctldHost=$H($NET.1.1)
AuthType=auth/munge
SlurmUser=slurm
StateSaveLocation=$STATE
SlurmdSpoolDir=/var/lib/slurm/slurmd.%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.%n.log
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
SlurmdTimeout=20
NodeName=node1 NodeAddr=$NET.1.2 $NODECFG State=UNKNOWN
NodeName=node2 NodeAddr=$NET.2.2 $NODECFG State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=node2 MaxTime=01:00:00 State=UP
CFG

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# munged must run as user munge and needs its runtime dir (systemd normally creates it)
install -d -o munge -g munge -m 0755 /run/munge
running /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null
running /run/slurmctld.pid || /usr/sbin/slurmctld || { tail -5 /var/log/slurm/slurmctld.log; exit 1; }  # daemonizes
for n in 1 2; do bash "$HERE/slurm_node.sh" start "$n"; done
for i in $(seq 60); do [ "$(sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] && break; sleep 1; done
sinfo
[ "$(sinfo -h -o %T | sort -u)" = idle ] || { echo "slurm nodes not idle"; tail -n 20 /var/log/slurm/*.log; exit 1; }
echo "slurm (2 nodes) up after $(( $(date +%s)-T0 ))s"

# ---- the non-root job user (tests submit as this user, as on a real cluster) ----
. "$HERE/job_user.sh"

# ---- smoke test: a 2-node job as the job user runs one task on each node ----
D=$(mktemp -d /tmp/slurm_smoke.XXXX); chmod 777 "$D"
j=$(runuser -u "$CI_USER" -- sbatch --parsable -N2 --ntasks-per-node=1 -o "$D/user_%j.out" --wrap 'id -un; srun hostname')
for i in $(seq 60); do [ -z "$(squeue -h -j "$j" 2>/dev/null)" ] && break; sleep 1; done
cat "$D"/user_*.out
scontrol show job "$j" | grep -q 'JobState=COMPLETED' || { echo "smoke job $j did not complete"; scontrol show job "$j"; exit 1; }
grep -qx node1 "$D"/user_*.out && grep -qx node2 "$D"/user_*.out || { echo "smoke job $j did not run on both nodes"; exit 1; }
rm -rf "$D"
echo "slurm (2 nodes) smoke job done after $(( $(date +%s)-T0 ))s"
