"""bench stub (torchvision is not installed here): mosaicml-streaming imports these
at module level for its vision datasets, which the bench does not use."""
