#!/bin/bash
# Stop the daemons started by scripts/ci/sge_up.sh, by PID file (never pkill by name).
# (`qconf -ke <host>; qconf -km` is the official alternative.)
for pf in /var/spool/gridengine/execd/*/execd.pid /var/spool/gridengine/qmaster/qmaster.pid; do
  [ -s "$pf" ] || continue
  pid=$(cat "$pf")
  kill "$pid" 2>/dev/null && echo "sent TERM to $pid ($pf)"
  for i in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
done
exit 0
