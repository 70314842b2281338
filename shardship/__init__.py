"""shardship's shared kernel: errors and exit codes, typed config, sizes, atomic
files, hashing, PIL setup, CLI plumbing, and the on-disk format (index.json and
shards). Every stage (packer -> transfer -> train) imports it; it imports no stage."""
__version__ = "0.1.0"
