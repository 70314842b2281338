#!/bin/bash
# One node of the two-node SLURM of slurm_2node_up.sh:
#   slurm_node.sh start N   start node N's slurmd in its network + UTS namespace (if not running)
#   slurm_node.sh kill N    crash node N: SIGKILL every process in its network namespace
#                           (slurmd, slurmstepd, the job's ranks), as a power loss would
# The processes are found by namespace (`ip netns pids`), never by name.
set -euo pipefail
what=${1:?usage: slurm_node.sh start|kill N}; n=${2:?usage: slurm_node.sh start|kill N}
case "$what" in
  start)
    pf=/run/slurmd.node$n.pid
    if [ -s "$pf" ] && kill -0 "$(cat "$pf")" 2>/dev/null; then exit 0; fi
    rm -f "$pf"
    nsenter --net="/var/run/netns/sn$n" unshare --uts sh -c "hostname node$n; exec /usr/sbin/slurmd -N node$n"
    ;;
  kill)
    pids=$(ip netns pids "sn$n" || true)
    [ -z "$pids" ] || kill -9 $pids
    rm -f "/run/slurmd.node$n.pid"
    echo "node$n: killed $(echo $pids | wc -w) process(es)"
    ;;
  *) echo "usage: slurm_node.sh start|kill N" >&2; exit 2 ;;
esac
