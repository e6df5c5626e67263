"""Small helpers shared by tests (fixtures live in conftest.py files)."""
from spo_lake.ingest import TRAJECTORY_FIELDS, from_records, ingest_trajectories, located
from spo_lake.lake import Lake


def add_responses(lake: Lake, rows: list[dict], source: str = "reference", model: str = "test-model") -> None:
    """Ingest response records through the real ingest path."""
    batch = from_records(located(rows, "test"), TRAJECTORY_FIELDS, "trajectories")
    ingest_trajectories(lake, batch, source=source, defaults={"model": model})
