#!/bin/bash
# Stop what slurm_2node_up.sh started, by pid file (never by name); remove the namespaces and
# links. Pid files are removed: a stale /run/slurmctld.pid makes the slurmctld package's prerm
# run scancel, which fails with the controller down and aborts apt-get purge.
for pf in /run/slurmd.node1.pid /run/slurmd.node2.pid /run/slurmctld.pid; do
  [ -s "$pf" ] || continue
  pid=$(cat "$pf")
  kill "$pid" 2>/dev/null && echo "sent TERM to $pid ($pf)"
  for i in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  rm -f "$pf"
done
for n in 1 2; do ip link del "vh$n" 2>/dev/null; ip netns del "sn$n" 2>/dev/null; done
exit 0
