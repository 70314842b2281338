"""shardship packer: sessions -> metric poses -> 224x224 tar shards (+ budget)."""
__version__ = "0.1.0"
