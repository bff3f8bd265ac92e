"""sdp-convert: rewrite single-GPU training scripts into data-parallel ones."""

from __future__ import annotations

__version__ = "0.1.0"
