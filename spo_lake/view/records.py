"""The typed rows the site's pages are made from (read by spo_lake.view.data, rendered by spo_lake.view.pages)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pivot:
    """A pivotal token: response token `position` moved π0's success estimate from s_before to s_after; start/end
    are its characters in the response text (None when they could not be placed: no tokenizer given, or its
    tokens do not spell the stored text)."""

    position: int
    token_id: int
    s_before: float
    s_after: float
    start: int | None = None
    end: int | None = None

    @property
    def delta(self) -> float:
        return self.s_after - self.s_before


@dataclass(frozen=True)
class Trajectory:
    trajectory_id: str
    source: str
    run_id: str | None
    model_id: str | None
    policy_version: int | None
    created_at: Any
    response_text: str  # cut to the page's limit; `response_chars` is the stored length
    response_chars: int
    verdict: str | None  # None: not judged yet
    reward: float | None
    detail: str | None
    verifier: str | None
    pivots: tuple[Pivot, ...] = ()


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    task: str | None
    prompt: str | None
    tests: str | None  # the stored JSON text
    metadata: str | None
    q0: list[dict[str, Any]] = field(default_factory=list)  # model_id, n, n_success: the latest count per model
    trajectories: int = 0  # stored; the page shows at most its cap


@dataclass(frozen=True)
class PromptSummary:
    prompt_id: str
    task: str | None
    samples: int
    correct: int
    q0_rate: float | None
    pivots: int


@dataclass(frozen=True)
class Run:
    run_id: str
    kind: str
    status: str
    snapshot: str | None
    config: str | None
    metrics: str | None
    started_at: Any
    rows_written: int


@dataclass(frozen=True)
class RunDetail:
    run: Run
    steps: list[dict[str, Any]]  # metrics.jsonl records, [] without a run directory
    streams: list[dict[str, Any]]  # lake rows read per stream (spo_lake.rl.batches.batch_sources)
    written: list[dict[str, Any]]  # policy_version, source, verdict, rollouts
    prompts: list[dict[str, Any]]  # prompt_id, rollouts, passed: the prompts it wrote most rollouts for
    notes: list[str]  # why a part is missing (no run directory, unreadable metrics, ...)


@dataclass(frozen=True)
class Overview:
    title: str
    snapshot: str | None
    counts: list[dict[str, Any]]  # source, task, verdict, trajectories
    snapshots: list[dict[str, Any]]  # name, note, created_at, versions
    runs: list[Run]
    coverage: list[dict[str, Any]]
    first_solved: list[dict[str, Any]]
    first_solved_total: int
    hardest: list[dict[str, Any]]
    demo_report: str | None = None  # site-relative path of the demo's report, when linked
