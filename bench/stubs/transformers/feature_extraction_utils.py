"""bench stub: streaming imports BatchFeature for a type check only."""
class BatchFeature(dict):
    pass
