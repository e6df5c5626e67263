"""The streaming SPO trainer (and its PPO and GRPO baselines): pinned lake snapshot + online rollouts → updates →
write-back. Each algorithm's loss and keys: docs/algorithms.md.

One step, top to bottom (`Trainer.train_step`):
    examples = mixer.draw(step)                     # lake streams + online rollouts, fixed shares
    for micro in micro-batches:
        policy_lp = log πθ(response)                  # with gradient
        ref_lp    = log π0(response)                  # cached in the lake, else the live reference model
        loss      = Σ_streams spo_loss(...) / B       # each stream with its own objective and loss (PPO, GRPO: theirs)
        loss.backward()
    (under torchrun: average the gradients over the ranks)
    clip gradients → AdamW step → LR schedule → publish the behaviour policy every model_update_interval steps
"""
from __future__ import annotations

import copy
import json
import math
import time
from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from spo_lake.console import progress_bar
from spo_lake.ending import open_ending
from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.rows import ended_status, new_run_id, runs_row
from spo_lake.models import load_policy
from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.threads import use_threads
from spo_lake.models.tokens import tokenizer_id
from spo_lake.rl import run as rundir
from spo_lake.rl.config import (
    StreamConfig,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    inject_per_group,
    stream_counts,
)
from spo_lake.rl.data import LakeStream, StreamSettings, online_prompts, solution_log_mass
from spo_lake.rl.distributed import current_world
from spo_lake.rl.evaluation import EvalSettings, evaluate_policy, select_problems
from spo_lake.rl.examples import Batch, Example, collate
from spo_lake.rl.grpo_math import group_advantages, grpo_loss
from spo_lake.rl.losses import lake_bounded_q0, luffy_token_weights, spo_loss
from spo_lake.rl.memory import saved_for_backward, training_state
from spo_lake.rl.mixer import Mixer
from spo_lake.rl.ppo import PPOSettings, ValueModel, ppo_loss
from spo_lake.rl.rollout import (
    OnlineSource,
    PolicyVersions,
    Rollouts,
    RolloutSchedule,
    RolloutSettings,
    written_trajectory_ids,
)
from spo_lake.rl.scoring import reference_log_probs, response_log_probs
from spo_lake.rollouts.engine import PolicySpec
from spo_lake.rollouts.executors import Executor, LocalExecutor, RayExecutor
from spo_lake.tasks import SandboxOptions

TIMING_KEYS = ("seconds", "tokens_per_s", "wait_s")  # metrics that vary between identical runs


def resolve_device(device: str) -> torch.device:
    return torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                        "cpu" if device == "auto" else device)


def resolve_dtype(dtype: str, device: torch.device) -> str:
    return ("bfloat16" if device.type == "cuda" else "float32") if dtype == "auto" else dtype


