"""``SplitDataset`` with torchnet's behaviour: named partitions given as fractions of the dataset,
in the order given, consecutive; ``select(name)`` picks the one ``len`` and indexing see."""

from __future__ import annotations


class SplitDataset:
    def __init__(self, dataset, partitions, initial_partition=None):
        self.dataset = dataset
        total = len(dataset)
        self.partitions = {}
        start = 0
        for name, fraction in partitions.items():
            size = int(round(fraction * total)) if isinstance(fraction, float) else int(fraction)
            self.partitions[name] = (start, min(start + size, total))
            start += size
        self.current = None
        if initial_partition is not None:
            self.select(initial_partition)

    def select(self, partition):
        if partition not in self.partitions:
            raise ValueError(f"SplitDataset has no partition {partition!r}")
        self.current = partition

    def __len__(self):
        start, end = self.partitions[self.current]
        return end - start

    def __getitem__(self, index):
        start, end = self.partitions[self.current]
        if not 0 <= index < end - start:
            raise IndexError(index)
        return self.dataset[start + index]
