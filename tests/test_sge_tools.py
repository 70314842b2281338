"""`train where` and `train doctor` against the REAL one-host Grid Engine of
scripts/ci/sge_up.sh, as the non-root job user (the SLURM side is in
tests/test_slurm_2node.py). Skipped, with the reason, when Grid Engine is not up."""
from __future__ import annotations

from tests import test_schedulers as sched
from tests.test_schedulers import SGE, Site

python_for_jobs, site = sched.python_for_jobs, sched.site
pytestmark = SGE


def test_where_on_sge_reads_qstat_g_c(site: Site) -> None:
    from train.jobs.where import where

    cluster = site.cluster("where-sge", scheduler="sge", gpus=0, cpus=2, mem="2G", time="00:10:00")
    with site.connect(cluster) as remote:
        pools, extra = where(remote, "sge", None)
    [allq] = [p for p in pools if p.partition == "all.q"]
    assert allq.cpus_total >= 1 and 0 <= allq.cpus_free <= allq.cpus_total, pools
    assert "SGE gives no start estimate" in allq.start or "no free slots" in allq.start
    assert extra == ""  # no qgpus here (BU SCC has one)


def test_doctor_on_sge(site: Site) -> None:
    from train.jobs.doctor import run_doctor

    cluster = site.cluster("doctor-sge", scheduler="sge")
    with site.connect(cluster) as remote:
        remote.mkdir("")
        checks = {c.what: c for c in run_doctor(remote, cluster, 2**20, 4)}
    text = "\n".join(map(str, checks.values()))
    assert checks["sge"].level == "ok" and "qsub" in checks["sge"].detail, text
    assert checks["torch"].level == "ok" and not [c for c in checks.values() if c.level == "fail"], text
