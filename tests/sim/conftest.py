"""Fixtures for the digital-twin tests (helpers live in simtest_util.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests here import simtest_util

from simtest_util import SimFactory

from disagg.local.procs import Processes


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFactory]:
    with Processes(tmp_path_factory.mktemp("sims")) as procs:
        yield SimFactory(procs)
