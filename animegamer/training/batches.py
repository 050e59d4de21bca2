"""Deterministic, resumable batch order: the batch of every (step, micro-step, rank) is a pure function.

Resuming at step ``s`` is exact without saving any iterator state: the sampler starts at ``s``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    """Endless batches of dataset indices; each epoch a fresh permutation seeded by (seed, epoch).

    One global batch is ``batch_size * world_size`` indices; rank ``r`` takes its contiguous share.
    ``start_batch`` counts global batches already consumed (optimizer steps x grad_accum).
    """

    def __init__(self, num_items: int, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 start_batch: int = 0, shuffle: bool = True):
        if num_items <= 0:
            raise ValueError("the dataset is empty")
        self.num_items, self.batch_size, self.seed = num_items, batch_size, seed
        self.rank, self.world_size, self.start_batch, self.shuffle = rank, world_size, start_batch, shuffle

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_items))
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.num_items, generator=g).tolist()

    def global_batch(self, index: int) -> list[int]:
        """Indices of global batch ``index`` (the same on every rank), wrapping across epochs."""
        size = self.batch_size * self.world_size
        start = index * size
        out = []
        while len(out) < size:
            epoch, offset = divmod(start + len(out), self.num_items)
            order = self._order(epoch)
            out += order[offset : offset + size - len(out)]
        return out

    def __iter__(self) -> Iterator[list[int]]:
        index = self.start_batch
        while True:
            batch = self.global_batch(index)
            yield batch[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            index += 1

    def __len__(self) -> int:  # endless; DataLoader only needs it for progress reporting
        return 2**62


def resumable_batches(dataset, accelerator, train, seed: int, step: int, num_workers: int = 0,
                      collate_fn=None) -> Iterator:
    """Endless micro-batches for this process, starting where optimizer step ``step`` left off.

    The DataLoader gets its own generator: creating its iterator must not draw on the global RNG that a resume
    restores, or a resumed run would diverge from an uninterrupted one.
    """
    from torch.utils.data import DataLoader

    sampler = ResumableBatchSampler(
        len(dataset),
        train.batch_size,
        seed=seed,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        start_batch=step * train.grad_accum,
    )
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=num_workers,
                        generator=torch.Generator().manual_seed(seed))
    return iter(loader)
