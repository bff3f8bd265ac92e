"""sdp-convert: rewrite single-GPU training scripts into data-parallel ones.

The Python API (see ``sdp_convert.api`` and docs/cli.md, "Python API")::

    from sdp_convert import convert
    result = convert(source)   # -> ConvertResult: .output, .text, .changed, .changes, .kind
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

#: The one place the version is written (pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = ["Change", "ConversionError", "ConvertResult", "__version__", "convert"]

if TYPE_CHECKING:
    from .api import Change, ConversionError, ConvertResult, convert


def __getattr__(name: str) -> Any:
    # Imported on first use, so that ``sdp-convert --version`` does not load libcst.
    if name in ("Change", "ConversionError", "ConvertResult", "convert"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'sdp_convert' has no attribute {name!r}")
