"""shardship packer, stage 1: sessions -> metric poses -> 224x224 tar shards."""
from shardship import __version__

__all__ = ["__version__"]
