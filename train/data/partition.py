"""Which sample goes to which rank, worker and batch: pure integer math, no I/O.

One epoch is a permutation of all samples (`epoch_order`), seeded by (seed, epoch)
and grouped by shard so reads stay local: shuffle the shard order, then shuffle the
samples inside consecutive windows of `window` shards.

The permutation is consumed as one global stream. Global step `k` (after resuming
at `consumed`) takes positions `consumed + k*G ... consumed + (k+1)*G - 1`, with
`G = world_size * batch_size`; rank `r` gets the block `r*B ... (r+1)*B - 1` of it.
So after any number of whole steps the consumed samples are exactly a prefix of
the permutation, and the reader state is three integers: (seed, epoch, consumed).
Resuming with another number of ranks or workers continues the same stream.

Ranks never wait on each other for data: each computes its own share from the
same integers. Every rank gets the same number of batches, because the tail of an
epoch that does not fill a whole global step is handled the same way everywhere:

- `tail="drop"` (training): the last `(n - consumed) % G` positions of the epoch are
  skipped. They are a different random subset each epoch (< G samples).
- `tail="pad"` (validation): the last step is filled with position -1, which the
  dataset turns into a weight-0 copy of a real sample: every sample counts once.

DataLoader workers of one rank take the rank's batches round-robin (worker `w`
gets batches `w, w+W, ...`), which is exactly the order in which DataLoader hands
batches back, so the rank sees its batches in stream order."""
from __future__ import annotations

import math

import numpy as np

TAILS = ("drop", "pad")


def epoch_order(counts: np.ndarray, seed: int, epoch: int, window: int = 8, run: int = 1) -> np.ndarray:
    """Permutation (int64) of `sum(counts)` shard-major sample indices for one epoch.

    `counts[s]` samples of shard `s` are the indices `starts[s] ... starts[s]+counts[s]-1`.
    With `run` > 1 the shuffle moves runs of `run` consecutive samples of one shard
    (the last run of a shard may be shorter) and keeps each run's samples together
    and in order: consecutive frames share observation frames, which a batch then
    decodes once. `run=1` is the plain per-sample shuffle.
    Deterministic in (counts, seed, epoch, window, run)."""
    counts = np.asarray(counts, dtype=np.int64)
    if seed < 0 or epoch < 0:
        raise ValueError("seed and epoch must be >= 0")
    rng = np.random.default_rng([int(seed), int(epoch)])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    shard_order = rng.permutation(len(counts))
    window, run = max(1, int(window)), max(1, int(run))
    parts = []
    for i in range(0, len(shard_order), window):
        group = shard_order[i:i + window]
        if run == 1:
            idx = np.concatenate([np.arange(starts[s], starts[s] + counts[s], dtype=np.int64) for s in group])
            rng.shuffle(idx)
            parts.append(idx)
            continue
        first = np.concatenate([np.arange(starts[s], starts[s] + counts[s], run, dtype=np.int64) for s in group])
        end = np.concatenate([np.minimum(np.arange(starts[s], starts[s] + counts[s], run, dtype=np.int64) + run,
                                         starts[s] + counts[s]) for s in group])
        perm = rng.permutation(len(first))
        parts.append(_expand(first[perm], end[perm]))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _expand(first: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The ranges first[k] .. end[k]-1, concatenated in order."""
    lengths = end - first
    offsets = np.repeat(first - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) + offsets


def steps_left(n: int, consumed: int, world_size: int, batch_size: int, tail: str = "drop") -> int:
    """Global steps (= batches per rank) left in an epoch of `n` samples."""
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}")
    if not 0 <= consumed <= n:
        raise ValueError(f"consumed={consumed} outside 0..{n}")
    g = world_size * batch_size
    remaining = n - consumed
    return remaining // g if tail == "drop" else math.ceil(remaining / g)


def rank_batches(n: int, consumed: int, world_size: int, rank: int, batch_size: int,
                 tail: str = "drop") -> np.ndarray:
    """(steps, batch_size) int64 positions into the epoch order for `rank`; -1 = pad."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    steps = steps_left(n, consumed, world_size, batch_size, tail)
    g = world_size * batch_size
    pos = (consumed + np.arange(steps, dtype=np.int64)[:, None] * g + rank * batch_size
           + np.arange(batch_size, dtype=np.int64)[None, :])
    pos[pos >= n] = -1
    return pos


def worker_batches(batches: np.ndarray, worker: int, num_workers: int) -> np.ndarray:
    """The rows of a rank's batches that DataLoader worker `worker` produces."""
    if not 0 <= worker < max(1, num_workers):
        raise ValueError(f"worker {worker} outside 0..{num_workers - 1}")
    return batches[worker::max(1, num_workers)]


def advance(consumed: int, steps: int, world_size: int, batch_size: int, n: int) -> int:
    """Reader position after `steps` more global steps (clamped at the epoch end)."""
    return min(n, consumed + steps * world_size * batch_size)
