"""shardship train: streaming shard reader (train.data), diffusion policy
(train.model), the torch-free [train] schema (train.config), trainer with exact
resume and DDP (train.trainer, train.ddp), evaluation (train.evaluate) and
cluster jobs (train.jobs)."""
