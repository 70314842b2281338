"""bench stub: only imported, never used by the image bench."""
class AutoTokenizer:
    pass
