"""Cluster job scripts: one JobSpec (spec.py) from config, rendered for SGE
(sge.py) or SLURM (slurm.py), checked before submission (checks.py), and
submitted / followed / fetched over one connection (submit.py)."""
from __future__ import annotations

from train.jobs.spec import JobSpec, build_spec, format_walltime, parse_walltime


def render(spec: JobSpec) -> str:
    """The job script text for spec.scheduler."""
    if spec.scheduler == "sge":
        from train.jobs import sge

        return sge.render(spec)
    from train.jobs import slurm

    return slurm.render(spec)


def log_path(spec: JobSpec, job_id: str | int) -> str:
    """Absolute remote path of the scheduler log of job `job_id`."""
    if spec.scheduler == "sge":
        from train.jobs import sge

        return sge.log_path(spec, job_id)
    from train.jobs import slurm

    return slurm.log_path(spec, job_id)


__all__ = ["JobSpec", "build_spec", "parse_walltime", "format_walltime", "render", "log_path"]
