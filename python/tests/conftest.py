"""Shared fixtures of the segtape package's tests (run by tests/run.sh)."""
import pytest

import segtape


@pytest.fixture
def tape():
    return segtape.Tape(segment_budget="8MiB")
