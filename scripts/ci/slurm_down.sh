#!/bin/bash
# Stop the daemons started by scripts/ci/slurm_up.sh, by PID file (never pkill by name).
# Removes the pid files afterwards: a stale /run/slurmctld.pid makes the slurmctld
# package's prerm run scancel, which fails with the controller down and aborts apt-get purge.
for pf in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
  [ -s "$pf" ] || continue
  pid=$(cat "$pf")
  kill "$pid" 2>/dev/null && echo "sent TERM to $pid ($pf)"
  for i in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  rm -f "$pf"
done
exit 0
