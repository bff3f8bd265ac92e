"""One module per transform; the module name is the transform's public name.

The order they run in is ``sdp_convert.pipeline.PIPELINE``.
"""
