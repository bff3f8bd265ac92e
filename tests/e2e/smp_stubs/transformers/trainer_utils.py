"""``is_main_process`` of the transformers test stub."""

from __future__ import annotations


def is_main_process(local_rank):
    return local_rank in (-1, 0)
