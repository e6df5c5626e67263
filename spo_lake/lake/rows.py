"""The rows of the lake's tables, built in one place: one keyword-only constructor per table that more than one
pipeline writes, the run ids and trajectory ids they carry, the seeds sampling derives, and the `runs` bookkeeping
with its package versions.

Every writer of a table calls its constructor here, so the provenance a row records (model, tokenizer, settings,
run, seeds) cannot silently differ between the pipelines that write it. JSON columns (metadata, config, metrics,
manifest) are given as Python objects and serialised here.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata as package_metadata
from typing import TYPE_CHECKING, Any

from spo_lake.ending import open_ending
from spo_lake.lake.contracts import to_json_text

if TYPE_CHECKING:
    from spo_lake.lake.core import Lake

PACKAGES = ("spo-lake", "torch", "transformers", "tokenizers", "deltalake", "duckdb", "polars", "pyarrow")


def package_versions() -> dict[str, str | None]:
    """The installed version of each package a run's results depend on (None when not installed, e.g. a source
    checkout run without installing)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = package_metadata.version(name)
        except package_metadata.PackageNotFoundError:
            out[name] = None
    return out


def new_run_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed determined by `parts` (stable across processes, unlike hash())."""
    digest = hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def sampled_id(scope: str, prompt_id: str, index: int, *extra: Any) -> str:
    """Trajectory id of a sampled row, from what determines it. `scope` is a run id for a run's rollouts (unique
    per run, so a crashed run's orphan facts are never re-used), or the sampler's identity with the response's
    own token ids in `extra` for `sample`/`q0`: the same draw gets the same id wherever it is replayed (a rebuilt
    lake has the same ids, so SQL that hashes ids, like a stream's shuffle, repeats too), and a fact left by a
    crashed copy is a fact about this very response."""
    return hashlib.blake2b(json.dumps([scope, prompt_id, index, *extra]).encode(), digest_size=16).hexdigest()


def trajectory_row(*, trajectory_id: str, prompt_id: str, source: str, model_id: str, run_id: str,
                   policy_version: int | None, temperature: float, top_p: float, response_text: str,
                   token_ids: list[int] | None, behavior_logprobs: list[float] | None, tokenizer_id: str | None,
                   response_hash: str, metadata: dict[str, Any], prefix_trajectory_id: str | None = None,
                   prefix_position: int | None = None) -> dict[str, Any]:
    """A `trajectories` row for a generated response; a continuation of a stored trajectory names its prefix."""
    return {
        "trajectory_id": trajectory_id, "prompt_id": prompt_id, "source": source, "model_id": model_id,
        "run_id": run_id, "policy_version": policy_version, "temperature": temperature, "top_p": top_p,
        "response_text": response_text, "token_ids": token_ids, "behavior_logprobs": behavior_logprobs,
        "tokenizer_id": tokenizer_id, "response_hash": response_hash, "prefix_trajectory_id": prefix_trajectory_id,
        "prefix_position": prefix_position, "metadata": to_json_text(metadata),
    }


def evaluation_row(*, trajectory_id: str, verifier: str, passed: bool, reward: float, verdict: str,
                   first_failing_test: int | None, detail: str, duration_s: float,
                   extraction: str) -> dict[str, Any]:
    """An `evaluations` row: one verifier's verdict on one trajectory (`detail` cut to 2000 characters)."""
    return {
        "trajectory_id": trajectory_id, "verifier": verifier, "passed": passed, "reward": reward, "verdict": verdict,
        "first_failing_test": first_failing_test, "detail": _text(detail[:2000]), "duration_s": duration_s,
        "extraction": _text(extraction),
    }


def _text(value: str) -> str:
    """Valid UTF-8 whatever a program made of it (a lone surrogate would fail the whole write)."""
    return value.encode("utf-8", "replace").decode("utf-8")


def values_row(*, prompt_id: str, trajectory_id: str | None, position: int | None, model_id: str, n: int,
               n_success: int, run_id: str, temperature: float = 1.0, top_p: float = 1.0) -> dict[str, Any]:
    """A `values` row: n Monte-Carlo samples of the model, n_success of them passing, from the prompt
    (trajectory_id and position None) or from the first `position` tokens of a trajectory. Values are of π0
    itself: temperature 1 and top-p 1 unless said otherwise."""
    return {"prompt_id": prompt_id, "trajectory_id": trajectory_id, "position": position, "model_id": model_id,
            "temperature": temperature, "top_p": top_p, "n": n, "n_success": n_success, "run_id": run_id}


def runs_row(*, run_id: str, kind: str, status: str, config: dict[str, Any], metrics: dict[str, Any],
             manifest: dict[str, Any], snapshot: str | None = None,
             snapshot_versions: dict[str, int] | None = None) -> dict[str, Any]:
    """A `runs` row: one per status change (running, finished, failed) of a run."""
    return {"run_id": run_id, "kind": kind, "status": status, "config": to_json_text(config),
            "snapshot": snapshot, "snapshot_versions": to_json_text(snapshot_versions),
            "metrics": to_json_text(metrics), "manifest": to_json_text(manifest)}


def ended_status(exc: BaseException) -> str:
    """The `runs` status of a run that `exc` ended: failed for an error, interrupted for Ctrl-C or a termination
    signal (BaseExceptions that are not errors)."""
    return "failed" if isinstance(exc, Exception) else "interrupted"


@dataclass
class RunRecord:
    run_id: str
    metrics: dict[str, Any] = field(default_factory=dict)


@contextmanager
def recorded_run(lake: Lake, kind: str, config: dict[str, Any]) -> Iterator[RunRecord]:
    """A `runs` row with status running, then finished (with the metrics the body filled in), or failed or
    interrupted (`ended_status`)."""
    run = RunRecord(new_run_id(kind))
    manifest = {"seed": config.get("seed"), "packages": package_versions()}

    def write(status: str) -> None:
        lake.append("runs", [runs_row(run_id=run.run_id, kind=kind, status=status, config=config,
                                      metrics=run.metrics, manifest=manifest)])

    write("running")
    with open_ending(write) as end:  # a forced exit (Ctrl-C's watchdog) records it interrupted
        try:
            yield run
        except BaseException as exc:
            end(ended_status(exc))
            raise
        end("finished")
