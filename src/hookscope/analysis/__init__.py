"""Analyses built on capture and the hook core: summary, trace, watch, gradient flow, diff, class
activation maps.

Each public analysis module sits on one floor: it depends on the layers below it (selection, core,
records, capture, edit) and on this package's private modules, never on another public analysis
module. The private modules are the shared engines: ``_recorder`` (hooks and lifecycle), ``_rows``
(rows and their table) and ``_reduce`` (one tensor's statistics) under ``trace`` and ``watch``;
``_macs`` under ``summary``; ``_targets`` under ``cam``.
"""
