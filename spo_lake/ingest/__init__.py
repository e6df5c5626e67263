"""Ingest: readers for JSONL/Parquet/CSV/Hugging Face datasets, input shapes, strict validation, idempotent commits.

The package is also callable: `from spo_lake import ingest; ingest(lake, "samples.jsonl")` is `inputs.ingest`.
"""
import sys
import types

from spo_lake.ingest.core import IngestReport, add_prompts, ingest_trajectories, load_batch, located
from spo_lake.ingest.ids import response_hashes, trajectory_ids
from spo_lake.ingest.inputs import ingest, ingest_prompts, read_input
from spo_lake.ingest.readers import IngestError
from spo_lake.ingest.records import PROMPT_FIELDS, SOURCES, TRAJECTORY_FIELDS, from_arrow, from_records
from spo_lake.ingest.rules import validate_prompts, validate_trajectories
from spo_lake.ingest.shapes import ExtraFields, RewardMap

__all__ = [
    "ExtraFields", "IngestError", "IngestReport", "PROMPT_FIELDS", "RewardMap", "SOURCES", "TRAJECTORY_FIELDS",
    "add_prompts", "from_arrow", "from_records", "ingest", "ingest_prompts", "ingest_trajectories", "load_batch",
    "located", "read_input", "response_hashes", "trajectory_ids", "validate_prompts", "validate_trajectories",
]


class _CallablePackage(types.ModuleType):
    """`spo_lake.ingest` is both this package and, at the top level of the API, the ingest function: a function
    bound to that name would be replaced by the package as soon as any of its modules is imported."""

    def __call__(self, *args, **kwargs) -> IngestReport:
        return ingest(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
