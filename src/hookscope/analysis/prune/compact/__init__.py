"""Physical removal of masked channels, on top of every family: ``_compact`` (``compact``: slice a
copy along the graph, heads and width), ``_verify`` (the copy checked against the masked model),
``_reload`` (the compacted config checked to rebuild it). Must not import: ``compare`` of ``prune``,
any other analysis module, ``cli``, ``viz``.
"""

from ._compact import compact

__all__ = ["compact"]
