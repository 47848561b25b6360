"""Analyses built on capture and the hook core: summary, statistics, diff, class activation maps.

Each analysis module depends on the layers below it (selection, core, records, capture, edit),
never on another analysis module.
"""
