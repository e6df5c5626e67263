"""A TRL `GRPOTrainer` writes every rollout into the lake while it trains: one line after building the trainer.

    trainer = GRPOTrainer(model=..., reward_funcs=verifier_reward(), args=..., train_dataset=prompts)
    record_rollouts(trainer, "lake")    # the one line
    trainer.train()

Every completion of every step lands as a trajectory: the dataset's `prompt_id` (or one derived from the prompt
text, which `task=` then creates), the completion text and token ids, the trainer's `global_step` when it was
sampled as `policy_version`, the run (`args.run_name`, else a fresh `trl-<uuid>`) as `run_id`, source `trl-grpo`,
the model and sampling settings. The reward: with `spo_lake.rewards.verifier_reward()` each completion is judged in
the sandbox once (TRL gets the reward from the same verdict) and the verdict is recorded as that verifier's
evaluation; any other reward function's value goes through ingest's strict reward mapping (`reward_map`: the lake
keeps 0 = pass, -1 = fail; "binary", "signed", "1=0,0=-1" or a threshold ">=0.5"), and a None reward is recorded as
no reward (counted in `recorder.rewardless`).

How it stays off the training step: the wrapped reward function only appends rows to a buffer; every `flush_rows`
rows the buffer goes to a writer thread, which ingests it (ingest's validation and id rules, one commit each for
new prompts, verdicts and trajectories, under the lake's cross-process lock, so several runs can share a lake).
`trainer.train` is wrapped so the rest is flushed when it returns or raises (Ctrl-C), and SIGTERM during training
raises SystemExit in the main thread so it unwinds the same way; a SIGKILL loses the unflushed buffer but never
leaves part of a batch, because each batch's trajectories are one Delta commit.
"""
from __future__ import annotations

import math
import os
import queue
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

from spo_lake.errors import InputError
from spo_lake.ingest import TRAJECTORY_FIELDS, ingest_trajectories, read_input
from spo_lake.ingest.ids import response_digests, trajectory_ids
from spo_lake.ingest.records import SOURCES, CheckedRows
from spo_lake.ingest.shapes import RewardMap
from spo_lake.lake import Lake
from spo_lake.rewards import completion_text
from spo_lake.tasks import Verdict
from spo_lake.tasks.judge import verdict_row

SOURCE = "trl-grpo"


# A buffered row: the trajectory record and, when spo-lake's verifier judged it, (verifier name, verdict).
_Row = tuple[dict[str, Any], tuple[str, Verdict] | None]


