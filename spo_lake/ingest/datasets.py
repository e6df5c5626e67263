"""The built-in datasets (`spolake prompts add --dataset NAME`, recipes' `prompts_add` step): their loaders, and
ingesting a dataset's problems with its human solutions."""
from __future__ import annotations

import importlib
from typing import Any

from spo_lake.errors import InputError
from spo_lake.ingest.core import IngestReport, add_prompts, ingest_trajectories, located
from spo_lake.ingest.records import PROMPT_FIELDS, TRAJECTORY_FIELDS, from_records
from spo_lake.lake import Lake

# dataset name -> module with `load(path, **kw) -> (prompt_records, trajectory_records)`
DATASETS = {
    "countdown": "spo_lake.tasks.countdown",
    "humaneval": "spo_lake.tasks.humaneval",
    "codecontests": "spo_lake.tasks.codecontests",
    "taco": "spo_lake.tasks.taco",
    "pyfunc": "spo_lake.tasks.pyfunc",
}


def ingest_dataset(lake: Lake, name: str, path: str | None, **kwargs: Any) -> tuple[IngestReport, IngestReport]:
    """Load a dataset's problems and human solutions and commit both; returns the two reports."""
    if name not in DATASETS:
        raise InputError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    loader = importlib.import_module(DATASETS[name]).load
    prompt_records, trajectory_records = loader(path, **{k: v for k, v in kwargs.items() if v is not None})
    origin = f"{name}:{path}" if path else name
    p = add_prompts(lake, from_records(located(prompt_records, origin), PROMPT_FIELDS, "prompts"))
    t = ingest_trajectories(lake, from_records(located(trajectory_records, origin), TRAJECTORY_FIELDS, "trajectories"),
                            source="human", defaults={"model": f"{name}-solutions"})
    return p, t
