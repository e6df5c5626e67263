"""Ingest: readers for JSONL/Parquet/CSV/Hugging Face datasets, strict validation, idempotent commits."""
from spo_lake.ingest.core import IngestReport, add_prompts, ingest_trajectories, load_batch, located
from spo_lake.ingest.ids import response_hashes, trajectory_ids
from spo_lake.ingest.readers import IngestError
from spo_lake.ingest.records import PROMPT_FIELDS, SOURCES, TRAJECTORY_FIELDS, from_arrow, from_records
from spo_lake.ingest.rules import validate_prompts, validate_trajectories

__all__ = [
    "IngestError", "IngestReport", "PROMPT_FIELDS", "SOURCES", "TRAJECTORY_FIELDS", "add_prompts", "from_arrow",
    "from_records", "ingest_trajectories", "load_batch", "located", "response_hashes", "trajectory_ids",
    "validate_prompts", "validate_trajectories",
]