class Stats:
    """Sums and counts of per-step diagnostics; `means()` gives the logged values."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)

    def add(self, key: str, total: float, count: float = 1.0) -> None:
        self.sums[key] += total
        self.counts[key] += count

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums if self.counts[k]}

    def merge(self, other: Stats) -> None:
        for key in other.sums:
            self.add(key, other.sums[key], other.counts[key])


class Trainer:
    """A training run. `Trainer(config, lake)` starts a new one; `Trainer.resume(run_dir, lake)` continues one.
    Under torchrun (spo_lake.rl.distributed.process_group) it is one rank of the run."""

    def __init__(self, config: TrainConfig, lake: Lake, *, show_progress: bool = True, _resume_dir: Path | None = None,
                 _trust_pickles: bool = False):
        self.world = current_world()
        self.lake, self.config, self.show_progress = lake, config, show_progress and self.world.main
        self.resuming, self.trust_pickles = _resume_dir is not None, _trust_pickles
        if _resume_dir is None:
            self.run_id = self.world.broadcast(config.run.name or new_run_id("train"))
            self.run_dir = Path(config.run.dir) / self.run_id
            if self.world.main and self.run_dir.exists():
                raise InputError(f"run directory {self.run_dir} exists; continue it with --resume {self.run_dir}")
            self.checkpoint = None
        else:
            self.run_dir, self.run_id = _resume_dir, _resume_dir.name
            checkpoints = rundir.checkpoint_dirs(_resume_dir)
            self.checkpoint = checkpoints[-1] if checkpoints else None
        self.device = resolve_device(config.run.device)
        self.dtype = resolve_dtype(config.run.dtype, self.device)
        # The rollout worker runs torch while the trainer updates, and so does every rank on this machine: each gets
        # its share of the cores.
        online = any(s.kind == "online" for s in config.data.streams)
        self.threads = use_threads(config.run.threads, concurrent=(2 if online else 1) * self.world.local_size)
        r = config.rollout
        self.sandbox = SandboxOptions(timeout_s=r.sandbox_timeout_s, memory_mb=r.sandbox_memory_mb, mode=r.sandbox_mode)
        torch.manual_seed(config.run.seed)
        self.snapshot = self._pin_snapshot()

        # A resumed run loads its policy from the checkpoint: from_pretrained-loadable by construction.
        self.policy = TransformersPolicy.from_pretrained(
            str(self.checkpoint or config.model.path), str(self.device), self.dtype)
        self.policy.model_id = config.model.path
        self.model = self.policy.model
        self._reference: torch.nn.Module | None = None
        self.state_counted = False  # the run's first update counts the training state (spo_lake.rl.memory)
        self.value_model = ValueModel.from_pretrained(config.model.path, self.model.dtype, self.device) \
            if config.algorithm.name == "ppo" else None
        if config.run.gradient_checkpointing:
            for module in (self.model, self.value_model.backbone if self.value_model is not None else None):
                if module is not None:  # transformers 5 renamed gradient_checkpointing_enable
                    new = "activation_checkpointing_enable"
                    getattr(module, new if hasattr(module, new) else "gradient_checkpointing_enable")()
        groups = [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": config.optim.lr}]
        if self.value_model is not None:
            groups.append({"params": list(self.value_model.parameters()), "lr": config.ppo.value_lr})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=config.optim.weight_decay)
        warmup, sft = config.optim.warmup_steps, config.grpo.sft_steps
        # warm-up, then constant; SFT→GRPO warms up again at the switch, as a second run from the SFT model would
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s - (sft if s >= sft else 0) + 1) / warmup) if warmup else 1.0)
        p = config.ppo
        self.ppo = PPOSettings(beta=config.algorithm.beta, gamma=p.gamma, lam=p.lam, clip_eps=p.clip_eps,
                               value_coef=p.value_coef)
        self.step = 0
        self.versions = PolicyVersions()
        self._last_rollouts: dict[str, Any] = {}
        self._build_streams()
        # mechanisms.q0_lake_bound: log Σ π0(y) of each prompt's correct lake rows, read once from the pinned snapshot
        self.solution_log_mass = solution_log_mass(lake, self.snapshot, config.model.pi0_id) \
            if config.mechanisms.q0_lake_bound and config.algorithm.name == "spo" else {}
        if self.checkpoint is not None:
            self._load_checkpoint(self.checkpoint)
        self.eval_problems = select_problems(lake, config.eval.where, self.snapshot, config.eval.max_prompts) \
            if config.eval.every else []
        self.train_eval_problems = select_problems(lake, config.eval.train_where, self.snapshot,
                                                   config.eval.max_prompts) \
            if config.eval.every and config.eval.train_where else []
        wanted = [("eval_where", self.eval_problems)] + \
            [("eval_train_where", self.train_eval_problems)] * bool(config.eval.train_where)
        for key, chosen in wanted if config.eval.every else []:
            if not chosen:  # fail before training, not at the first evaluation
                raise InputError(f"{key} `{config.get(key) or 'TRUE'}` selects no prompt at snapshot "
                                 f"{self.snapshot!r} (add those prompts, or set eval_every = 0)")

    @classmethod
    def resume(cls, run_dir: str | Path, lake: Lake, overrides: list[str] | None = None,
               show_progress: bool = True, trust_pickles: bool = False) -> Trainer:
        """Continue a run from its newest checkpoint with its recorded config (plus `overrides`, e.g. more steps):
        same snapshot, data order, rollout schedule and RNG states. `trust_pickles` lets the pickled state files of
        older run directories load (docs/security.md)."""
        run_dir = Path(run_dir)
        manifest_path = run_dir / "manifest.json"
        if not manifest_path.is_file():
            raise InputError(f"--resume {run_dir}: no manifest.json there (not a run directory)")
        rundir.check_run_dir(run_dir)
        try:
            recorded = json.loads(manifest_path.read_text())["config"]
        except (ValueError, RecursionError, KeyError, TypeError):
            raise InputError(f"{manifest_path}: field `config`: not a run manifest") from None
        if not isinstance(recorded, dict):
            raise InputError(f"{manifest_path}: field `config`: expected a JSON object")
        config = config_from_dict(apply_overrides(recorded, overrides or []))
        return cls(config, lake, show_progress=show_progress, _resume_dir=run_dir, _trust_pickles=trust_pickles)

    # ------------------------------------------------------------------------------------- setup

    def _pin_snapshot(self) -> str:
        """The run reads one snapshot: the named one, or one it creates under its own id (re-used on resume)."""
        name = self.config.data.snapshot or self.run_id
        if self.world.main and name not in {s.name for s in self.lake.snapshots()}:
            if self.config.data.snapshot:
                raise InputError(f"no snapshot named {name!r} (see `spolake snapshot list`)")
            self.lake.snapshot(name, note=f"pinned by training run {self.run_id}")
        self.world.barrier()  # the other ranks read the snapshot rank 0 pinned
        return name

    def _build_streams(self) -> None:
        c = self.config
        counts = stream_counts(c)
        spo = c.algorithm.name == "spo"
        settings = StreamSettings(pi0_id=c.model.pi0_id, beta=c.algorithm.beta, seed=c.run.seed,
                                  max_response_tokens=c.data.max_response_tokens, require_q0=spo,
                                  page_size=c.data.page_size, q0_prior=c.algorithm.q0_prior)
        self.lake_streams = {i: LakeStream(self.lake, self.snapshot, s, i, settings, self.policy)
                             for i, s in enumerate(c.data.streams) if s.kind == "lake" and not s.inject}
        joined = [i for i, s in enumerate(c.data.streams) if s.inject]
        # The worker thread reads the `inject` stream: with a tokenizer of its own (a fast tokenizer used from two
        # threads at once can fail), as its rollout policy has.
        inject = LakeStream(self.lake, self.snapshot, c.data.streams[joined[0]], joined[0], settings,
                            TransformersPolicy(self.model, copy.deepcopy(self.policy.tokenizer), c.model.path)) \
            if joined else None
        # SFT→GRPO: the SFT phase's rows; stream index len(streams), logged as reward/sft
        sft = StreamConfig(name="sft", kind="lake", fraction=1.0, where=c.grpo.sft_where)
        self.sft_mixer = Mixer([c.optim.batch_size], {0: LakeStream(
            self.lake, self.snapshot, sft, len(c.data.streams), settings, self.policy)},
            rank=self.world.rank, ranks=self.world.size) if c.grpo.sft_steps else None
        online = next((i for i, s in enumerate(c.data.streams) if s.kind == "online"), None)
        self.online: OnlineSource | None = None
        self.appender: BufferedAppender | None = None
        self.executor: Executor | None = None  # what the online stream samples on, when not a copy of the policy
        if online is not None:
            prompts = online_prompts(self.lake, self.snapshot, c.data.prompts_where, c.model.pi0_id, require_q0=spo)
            r = c.rollout
            schedule = RolloutSchedule(
                seed=c.run.seed, prompts_per_step=counts[online] // r.samples_per_prompt,
                samples_per_prompt=r.samples_per_prompt, temperature_min=r.temperature_min,
                temperature_max=r.temperature_max, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                interval=c.behaviour_interval, lag=r.lag, stop=tuple(r.stop), shard=self.world.rank,
                shards=self.world.size)
            self.rollout_settings = RolloutSettings(
                lake=self.lake, snapshot=self.snapshot, prompts=prompts, schedule=schedule, stream_index=online,
                beta=c.algorithm.beta, algorithm=c.algorithm.name, run_id=self.run_id, model_id=c.model.path,
                options=self.sandbox, judge_workers=r.judge_workers, q0_prior=c.algorithm.q0_prior, inject=inject,
                inject_per_group=inject_per_group(c))
            self.appender = BufferedAppender(self.lake, flush_rows=c.rollout.flush_rows) \
                if c.rollout.write_back and self.world.main else None
            written = written_trajectory_ids(self.lake, self.run_id) if self.resuming and self.world.main else set()
            self.online = OnlineSource(self.policy, self.versions, self.rollout_settings, c.optim.steps,
                                       appender=self.appender, already_written=written,
                                       on_rollouts=self._record_rollouts, world=self.world, write_back=r.write_back)
        self.online_index = online
        self.mixer = Mixer(counts, self.lake_streams, self.online, joined=joined, rank=self.world.rank,
                           ranks=self.world.size)

    def _start_worker(self) -> None:
        if self.online is None:
            return
        schedule = self.rollout_settings.schedule
        if self.step % schedule.interval == 0:  # a refresh point (also when resuming at one)
            self.versions.publish(self.step, self.model.state_dict())
        first = max(self.step, self.config.grpo.sft_steps)  # SFT steps have no rollouts
        needed = schedule.version(first)
        if needed <= self.step and needed not in self.versions.state_dict():  # later versions are published later
            raise RuntimeError(f"checkpoint of step {self.step} lacks the behaviour-policy weights of version "
                               f"{needed} that its next rollouts need")
        c, dtype = self.config, str(self.dtype).removeprefix("torch.")
        r = c.rollout
        if r.executor == "ray":  # the behaviour policy samples and judges in a Ray actor, sent every version it needs
            spec = PolicySpec.of(self.policy, backend=r.backend, dtype=dtype, threads=self.threads)
            self.executor = RayExecutor(spec, 1, r.ray_address, judge_workers=r.judge_workers)
        elif r.backend == "vllm":
            self.executor = LocalExecutor(load_policy(c.model.path, backend="vllm", dtype=dtype), r.judge_workers)
        self.online.start(first, self.executor)

    @property
    def reference(self) -> torch.nn.Module:
        """π0, loaded on first use: a run whose lake rows all have cached log-probs never loads it."""
        if self._reference is None:
            model = self.config.model
            ref = TransformersPolicy.from_pretrained(model.reference_path, str(self.device), self.dtype)
            if tokenizer_id(ref) != tokenizer_id(self.policy):  # token ids would mean different tokens to π0
                raise InputError(f"reference {model.reference_path!r} has another tokenizer than the policy "
                                 f"{model.path!r}; SPO needs both to score the same token ids")
            self._reference = ref.model.eval().requires_grad_(False)
        return self._reference

    # ------------------------------------------------------------------------------------- the step

    def train_step(self) -> dict[str, Any]:
        """Draw one mixed batch, update on it, refresh the behaviour policy when due."""
        started = time.perf_counter()
        sft = self.step < self.config.grpo.sft_steps
        if self.sft_mixer is not None and self.step == self.config.grpo.sft_steps:
            self.optimizer.state.clear()  # GRPO starts with fresh Adam moments, as a second run from the SFT model
        # lake streams + this step's online rollouts, or the SFT phase's lake rows
        examples = self.sft_mixer.draw(self.step) if sft and self.sft_mixer is not None else self.mixer.draw(self.step)
        drawn = time.perf_counter()
        metrics = {**self.update(examples, sft=sft), "phase": "sft" if sft else self.config.algorithm.name}
        self.step += 1
        if self.online_index is not None:
            if self.step % self.config.behaviour_interval == 0 and self.step < self.config.optim.steps:
                self.versions.publish(self.step, self.model.state_dict())
            # Rollouts of the steps still to train (even ones already generated) need nothing older.
            self.versions.release_before(self.rollout_settings.schedule.version(self.step))
        seconds = time.perf_counter() - started
        return {"step": self.step, **metrics, "seconds": seconds, "wait_s": drawn - started,
                "tokens_per_s": metrics["tokens"] / seconds}

    def update(self, examples: list[Example], sft: bool = False) -> dict[str, Any]:
        """One optimizer step on `examples` (grad_accum micro-batches); returns the step's diagnostics. sft: a
        cross-entropy step on the examples' response tokens (SFT→GRPO's first phase)."""
        c, stats = self.config, Stats()
        # Dropout off: A_t = β·(log πθ − log π0) and PPO's ratio are about the policy itself, not a random sub-network.
        self.model.eval()
        if self.value_model is not None:
            self.value_model.eval()
        self.optimizer.zero_grad(set_to_none=True)
        micro_size = c.optim.batch_size // c.optim.grad_accum
        tokens, total_loss = 0, 0.0
        # Token-mean losses (SFT, GRPO's dapo) divide by the whole batch's tokens: micro-batches add up to the batch
        batch_tokens = sum(len(e.response_ids) for e in examples)
        advantages = group_advantages(torch.tensor([e.reward for e in examples]),
                                      torch.tensor([e.group for e in examples]), c.grpo.scale_rewards) \
            if c.algorithm.name == "grpo" and not sft else None
        if advantages is not None and self.mixer.joined:  # lake rows that joined the online groups
            stats.add("injected", sum(e.stream in self.mixer.joined for e in examples))
        # a run's first update counts its training state by tensor, one micro-batch's activations included (once:
        # a resumed run has counted it already)
        counting, activations = self.step == 0 and not self.state_counted, list[torch.Tensor]()
        for start in range(0, len(examples), micro_size):
            share = None if advantages is None else advantages[start : start + micro_size].to(self.device)
            saving: AbstractContextManager[list[torch.Tensor]] = \
                saved_for_backward() if counting and start == 0 else nullcontext([])
            with saving as saved:
                loss, batch_tokens_seen = self._loss(examples[start : start + micro_size], sft, share, batch_tokens,
                                                     len(examples), stats)
                loss.backward()
            activations = saved or activations
            total_loss += loss.item()  # micro-batch losses add up to the batch loss
            tokens += batch_tokens_seen
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.world.average_gradients(parameters)
        if self.world.size > 1:  # the step's loss and diagnostics are the whole batch's, over every rank
            total_loss, tokens, stats = self._across_ranks(total_loss, tokens, stats)
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, c.optim.max_grad_norm)
        finite = bool(torch.isfinite(grad_norm))
        if finite:  # a non-finite gradient would turn every weight into NaN: skip the update, keep the schedule
            self.optimizer.step()
        self.scheduler.step()
        state = {}
        if counting:
            self.state_counted = True
            reference = list(self._reference.parameters()) if self._reference is not None else []
            state = {f"state/{k}": v for k, v in training_state(parameters, reference, self.optimizer,
                                                                activations).items()}
        return {"loss": total_loss, **stats.means(), "grad_norm": float(grad_norm),
                "skipped_nonfinite": int(not finite), "lr": self.scheduler.get_last_lr()[0], "tokens": tokens, **state}

    def _loss(self, examples: list[Example], sft: bool, advantages: torch.Tensor | None, batch_tokens: int,
              batch_size: int, stats: Stats) -> tuple[torch.Tensor, int]:
        """One micro-batch's loss (its share of the batch's) and its tokens: SFT's cross-entropy, GRPO's clipped
        surrogate with the micro-batch's `advantages`, SPO's loss or PPO's."""
        c = self.config
        batch = collate(examples, self.policy.pad_id).to(self.device)
        if self.solution_log_mass:
            batch.q0 = self._lake_bounded_q0(examples, batch.q0)
        policy_lp = response_log_probs(self.model, batch)  # log πθ, with gradient
        if sft:
            loss = -torch.where(batch.response_mask, policy_lp, 0.0).sum() / batch_tokens
            stats.add("sft_nll", -policy_lp.detach()[batch.response_mask].sum().item(), int(batch.response_mask.sum()))
        elif advantages is not None:
            loss = self._grpo_loss(policy_lp, batch, advantages, batch_tokens, batch_size, stats)
        elif c.algorithm.name == "spo":
            loss = self._spo_loss(policy_lp, self._reference_lp(batch), batch, stats)
        else:
            assert self.value_model is not None  # built for PPO
            loss, ppo_stats = ppo_loss(policy_lp, self._reference_lp(batch), self.value_model(batch), batch, self.ppo)
            loss = loss / c.optim.grad_accum
            for key, value in ppo_stats.items():
                stats.add(key, value)
        self._batch_stats(batch, stats)
        return loss, batch.tokens

    def _across_ranks(self, loss: float, tokens: int, stats: Stats) -> tuple[float, int, Stats]:
        """Every rank's loss is its share's sum over the per-rank batch size: their mean is the whole batch's."""
        ranks = self.world.all_gather((loss, tokens, stats))
        merged = Stats()
        for _, _, other in ranks:
            merged.merge(other)
        return sum(r[0] for r in ranks) / len(ranks), sum(r[1] for r in ranks), merged

    def _reference_lp(self, batch: Batch) -> torch.Tensor:
        """log π0 of the batch's responses: cached in the lake, else scored by the live reference model."""
        live = None if bool(batch.ref_cached.all()) else self.reference
        return reference_log_probs(live, batch, self.config.run.score_batch_size)

    def _grpo_loss(self, policy_lp: torch.Tensor, batch: Batch, advantages: torch.Tensor, batch_tokens: int,
                   batch_sequences: int, stats: Stats) -> torch.Tensor:
        """GRPO's loss on one micro-batch (a share of the batch loss: the whole batch's tokens and sequences given)."""
        c = self.config
        if not bool(batch.has_policy.all()):
            raise ValueError("GRPO needs the sampling policy's log-probs on every sequence (online groups only)")
        out = grpo_loss(policy_lp, batch.policy_logprobs, advantages, batch.response_mask,
                        ref_logprobs=self._reference_lp(batch) if c.grpo.kl_coef else None,
                        clip_eps=c.ppo.clip_eps, kl_coef=c.grpo.kl_coef, loss_type=c.grpo.loss_type,
                        max_completion_length=c.rollout.max_new_tokens,
                        total_tokens=batch_tokens, total_sequences=batch_sequences)
        valid = int(batch.response_mask.sum())
        stats.add("clip_fraction", out.clip_fraction.item() * valid, valid)
        stats.add("importance_weight", out.importance_weight.item() * valid, valid)
        if c.grpo.kl_coef:
            stats.add("kl", out.kl.item() * valid, valid)
        stats.add("advantage_abs", advantages.abs().sum().item(), len(advantages))
        return out.loss

    def _lake_bounded_q0(self, examples: list[Example], q0: torch.Tensor) -> torch.Tensor:
        """Q̂0 raised to the lake's lower bound on V* (losses.lake_bounded_q0) where the lake holds solutions."""
        mass = torch.tensor([self.solution_log_mass.get(e.prompt_id, -math.inf) for e in examples],
                            dtype=q0.dtype, device=q0.device)
        return lake_bounded_q0(q0, mass, self.config.algorithm.beta)

    def _spo_loss(self, policy_lp: torch.Tensor, ref_lp: torch.Tensor, batch: Batch, stats: Stats) -> torch.Tensor:
        """Σ over the batch's streams of the summed per-sequence SPO losses, divided by the full batch size (so
        micro-batches add up to the mean over the batch)."""
        total = policy_lp.new_zeros(())
        for index in batch.stream.unique().tolist():
            stream = self.config.data.streams[index]
            rows = (batch.stream == index).nonzero().squeeze(-1)
            objective, loss_name = self.config.stream_objective(stream)
            mc = {"mc_positions": batch.mc_positions[rows], "mc_success": batch.mc_success[rows],
                  "mc_mask": batch.mc_mask[rows]} if stream.mc else {}
            m, online = self.config.mechanisms, stream.kind == "online"
            out = spo_loss(policy_lp[rows], ref_lp[rows], batch.response_mask[rows], batch.reward[rows],
                           batch.q0[rows], self.config.algorithm.beta, objective=objective, loss=loss_name, **mc,
                           eps=self.config.algorithm.ce_eps, advantage_scale=self.config.algorithm.advantage_scale,
                           token_weights=luffy_token_weights(policy_lp[rows]) if m.luffy_lake_tokens and not online
                           else None, negative_weight=m.negative_weight if online else 0.0,
                           log_ratio_cap=m.log_ratio_cap / self.config.algorithm.beta)
            if m.log_ratio_cap:
                stats.add("guarded", out.guarded, len(rows))
            if m.q0_lake_bound:
                stats.add("q0", batch.q0[rows].sum().item(), len(rows))
            total = total + out.per_sequence.sum() / self.config.optim.batch_size
            n = len(rows)
            stats.add(f"loss/{stream.name}", out.per_sequence.sum().item(), n)
            stats.add("q_terminal", out.q_terminal_mean.item() * n, n)
            stats.add("abs_err", out.abs_err_mean.item() * n, n)
            stats.add("advantage", out.advantage_mean.item() * n, n)
            if stream.kind == "online":  # the log-ratio estimates KL[πθ, π0] only on (near) on-policy samples
                stats.add("kl", out.kl_estimate.item() * n, n)
        return total

    def _batch_stats(self, batch: Batch, stats: Stats) -> None:
        names = [s.name for s in self.config.data.streams] + ["sft"]  # the SFT phase's rows: index len(streams)
        for index in batch.stream.unique().tolist():
            rows = batch.stream == index
            stats.add(f"reward/{names[index]}", batch.reward[rows].sum().item(), int(rows.sum()))
        stats.add("response_tokens", batch.response_mask.sum().item(), len(batch.reward))

    def _record_rollouts(self, rollouts: Rollouts) -> None:
        self._last_rollouts = {"staleness": self.step - rollouts.version, "temperature": rollouts.temperature,
                               "policy_version": rollouts.version}

    # ------------------------------------------------------------------------------------- the loop

    def evaluate(self) -> dict[str, float]:
        """pass@k on the held-out prompts (and on training prompts under `train/` when eval_train_where is set);
        the per-prompt counts behind them go to evals/step-N.json (paired comparisons between runs need them)."""
        c = self.config
        e = c.eval
        settings = EvalSettings(n=e.n, temperature=e.temperature, top_p=e.top_p, ks=tuple(e.k),
                                max_new_tokens=c.rollout.max_new_tokens, seed=c.run.seed)
        self.model.eval()
        held_out = evaluate_policy(self.policy, self.eval_problems, settings, self.sandbox, c.rollout.judge_workers)
        out, per_prompt = held_out.metrics(), {"held_out": held_out.per_problem}
        if self.train_eval_problems:
            train = evaluate_policy(self.policy, self.train_eval_problems, settings, self.sandbox,
                                    c.rollout.judge_workers)
            out.update({f"train/{k}": v for k, v in train.metrics().items()})
            per_prompt["train"] = train.per_problem
        rundir.write_json_atomic(self.run_dir / "evals" / f"step-{self.step}.json", per_prompt)
        return out

    def train(self) -> dict[str, Any]:
        """Run to optim.steps; returns the last step's metrics (plus the last evaluation). Under torchrun only rank 0
        writes (manifest, metrics, evaluations, checkpoints, lake rows): `main` guards each of those."""
        c, main = self.config, self.world.main
        snap = self.lake.get_snapshot(self.snapshot)
        info = rundir.manifest(c.to_dict(), self.run_id, self.snapshot, snap.versions)
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            rundir.write_json_atomic(self.run_dir / "manifest.json", info)
            self._runs_row("running", info, {})
        # A run resumed before its first checkpoint starts over: nothing it logged is kept.
        metrics_log = rundir.MetricsLog(self.run_dir, resume_step=(self.step or -1) if self.resuming else None) \
            if main else None
        last: dict[str, Any] = {}
        # rank 0 records how the run ended; a forced exit (Ctrl-C's watchdog) records it interrupted
        ending = open_ending(lambda status: self._runs_row(status, info, last)) if main else nullcontext(None)
        with ending as end:
            try:
                if c.eval.every and self.step == 0 and metrics_log is not None:  # π0: every curve's first point
                    metrics_log.log({"step": 0, **self.evaluate()})
                self._start_worker()
                with progress_bar("loss", "reward", "tok_s", disable=not self.show_progress) as bar:
                    task = bar.add_task(f"{c.algorithm.name} {self.run_id}", total=c.optim.steps, completed=self.step,
                                        loss="-", reward="-", tok_s="-")
                    while self.step < c.optim.steps:
                        record = {**self.train_step(), **self._last_rollouts,
                                  "lake_rows_skipped": sum(s.skipped for s in self.lake_streams.values()),
                                  "ref_cache_mismatch": sum(s.ref_recomputed for s in self.lake_streams.values())}
                        if c.eval.every and self.step % c.eval.every == 0 and main:
                            record.update(self.evaluate())
                        if metrics_log is not None:
                            metrics_log.log(record)
                        last.update(record)
                        reward = record.get(f"reward/{c.data.streams[self.online_index].name}") \
                            if self.online_index is not None else None
                        bar.update(task, completed=self.step, loss=f"{record['loss']:.4f}",
                                   reward="-" if reward is None else f"{reward:.3f}",
                                   tok_s=f"{record['tokens_per_s']:.0f}")
                        every = c.run.checkpoint_every and self.step % c.run.checkpoint_every == 0
                        if (every or self.step == c.optim.steps) and main:
                            self.save_checkpoint()
            except BaseException as exc:
                if end is not None:
                    end(ended_status(exc))
                raise
            finally:
                self.close()
                if metrics_log is not None:
                    metrics_log.close()
            if end is not None:
                end("finished")
        return last

    def _runs_row(self, status: str, info: dict[str, Any], metrics: dict[str, Any]) -> None:
        summary = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self.lake.append("runs", [runs_row(
            run_id=self.run_id, kind="train", status=status, config=info["config"], snapshot=self.snapshot,
            snapshot_versions=info["snapshot_versions"], metrics=summary,
            manifest={k: v for k, v in info.items() if k != "config"})])

    def close(self) -> None:
        if self.online is not None:
            self.online.stop()
        if self.executor is not None:
            self.executor.close()
        if self.appender is not None:
            self.appender.flush()
        self.mixer.close()
        if self.sft_mixer is not None:
            self.sft_mixer.close()
        if self.online_index is not None and self.rollout_settings.inject is not None:
            self.rollout_settings.inject.close()

    # ------------------------------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> Path:
        if self.appender is not None:
            self.appender.flush()  # everything trained on so far is in the lake before the checkpoint exists
        state = {"step": self.step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "rng": rundir.rng_state(), "data": self.mixer.state_dict()}
        if self.sft_mixer is not None:
            state["sft_data"] = self.sft_mixer.state_dict()
        tensors: dict[str, Any] = {}
        if self.value_model is not None:
            tensors["value_model"] = self.value_model.state_dict()
        if self.online_index is not None:
            # Versions that rollouts of later steps still need and that differ from the saved model.
            needed = self.rollout_settings.schedule.version(self.step)
            tensors["behaviour"] = {v: w for v, w in self.versions.state_dict().items() if needed <= v < self.step}
        return rundir.save_checkpoint(self.run_dir, self.step, self.model, self.policy.tokenizer, state, tensors,
                                      self.config.run.keep_checkpoints)

    def _load_checkpoint(self, checkpoint: Path) -> None:
        trust = self.trust_pickles
        state = rundir.load_state(checkpoint, "trainer_state", trust)
        try:
            if type(state["step"]) is not int or state["step"] < 0:
                raise ValueError("field `step`: expected a non-negative integer")
            self.step = state["step"]
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            rundir.set_rng_state(state["rng"])
            self.mixer.load_state_dict(state["data"])
            if self.sft_mixer is not None:
                self.sft_mixer.load_state_dict(state["sft_data"])
            if self.value_model is not None:
                self.value_model.load_state_dict(rundir.load_state(checkpoint, "value_model", trust))
            for version, weights in (rundir.load_state(checkpoint, "behaviour", trust) or {}).items():
                self.versions.publish(version, weights)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as exc:
            raise InputError(f"{checkpoint}: trainer state does not fit this run "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
