"""spo-lake: a versioned trajectory lake and Soft Policy Optimization trainer.

The API a notebook reaches for first (the same operations as the `spolake` verbs):

    from spo_lake import Lake, ingest, export, verifier_reward

    lake = Lake.open("lake", create=True)
    ingest(lake, "completions.jsonl", source="reference", model="my-model", task="countdown")  # any input shape
    lake.snapshot("exp-1")
    lake.sql("SELECT source, count(*) FROM trajectories GROUP BY 1", snapshot="exp-1")
    sft = export(lake, "exp-1", shape="sft").to_dataset()           # prompt + completion, for TRL's SFTTrainer
    prompts = export(lake, "exp-1", shape="prompt").to_dataset()    # for GRPOTrainer(reward_funcs=verifier_reward())

Names are imported on first use, so `import spo_lake` stays cheap.
"""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("spo-lake")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

_API = {
    "Lake": "spo_lake.lake", "LakeError": "spo_lake.lake", "Snapshot": "spo_lake.lake", "UserError": "spo_lake.errors",
    "IngestError": "spo_lake.ingest", "IngestReport": "spo_lake.ingest", "RewardMap": "spo_lake.ingest",
    "ingest_prompts": "spo_lake.ingest",
    "Export": "spo_lake.exports", "Shape": "spo_lake.exports", "export": "spo_lake.exports",
    "verifier_reward": "spo_lake.rewards", "record_rollouts": "spo_lake.trl_lake",
}
__all__ = ["__version__", "ingest", *_API]


def __getattr__(name: str):
    if name == "ingest":  # the package itself, which is callable as the ingest function
        return importlib.import_module("spo_lake.ingest")
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'spo_lake' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
