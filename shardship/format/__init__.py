"""The packed format: index.json (`index`) and the tar shards (`shards`), read and
written here only (docs/FORMAT.md)."""
