"""Data: video I/O, manifests, preprocessing, motion scope, captioning, datasets."""
