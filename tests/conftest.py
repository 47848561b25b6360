"""Fixtures for every test; the shared models and checks live in ``helpers.py``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import torch
from cli_batch import Session
from forked import Forks

from helpers import ConvReLU, FakeModelOutput, Net, Pair, Structured, no_hooks  # noqa: F401 - old imports

if os.environ.get("PYTEST_XDIST_WORKER"):  # several test processes share the cores: each gets its share of threads
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, _cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _watch_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests use small tensors; watch them all so the copy-on-write guard is what they exercise."""
    monkeypatch.setattr("hookscope.records.retention.COPY_BELOW", 0)


@pytest.fixture(scope="session")
def forks() -> Iterator[Forks]:
    """Real processes forked from one that imported torch and hookscope once, for the tests that start, kill
    and resume many short jobs (``forked.Forks``)."""
    server = Forks({**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                   preload=("hookscope.store", "hookscope.report.build", "hookscope.analysis.extract"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def hookscope_process() -> Iterator[Session]:
    """One real process running ``hookscope`` command lines as ``python -m hookscope`` does (``cli_batch``): the
    one-line errors and exit statuses of the tests that need a process of its own, without starting torch for
    each."""
    session = Session()
    yield session
    session.close()
