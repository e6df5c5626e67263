"""Small helpers shared by tests (fixtures live in conftest.py files)."""
from pathlib import Path

from spo_lake.ingest import TRAJECTORY_FIELDS, from_records, ingest_trajectories, located
from spo_lake.lake import Lake


def add_responses(lake: Lake, rows: list[dict], source: str = "reference", model: str = "test-model") -> None:
    """Ingest response records through the real ingest path."""
    batch = from_records(located(rows, "test"), TRAJECTORY_FIELDS, "trajectories")
    ingest_trajectories(lake, batch, source=source, defaults={"model": model})


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
