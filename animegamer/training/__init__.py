"""Small pure helpers shared by the stage scripts: run setup, optimizers, checkpoints, batches, trackers."""
