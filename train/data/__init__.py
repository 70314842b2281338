"""Streaming shard reader: index (numpy), partition (pure math), dataset (I/O)."""
from shardship.split import split_sessions
from train.data.dataset import ShardDataset, make_loader, sample_keys, verify_shard, verify_shards
from train.data.index import ShardIndex, load_index
from train.data.partition import epoch_order, rank_batches, steps_left, worker_batches

__all__ = [
    "ShardDataset", "ShardIndex", "epoch_order", "load_index", "make_loader", "rank_batches", "sample_keys",
    "split_sessions", "steps_left", "verify_shard", "verify_shards", "worker_batches",
]
