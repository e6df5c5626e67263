import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake


@pytest.fixture
def countdown_lake(tmp_path) -> Lake:
    """A lake with 4 countdown problems and their solver (`human`) solutions."""
    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    return lake
