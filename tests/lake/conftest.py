from __future__ import annotations

import pytest

from spo_lake.lake import Lake


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake.init(tmp_path / "lake")


def pytest_configure(config):
    config.addinivalue_line("markers", "torture: bounded mixed-concurrency torture test (runs in CI; "
                                       "deselect locally with -m 'not torture')")
