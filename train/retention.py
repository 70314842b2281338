"""How many checkpoint files the trainer's retention (train/checkpoint.py
`write_checkpoint`) has on disk at its peak. Torch-free, so `packer budget` and
the pre-submit quota check size checkpoints by the same rule."""


def peak_checkpoint_files(keep: int) -> int:
    """keep > 0: the `keep` step_N.pt files, the new one being written before the
    oldest is removed, and best.pt (last.pt is a hard link: no space).
    keep = 0: last.pt, its temp file during a save, and best.pt."""
    return keep + 2 if keep > 0 else 3
