from __future__ import annotations

import pytest

from spo_lake.lake import Lake


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake.init(tmp_path / "lake")