class LakeRecorder:
    """Buffers rollouts and commits them in batches from a writer thread (see the module docstring)."""

    def __init__(self, lake: Lake, *, run_id: str, source: str = SOURCE, model: str | None = None,
                 tokenizer: str | None = None, temperature: float | None = None, top_p: float | None = None,
                 task: str | None = None, reward_map: RewardMap | str | None = None, flush_rows: int = 256):
        if source not in SOURCES:
            raise InputError(f"source {source!r}: unknown (one of {', '.join(SOURCES)})")
        if flush_rows < 1:
            raise InputError(f"flush_rows must be at least 1, got {flush_rows}")
        self.lake, self.run_id, self.source, self.task, self.flush_rows = lake, run_id, source, task, flush_rows
        self.reward_map = RewardMap.parse(reward_map) if isinstance(reward_map, str) else reward_map
        self.fill = {"model": model, "tokenizer": tokenizer, "temperature": temperature, "top_p": top_p}
        self.calls = 0  # reward calls seen: numbers the rows of each call (their metadata keeps draws apart)
        self.rows = 0  # rows given to the recorder so far
        self.rewardless = 0  # rows recorded without a reward (the reward function returned None)
        self.committed = 0  # rows the writer committed (new) so far
        self._pending: list[_Row] = []
        self._queue: queue.Queue[list[_Row] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self._writer = threading.Thread(target=self._write, name="spo-lake-recorder", daemon=True)
        self._writer.start()

    # ---- the training side: cheap
    def add(self, *, step: int, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None,
            columns: dict[str, Any], rewards: list[float | None],
            verdicts: list[tuple[str, Verdict] | None] | None) -> None:
        """Buffer one reward call's rows; hand the buffer to the writer once it holds `flush_rows` rows."""
        self._raise_writer_error()
        ids = columns.get("prompt_id")
        rows = []
        for i, completion in enumerate(completions):
            reward = rewards[i]
            if reward is not None and math.isnan(reward):  # TRL's marker for "no reward"
                reward = None
            record = {"prompt_id": ids[i] if ids is not None else None, "response": completion_text(completion),
                      "source": self.source, "run_id": self.run_id, "policy_version": step, **self.fill,
                      "reward": None if verdicts is not None else reward,
                      "metadata": {"trl": {"call": self.calls, "index": i}}}
            if ids is None:  # the prompt text names (and with `task`, creates) the prompt
                record["prompt"] = prompts[i]
            if completion_ids is not None:
                record["token_ids"] = [int(t) for t in completion_ids[i]]
            rows.append((record, verdicts[i] if verdicts is not None else None))
        # one list operation: a signal (SIGTERM unwinding the step) cannot leave half a call in the buffer
        self._pending.extend(rows)
        self.calls += 1
        self.rows += len(rows)
        self.rewardless += sum(r["reward"] is None and v is None for r, v in rows)
        if len(self._pending) >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        """Hand the buffered rows to the writer (it commits them as one batch). Were a signal to land between the
        two statements, the same rows would be handed twice: the second commit finds them present and adds none."""
        if self._pending:
            self._queue.put(self._pending)
            self._pending = []

    def close(self) -> None:
        """Flush, wait until the writer has committed everything, stop it; raises what the writer raised."""
        if not self._closed:
            self._closed = True
            self.flush()
            self._queue.put(None)
            self._writer.join()
        self._raise_writer_error()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            raise self._error

    # ---- the writer thread
    def _write(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._error is None:  # after a failure, later batches are not written (they would skip rows)
                try:
                    self._commit(batch)
                except BaseException as exc:  # raised in the training thread at its next call, or by close()
                    self._error = exc

    def _commit(self, rows: list[_Row]) -> None:
        batch = read_input([r for r, _ in rows], TRAJECTORY_FIELDS, "trajectories", reward_map=self.reward_map)
        judged = [(i, v) for i, (_, v) in enumerate(rows) if v is not None]
        if judged:  # the verdicts name their trajectories: give the batch the ids ingest would derive
            t = batch.table
            ids = trajectory_ids(t, response_digests(t.column("response"))[1])
            batch = CheckedRows(t.set_column(t.schema.get_field_index("trajectory_id"), "trajectory_id", ids),
                                batch.where)
            # verdicts first: a crash before the trajectories commit leaves only facts nothing references yet
            self.lake.added("evaluations", [verdict_row(ids[i].as_py(), name, v) for i, (name, v) in judged])
        report = ingest_trajectories(self.lake, batch, task=self.task)
        self.committed += report.new


class _RecordingReward:
    """A reward function that records each call's rollouts, then returns the wrapped function's rewards."""

    def __init__(self, inner: Callable[..., list], recorder: LakeRecorder, name: str):
        self.inner, self.recorder, self.__name__ = inner, recorder, name

    def __call__(self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None = None,
                 trainer_state: Any = None, **columns: Any) -> list[float | None]:
        judge = getattr(self.inner, "verdicts", None)
        verdicts: list[tuple[str, Verdict] | None] | None = None
        if judge is not None:  # spo-lake's verifier: judge once, record the verdicts, reward from them
            verdicts = judge(completions, columns)
            rewards: list[float | None] = [None if v is None else v[1].reward for v in verdicts]
        else:
            rewards = list(self.inner(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                      trainer_state=trainer_state, **columns))
        step = trainer_state.global_step if trainer_state is not None else 0
        self.recorder.add(step=step, prompts=prompts, completions=completions, completion_ids=completion_ids,
                          columns=columns, rewards=rewards, verdicts=verdicts)
        return rewards


def record_rollouts(trainer: Any, lake: Lake | str | os.PathLike, *, run_id: str | None = None,
                    source: str = SOURCE, reward: str | int | None = None, reward_map: RewardMap | str | None = None,
                    task: str | None = None, flush_rows: int = 256) -> LakeRecorder:
    """Make a TRL `GRPOTrainer` write its rollouts into `lake` (a Lake or a path, created if missing).

    `reward`: which of the trainer's reward functions gives the recorded reward (its name or index; default: the
    first Python callable); `reward_map`: that function's convention if it is not 0/-1 (spo-lake's verifier needs
    none); `task`: creates prompts from the prompt text when the dataset has no `prompt_id` column; `flush_rows`:
    rows per commit. Returns the recorder (`committed`, `rewardless`; `close()` is called when `train` ends).
    """
    from trl.trainer.utils import is_async_callable

    lake = lake if isinstance(lake, Lake) else Lake.open(lake, create=True)
    index = _reward_index(trainer, reward)
    inner = trainer.reward_funcs[index]
    if is_async_callable(inner):
        raise InputError(f"record_rollouts: reward function {trainer.reward_func_names[index]!r} is async; record "
                         "through a synchronous one")
    args = trainer.args
    model = trainer.model
    recorder = LakeRecorder(
        lake, run_id=run_id or args.run_name or f"trl-{uuid.uuid4().hex[:12]}", source=source,
        model=getattr(model, "name_or_path", None) or None, tokenizer=getattr(trainer.processing_class,
                                                                              "name_or_path", None) or None,
        temperature=getattr(args, "temperature", None), top_p=getattr(args, "top_p", None), task=task,
        reward_map=reward_map, flush_rows=flush_rows)
    trainer.reward_funcs[index] = _RecordingReward(inner, recorder, trainer.reward_func_names[index])
    train = trainer.train

    def train_and_flush(*a: Any, **kw: Any) -> Any:
        with _sigterm_unwinds():
            try:
                return train(*a, **kw)
            finally:
                recorder.close()

    trainer.train = train_and_flush
    return recorder


def _reward_index(trainer: Any, reward: str | int | None) -> int:
    names = list(trainer.reward_func_names)
    if isinstance(reward, int):
        if not 0 <= reward < len(names):
            raise InputError(f"record_rollouts: reward={reward}: the trainer has {len(names)} reward functions")
        return reward
    if isinstance(reward, str):
        if reward not in names:
            raise InputError(f"record_rollouts: reward={reward!r}: not one of {', '.join(names)}")
        return names.index(reward)
    import torch.nn as nn

    callables = [i for i, f in enumerate(trainer.reward_funcs) if not isinstance(f, nn.Module)]
    if not callables:
        raise InputError("record_rollouts: the trainer has no Python reward function to record through")
    return callables[0]


class _sigterm_unwinds:
    """SIGTERM raises SystemExit(143) in the main thread while training, so `finally` flushes (main thread only:
    Python delivers signals there)."""

    def __enter__(self) -> None:
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _exit_143)

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _exit_143(*_: Any) -> None:
    raise SystemExit(143)


__all__ = ["LakeRecorder", "record_rollouts"]
