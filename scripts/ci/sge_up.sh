#!/bin/bash
# Bring up a real single-host Grid Engine 8.1.9 (Debian bookworm gridengine-* packages) on
# this host, as root, without systemd, with an `omp` parallel environment (as on BU SCC:
# `-pe omp N`), for tests/test_schedulers.py (marker `sge`).
# Adapted from ../shared/reference/sge_up.sh (verified there); pitfalls kept in comments.
#
# Usage (as root):  bash scripts/ci/sge_up.sh
#   SKIP_APT_UPDATE=1     skip apt-get update (when the caller already ran it)
#   CI_USER=name          non-root job user to create (default shardship-test)
#   JOB_PYTHON=path       interpreter the job user must be able to run (e.g. .venv/bin/python);
#                         its directories (and the repo) get o+x (search only, never read)
# Stop with scripts/ci/sge_down.sh. Tests need SGE_ROOT=/var/lib/gridengine (the Debian
# qsub/qstat wrappers set it themselves).
set -euo pipefail
T0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
CI_USER=${CI_USER:-shardship-test}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
H=$(hostname -s)
N=$(nproc)
getent hosts "$H" >/dev/null || echo "127.0.0.1 $H" >> /etc/hosts

if ! command -v qconf >/dev/null || [ ! -x /usr/sbin/sge_qmaster ]; then
  debconf-set-selections <<SEL
gridengine-common shared/gridenginemaster string $H
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridengineconfig boolean true
SEL
  [ "${SKIP_APT_UPDATE:-0}" = 1 ] || apt-get update -qq
  # pulls exim4 + bsd-mailx as hard deps; postinst runs init_cluster (berkeleydb spool, managers root+sgeadmin)
  apt-get install -y -qq --no-install-recommends gridengine-master gridengine-exec gridengine-client >/dev/null
fi

export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
C=$SGE_ROOT/$SGE_CELL/common
# PITFALL: 127.0.0.1 may reverse-resolve to "localhost" while hostname is e.g. "vm" ->
# "commlib error: access denied (client IP resolved to host name "localhost" ...)".
# host_aliases maps both names to one host.
echo "$H localhost $(hostname -f 2>/dev/null | grep -vx "$H" || true)" > $C/host_aliases
echo "$H" > $C/act_qmaster
install -d -o sgeadmin -g sgeadmin /var/run/gridengine

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
running /var/spool/gridengine/qmaster/qmaster.pid || \
  /usr/sbin/sge_qmaster      # Debian wrapper sets SGE_ROOT; daemonizes, runs as sgeadmin
for i in $(seq 30); do qconf -sh >/dev/null 2>&1 && break; sleep 1; done
qconf -sh >/dev/null

W=$(mktemp -d /tmp/sge_conf.XXXX)
# min_uid/min_gid 0 lets root jobs run too (default 1000). Must be set BEFORE execd starts:
# execd caches the old value for up to load_report_time (40 s) -> job goes to Eqw.
# accounting_flush_time 0: `qacct -j N` sees a finished job at once (default: up to 15 s later).
# load_report_time 10 s: a job that exits 99 is rescheduled after ~10-20 s instead of ~60 s.
# (qconf wraps long values with "\"; join them first so the edits are idempotent on a re-run)
qconf -sconf global | sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' | \
  sed -e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/' \
      -e 's/^load_report_time .*/load_report_time 00:00:10/' -e 's/ accounting_flush_time=[^ ]*//' \
      -e 's/^\(reporting_params .*\)flush_time=/\1accounting_flush_time=00:00:00 flush_time=/' > $W/global
(cd $W && qconf -Mconf global)
# schedule every second instead of every 15 s
qconf -ssconf | sed -e 's/^schedule_interval .*/schedule_interval 0:0:1/' \
  -e 's/^flush_submit_sec .*/flush_submit_sec 1/' -e 's/^flush_finish_sec .*/flush_finish_sec 1/' > $W/sconf
qconf -Msconf $W/sconf
qconf -ah "$H" 2>/dev/null || true     # qmaster host is already an admin host
qconf -as "$H" 2>/dev/null || true

for pf in /var/spool/gridengine/execd/*/execd.pid; do running "$pf" && EXECD_UP=1; done
[ -n "${EXECD_UP:-}" ] || /usr/sbin/sge_execd
for i in $(seq 30); do qconf -se "$H" >/dev/null 2>&1 && break; sleep 1; done

if ! qconf -shgrp @allhosts >/dev/null 2>&1; then
  printf 'group_name @allhosts\nhostlist %s\n' "$H" > $W/hgrp
  qconf -Ahgrp $W/hgrp
fi
if ! qconf -sp omp >/dev/null 2>&1; then
  cat > $W/omp <<'PE'
pe_name            omp
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $pe_slots
control_slaves     FALSE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
PE
  qconf -Ap $W/omp
fi
if ! qconf -sq all.q >/dev/null 2>&1; then
  # all.q from the built-in template; load_thresholds NONE so a busy 2-core CI box does
  # not put the queue into alarm state (default np_load_avg=1.75)
  qconf -sq | sed -e 's/^qname .*/qname all.q/' -e 's/^hostlist .*/hostlist @allhosts/' \
    -e 's/^pe_list .*/pe_list omp/' -e "s/^slots .*/slots $N/" \
    -e 's/^load_thresholds .*/load_thresholds NONE/' -e 's#^shell .*#shell /bin/bash#' > $W/allq
  qconf -Aq $W/allq
fi
rm -rf "$W"
for i in $(seq 60); do qstat -f | grep -q "all.q@$H .* lx-amd64 *$" && break; sleep 1; done
qstat -f | grep -q "all.q@$H .* lx-amd64 *$" || { echo "sge queue not ready"; qstat -f; exit 1; }
echo "sge up after $(( $(date +%s)-T0 ))s"

# ---- the non-root job user (tests submit as this user, as on a real cluster) ----
. "$HERE/job_user.sh"

# ---- smoke test: a 2-slot job as the job user runs and writes its output ----
D=$(mktemp -d /tmp/sge_smoke.XXXX); chmod 777 "$D"
echo 'echo "$(id -un) NSLOTS=$NSLOTS PE=$PE"' | \
  runuser -u "$CI_USER" -- qsub -sync y -S /bin/bash -pe omp 2 -o "$D/out" -j y >/dev/null
cat "$D/out"
grep -q "^$CI_USER NSLOTS=2 PE=omp" "$D/out" || { echo "sge smoke job failed"; exit 1; }
rm -rf "$D"
echo "sge smoke job done after $(( $(date +%s)-T0 ))s"
