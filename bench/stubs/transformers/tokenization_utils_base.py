"""bench stub: streaming imports BatchEncoding for a type check only."""
class BatchEncoding(dict):
    pass
