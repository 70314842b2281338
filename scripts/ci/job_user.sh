# Sourced by slurm_up.sh and sge_up.sh (needs CI_USER, REPO, optional JOB_PYTHON):
# the non-root job user the tests submit as, as on a real cluster.
id "$CI_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$CI_USER"
if [ -n "${JOB_PYTHON:-}" ]; then
  # A venv python is a symlink into e.g. /root/.pyenv: every directory up to the real
  # interpreter, the venv and the repo needs o+x (search, not list) for the job user.
  for p in "$(readlink -f "$JOB_PYTHON")" "$JOB_PYTHON" "$REPO/"; do
    d=$(dirname "$p")
    while [ "$d" != / ]; do
      [ -n "$(find "$d" -maxdepth 0 -perm -o+x)" ] || { chmod o+x "$d"; echo "chmod o+x $d"; }
      d=$(dirname "$d")
    done
  done
  runuser -u "$CI_USER" -- "$JOB_PYTHON" -c 'import sys; print("job user python ok:", sys.version.split()[0])'
fi
