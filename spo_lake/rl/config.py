"""The training config: one section per component (TrainConfig), set by the flat keys of a run's TOML file
(KEYS maps each key to its section's field; docs/config.md lists them).

```toml
model = "runs/tiny"                 # policy to train (and π0 unless `reference` is set)
algorithm = "spo"                   # spo | ppo | grpo (docs/algorithms.md)
steps = 200
[[streams]]                         # what each batch is made of, by fraction
name = "online"
kind = "online"
fraction = 0.5
[[streams]]
name = "lake"
kind = "lake"
fraction = 0.5
where = "passed AND source = 'human'"
```

Every key can be overridden from the command line with `--set key=value` (TOML value syntax; a bare word is a
string), stream keys with `--set streams.<name>.<key>=value`.
"""
from __future__ import annotations

import re
import tomllib
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from spo_lake.errors import InputError
from spo_lake.rl.grpo_math import LOSS_TYPES, SCALE_REWARDS
from spo_lake.rl.losses import LOSSES, OBJECTIVES
from spo_lake.scores import EVAL_KS, EVAL_N, EVAL_TEMPERATURE, EVAL_TOP_P, PAPER_BETA, RESPONSE_TOKENS
from spo_lake.tasks import SandboxOptions

ALGORITHMS = ("spo", "ppo", "grpo")
STREAM_KINDS = ("online", "lake")


@dataclass
class StreamConfig:
    """One named source of training sequences and its share of every batch."""

    name: str
    kind: str = "lake"  # online: fresh rollouts of the behaviour policy; lake: trajectories of the pinned snapshot
    fraction: float = 0.5
    where: str = ""  # lake: SQL condition over the selection's columns (spo_lake.rl.data.SELECTION_COLUMNS)
    objective: str = ""  # SPO objective for this stream's sequences; "" = the run's
    loss: str = ""  # "" = the run's
    mc: bool = False  # lake: only trajectories with Monte-Carlo prefix estimates, regressed at those positions
    # lake, GRPO: rows of each online group's own prompt join that group (count / groups per group, fewer when the
    # prompt has fewer), scored by the group's sampling policy (docs/algorithms.md)
    inject: bool = False


def _key(name: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    """A section field whose TOML key is `name` (the key of a field without one is the field's name)."""
    return field(default=default, default_factory=factory, metadata={"key": name})


@dataclass
class ModelConfig:
    """The policy and π0."""

    path: str = _key("model", "")
    reference: str = ""  # π0 (reference model); "" = `model`
    reference_id: str = ""  # model_id of π0 in the values/logprobs tables; "" = model_identity(reference)

    @property
    def reference_path(self) -> str:
        return self.reference or self.path

    @property
    def pi0_id(self) -> str:
        from spo_lake.models.identity import model_identity

        return self.reference_id or model_identity(self.reference_path)


@dataclass
class AlgorithmConfig:
    """What is minimised: the algorithm, and SPO's objective, loss and β (spo_lake.rl.losses; β is PPO's KL weight
    too)."""

    name: str = _key("algorithm", "spo")
    objective: str = "terminal"
    loss: str = "ce"
    beta: float = PAPER_BETA
    q0_prior: float = 0.0  # Beta(a, a) pseudo-counts on π0's Monte-Carlo success rate: S0 = (s + a)/(n + 2a); 0 = s/n
    # CE loss: Q/β is clipped to ≤ −ce_eps in the forward pass (straight-through), §3.1.1. A wrong sequence whose
    # Q_T/β reaches the clip gets a gradient of ~1/ce_eps per token against a correct one's 1: at 1e-6 one such
    # sequence outweighed the batch in 2–16 of 40 steps (gradient norms ~1e6, docs/results-skill-gap.md); at 0.05
    # (success estimates capped at 0.95) its weight is ~20 and none did.
    ce_eps: float = 0.05
    advantage_scale: float = 1.0  # advantage objective: both sides warped by σ(·/(advantage_scale·β))


@dataclass
class DataConfig:
    """What the lake streams read (spo_lake.rl.data) and what each batch is made of."""

    snapshot: str = ""  # "" = pin a new snapshot named after the run
    prompts_where: str = ""  # SQL over `prompts` choosing the online rollout prompts
    max_response_tokens: int = 1024  # lake trajectories longer than this are skipped
    page_size: int = 1024  # lake rows fetched per query: memory per stream is O(page_size)
    streams: list[StreamConfig] = field(default_factory=lambda: [StreamConfig("online", "online", 1.0)])


@dataclass
class OptimConfig:
    """The optimizer, its schedule and the batch (AdamW, linear warm-up then constant)."""

    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 1e-6
    warmup_steps: int = 200
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0


@dataclass
class RolloutConfig:
    """The online stream's rollouts: sampling, judging and write-back (spo_lake.rl.rollout)."""

    model_update_interval: int = 10  # behaviour policy refreshed every this many steps (PPO, GRPO: forced to 1)
    lag: int = _key("rollout_lag", 1)  # steps a rollout's policy may trail the trainer: 0 = synchronous, 1 = overlapped
    samples_per_prompt: int = 1
    temperature_min: float = 0.1  # rollout temperature ~ U(min, max), one draw per step
    temperature_max: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = RESPONSE_TOKENS  # evaluation samples and GRPO's dr_grpo normaliser use it too
    stop: list[str] = field(default_factory=list)
    write_back: bool = True  # append online rollouts and their verdicts to the lake
    flush_rows: int = 512
    # the sandbox that judges rollouts (and evaluation samples)
    sandbox_mode: str = SandboxOptions.mode
    sandbox_timeout_s: float = SandboxOptions.timeout_s
    sandbox_memory_mb: int = SandboxOptions.memory_mb
    judge_workers: int = 2
    backend: str = _key("rollout_backend", "transformers")  # what samples the online rollouts: transformers | vllm
    # where the rollout policy samples and judges: local = a thread of the trainer process; ray = a Ray actor that is
    # sent each new policy version (spo_lake.rollouts.executors). Planning and write-back stay in the trainer process.
    executor: str = "local"
    ray_address: str = ""  # executor = "ray": the Ray cluster to join; "" = start a local instance


@dataclass
class PPOConfig:
    """The PPO baseline (paper §3.1.4): its value model and loss; `clip_eps` is GRPO's ε too."""

    value_lr: float = 1e-5
    gamma: float = 1.0
    lam: float = 0.95
    clip_eps: float = 0.2
    value_coef: float = 0.5


@dataclass
class GRPOConfig:
    """GRPO (DeepSeekMath eq. 3, TRL's defaults; its ε is ppo.clip_eps): group = the samples_per_prompt rollouts of
    one prompt, plus the rows an `inject` stream adds to it."""

    kl_coef: float = _key("grpo_kl_coef", 0.0)  # the k3 KL[πθ‖π0] term's coefficient (TRL's `beta`); 0 = no π0
    scale_rewards: str = "group"  # advantages divided by the std of the group | batch | none
    loss_type: str = "dapo"  # token losses / the batch's tokens (dapo) | per-sequence means (grpo) | dr_grpo
    sft_steps: int = 0  # the first this many steps are SFT on `sft_where` lake rows, then GRPO
    sft_where: str = ""  # SQL over the selection (as a stream's `where`): the SFT rows


@dataclass
class EvalConfig:
    """pass@k on held-out prompts during training (spo_lake.rl.evaluation)."""

    every: int = _key("eval_every", 0)  # steps; 0 = never during training
    where: str = _key("eval_where", "")  # SQL over `prompts`: held-out prompts (also evaluated at step 0: π0's own)
    train_where: str = _key("eval_train_where", "")  # SQL over `prompts`: training prompts (logged as train/pass@k)
    max_prompts: int = _key("eval_max_prompts", 100)
    n: int = _key("eval_n", EVAL_N)
    k: list[int] = _key("eval_k", factory=lambda: list(EVAL_KS))
    temperature: float = _key("eval_temperature", EVAL_TEMPERATURE)
    top_p: float = _key("eval_top_p", EVAL_TOP_P)


@dataclass
class RunConfig:
    """The run itself: its name and directory, checkpoints, seed, and where and how the models run."""

    name: str = _key("run_name", "")  # "" = a fresh id
    dir: str = _key("run_dir", "runs")
    checkpoint_every: int = 0  # steps; 0 = only at the end
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "auto"  # auto = cuda when available
    threads: int = 0  # torch intra-op threads; 0 = the cores available, halved when online rollouts share them
    dtype: str = "auto"  # auto = bfloat16 on GPU, float32 on CPU
    gradient_checkpointing: bool = False
    score_batch_size: int = 16  # sequences per forward of the live reference model


# ---------------------------------------------------------------------------------------------- mechanisms
# SPO mechanisms for prompts π0 rarely solves (issue 40 §2; docs/algorithms.md "Mechanisms"; measured by
# bench/spo_mechanisms.py). This block is owned by the mechanisms work: keys, defaults and their checks live here.


@dataclass
class MechanismConfig:
    """Options on SPO's loss and targets, each 0/false = off (spo_lake.rl.losses, "mechanisms")."""

    # Q̂0 of every prompt ≥ the lake's lower bound β·log(M + (1−M)·e^{−1/β}), M = Σ π0(y) over its distinct correct
    # rows with cached π0 log-probs (losses.lake_bounded_q0)
    q0_lake_bound: bool = False
    # online sequences with r < 0: + negative_weight·sg(min(1, πθ/π0))·log πθ/π0 (losses.negative_push, NSR/TOPR)
    negative_weight: float = 0.0
    # lake rows: each token's gradient × 4γπ/(π+γ)², γ = 0.1 (losses.luffy_token_weights, LUFFY)
    luffy_lake_tokens: bool = False
    # drop from the loss every sequence whose |Σ log πθ/π0| exceeds log_ratio_cap/β nats (losses.far_off_policy):
    # twice the most any target asks (1/β for r ∈ {0, −1}); 0 = off. On by default: bit-identical in the 5 stable
    # runs measured (it never fired), and in the seed that diverged at lr 3e-4 it cut the largest sample log-ratio
    # 56 → 13 nats, skill pass@1 +0.026 [+0.003, +0.056] (docs/algorithms.md "Mechanisms")
    log_ratio_cap: float = 2.0


def _validate_mechanisms(c: TrainConfig) -> None:
    m = c.mechanisms
    _check(m.negative_weight >= 0 and m.log_ratio_cap >= 0,
           f"config: negative_weight and log_ratio_cap must be >= 0, got {m.negative_weight}, {m.log_ratio_cap}")
    changed = [k for k, v in asdict(m).items() if v != getattr(MechanismConfig(), k)]
    _check(c.algorithm.name == "spo" or not changed,
           f"config: {', '.join(changed)} are SPO options (algorithm = \"spo\")")


# ---------------------------------------------------------------------------------------------- end mechanisms


@dataclass
class TrainConfig:
    """A run's settings, one section per component. The TOML file (and `--set`) uses flat keys: KEYS maps each to
    its section's field (docs/config.md lists them)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    mechanisms: MechanismConfig = field(default_factory=MechanismConfig)

    @classmethod
    def from_keys(cls, **keys: Any) -> TrainConfig:
        """A config from flat keys, unchecked (validate checks it): TrainConfig.from_keys(model="m", steps=10)."""
        unknown = sorted(set(keys) - set(KEYS))
        _check(not unknown, f"config: unknown key(s) {unknown}; known: {', '.join(KEYS)}")
        sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for key, value in keys.items():
            section, name = KEYS[key]
            sections[section][name] = value
        return cls(**{name: SECTIONS[name](**values) for name, values in sections.items()})

    def get(self, key: str) -> Any:
        """The value of a flat key."""
        section, name = KEYS[key]
        return getattr(getattr(self, section), name)

    @property
    def behaviour_interval(self) -> int:
        return 1 if self.algorithm.name in ("ppo", "grpo") else self.rollout.model_update_interval

    def stream_objective(self, stream: StreamConfig) -> tuple[str, str]:
        return stream.objective or self.algorithm.objective, stream.loss or self.algorithm.loss

    def to_dict(self) -> dict[str, Any]:
        """The flat keys and their values (what a run's manifest records and config_from_dict reads)."""
        nested = asdict(self)
        return {key: nested[section][name] for key, (section, name) in KEYS.items()}


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(TrainConfig)}  # type: ignore[misc]
# flat TOML key → (section, field), in the sections' order
KEYS: dict[str, tuple[str, str]] = {f.metadata.get("key", f.name): (section, f.name)
                                    for section, cls in SECTIONS.items() for f in fields(cls)}
_HINTS = {key: typing.get_type_hints(SECTIONS[section])[name] for key, (section, name) in KEYS.items()}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InputError(message)


def _leaves(value: Any, key: str = "") -> typing.Iterator[tuple[str, Any]]:
    """(dotted key, value) of every number, string or flag in a nested config dict."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{key}.{k}" if key else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, value


def validate(c: TrainConfig) -> TrainConfig:
    """Raise ValueError with one line naming the bad key; returns c."""
    a, r, o, e = c.algorithm, c.rollout, c.optim, c.eval
    _check(bool(c.model.path), "config: `model` is required (a model directory or hub name)")
    for key, value in _leaves(c.to_dict()):  # torch, numpy and Arrow take 64-bit numbers: fail here, not there
        _check(type(value) is not int or -2**63 <= value < 2**63, f"config: {key} = {value} is out of range")
        _check(type(value) is not float or value == value and abs(value) != float("inf"),
               f"config: {key} must be a finite number, got {value}")
    _check(a.name in ALGORITHMS, f"config: algorithm {a.name!r} not in {ALGORITHMS}")
    _check(a.beta > 0, f"config: beta must be > 0, got {a.beta}")
    _check(a.ce_eps > 0 and a.advantage_scale > 0,
           f"config: ce_eps and advantage_scale must be > 0, got {a.ce_eps}, {a.advantage_scale}")
    for key in ("steps", "batch_size", "grad_accum", "model_update_interval", "samples_per_prompt", "max_new_tokens",
                "max_response_tokens", "page_size", "eval_n", "judge_workers", "flush_rows", "score_batch_size",
                "sandbox_memory_mb"):
        _check(c.get(key) >= 1, f"config: {key} must be >= 1, got {c.get(key)}")
    for key in ("warmup_steps", "eval_every", "checkpoint_every", "rollout_lag", "lr", "value_lr", "weight_decay",
                "q0_prior", "threads"):
        _check(c.get(key) >= 0, f"config: {key} must be >= 0, got {c.get(key)}")
    _check(c.get("sandbox_timeout_s") > 0, f"config: sandbox_timeout_s must be > 0, got {c.get('sandbox_timeout_s')}")
    _check(o.batch_size % o.grad_accum == 0,
           f"config: batch_size {o.batch_size} is not divisible by grad_accum {o.grad_accum}")
    _check(0 <= r.temperature_min <= r.temperature_max,
           f"config: need 0 <= temperature_min <= temperature_max, got {r.temperature_min}, {r.temperature_max}")
    _check(0 < r.top_p <= 1 and 0 < e.top_p <= 1, "config: top_p and eval_top_p must lie in (0, 1]")
    _check(all(1 <= k <= e.n for k in e.k), f"config: every eval_k must lie in 1..eval_n={e.n}")
    _check(c.run.dtype in ("auto", "float32", "bfloat16", "float16"), f"config: dtype {c.run.dtype!r} unknown")
    _check(r.backend in ("transformers", "vllm"),
           f"config: rollout_backend {r.backend!r} not in ('transformers', 'vllm')")
    _check(r.executor in ("local", "ray"), f"config: executor {r.executor!r} not in ('local', 'ray')")
    _check(not r.ray_address or r.executor == "ray", "config: ray_address needs executor = \"ray\"")
    _check(c.run.keep_checkpoints >= 1, "config: keep_checkpoints must be >= 1")
    streams = c.data.streams
    _check(bool(streams), "config: at least one [[streams]] entry is needed")
    names = [s.name for s in streams]
    _check(len(set(names)) == len(names), f"config: stream names must be unique, got {names}")
    _check(sum(s.kind == "online" for s in streams) <= 1, "config: at most one online stream")
    _check(abs(sum(s.fraction for s in streams) - 1.0) < 1e-6,
           f"config: stream fractions must sum to 1, got {sum(s.fraction for s in streams):g}")
    for s in streams:
        where = f"config: stream {s.name!r}"
        _check(s.kind in STREAM_KINDS, f"{where}: kind {s.kind!r} not in {STREAM_KINDS}")
        _check(s.fraction > 0, f"{where}: fraction must be > 0")
        _check(not (s.kind == "online" and (s.where or s.mc or s.inject)),
               f"{where}: `where`, `mc` and `inject` apply to lake streams only")
        _check(not (s.inject and s.mc), f"{where}: an `inject` stream has no Monte-Carlo targets (`mc`)")
        objective, loss = c.stream_objective(s)
        _check(objective in OBJECTIVES, f"{where}: objective {objective!r} not in {OBJECTIVES}")
        _check(loss in LOSSES, f"{where}: loss {loss!r} not in {LOSSES}")
        _check(not (objective == "advantage" and loss != "ce"), f"{where}: objective 'advantage' needs loss 'ce'")
    if a.name == "ppo":
        _check(all(s.kind == "online" for s in streams),
               "config: PPO trains on online rollouts only (one online stream)")
    online = sum(count for s, count in zip(streams, stream_counts(c)) if s.kind == "online")
    _check(online % r.samples_per_prompt == 0,
           f"config: the online share of a batch ({online}) is not divisible by "
           f"samples_per_prompt {r.samples_per_prompt}")
    _validate_grpo(c, online)
    _validate_mechanisms(c)
    return c


def _validate_grpo(c: TrainConfig, online: int) -> None:
    grpo, g, streams = c.algorithm.name == "grpo", c.grpo, c.data.streams
    injected = [s for s in streams if s.inject]
    _check(grpo or not injected, "config: `inject` streams are for algorithm = \"grpo\"")
    _check(grpo or not (g.sft_steps or g.sft_where), "config: sft_steps and sft_where are for algorithm = \"grpo\"")
    _check(grpo or not g.kl_coef, "config: grpo_kl_coef is for algorithm = \"grpo\" (PPO's KL weight is `beta`)")
    _check(g.scale_rewards in SCALE_REWARDS, f"config: scale_rewards {g.scale_rewards!r} not in {SCALE_REWARDS}")
    _check(g.loss_type in LOSS_TYPES, f"config: loss_type {g.loss_type!r} not in {LOSS_TYPES}")
    _check(g.kl_coef >= 0, f"config: grpo_kl_coef must be >= 0, got {g.kl_coef}")
    steps = c.optim.steps
    _check(0 <= g.sft_steps < steps, f"config: sft_steps must lie in 0..steps-1={steps - 1}, got {g.sft_steps}")
    _check(bool(g.sft_where) == bool(g.sft_steps), "config: sft_steps > 0 and sft_where go together")
    if not grpo:
        return
    _check(all(s.kind == "online" or s.inject for s in streams),
           "config: GRPO trains on online groups (one online stream) and the lake rows an `inject` stream adds to them")
    _check(online > 0, "config: GRPO needs an online stream")
    _check(len(injected) <= 1, "config: at most one `inject` stream")
    samples = c.rollout.samples_per_prompt
    groups = online // samples
    per_group = sum(count for s, count in zip(streams, stream_counts(c)) if s.inject) / groups
    _check(per_group == int(per_group), f"config: an `inject` stream's share of a batch must be a multiple of the "
                                        f"{groups} groups (prompts) per batch")
    _check(samples + per_group >= 2,
           "config: a GRPO group needs >= 2 sequences (samples_per_prompt, plus injected rows)")


def inject_per_group(c: TrainConfig) -> int:
    """Lake rows an `inject` stream adds to each online group (0 without one)."""
    counts, streams = stream_counts(c), c.data.streams
    online = sum(n for s, n in zip(streams, counts) if s.kind == "online")
    return sum(n for s, n in zip(streams, counts) if s.inject) // (online // c.rollout.samples_per_prompt) \
        if online else 0


def stream_counts(c: TrainConfig) -> list[int]:
    """Sequences per batch for each stream: fraction × batch_size by largest remainder, fixed for every batch."""
    batch_size = c.optim.batch_size
    exact = [s.fraction * batch_size for s in c.data.streams]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: batch_size - sum(counts)]:
        counts[i] += 1
    if any(n == 0 for n in counts):
        raise InputError(f"config: batch_size {batch_size} leaves a stream with no sequence (counts {counts})")
    return counts


# ---------------------------------------------------------------------------------------------- loading


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check (and widen int → float) a TOML value against a field's type annotation."""
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    origin = typing.get_origin(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation)
        _check(isinstance(value, list), f"{key} must be a list")
        if item is StreamConfig:
            return [_stream(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    ok = isinstance(value, annotation) and not (annotation is int and isinstance(value, bool))
    _check(ok, f"{key} must be {annotation.__name__}, got {value!r}")
    return value


def _from_mapping(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    _check(not unknown, f"{where}: unknown key(s) {unknown}; known: {', '.join(known)}")
    missing = [n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING and n not in data]
    _check(not missing, f"{where}: missing key(s) {missing}")
    return cls(**{k: _coerce(v, hints[k], f"{where}: {k}") for k, v in data.items()})


def _parse(data: dict[str, Any]) -> TrainConfig:
    """A config from a TOML mapping of flat keys, each checked against its field's type."""
    TrainConfig.from_keys(**dict.fromkeys(data))  # unknown keys first, before any value's type
    return TrainConfig.from_keys(**{k: _coerce(v, _HINTS[k], f"config: {k}") for k, v in data.items()})


def _stream(data: Any, where: str) -> StreamConfig:
    _check(isinstance(data, dict), f"{where} must be a table")
    return _from_mapping(StreamConfig, data, where)


def parse_value(text: str) -> Any:
    """A `--set` value in TOML syntax (`3`, `0.5`, `true`, `"x"`, `[1, 10]`); anything else is a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key=value` and `streams.<name>.<key>=value` assignments to a raw config mapping."""
    streams = data.get("streams", [])
    _check(isinstance(streams, list) and all(isinstance(s, dict) for s in streams),
           "config: streams must be [[streams]] tables, each naming its stream (name = \"online\"), not "
           + ("a table" if isinstance(streams, dict) else repr(streams)))
    data = {**data, "streams": [dict(s) for s in streams]}
    for item in overrides:
        _check("=" in item, f"--set expects key=value, got {item!r}")
        key, text = (part.strip() for part in item.split("=", 1))
        value = parse_value(text)
        if key.startswith("streams."):
            parts = key.split(".")
            _check(len(parts) == 3, f"--set {key}: stream keys look like streams.<name>.<key>")
            matches = [s for s in data["streams"] if s.get("name") == parts[1]]
            if not matches:  # a new stream, e.g. --set streams.lake.kind=lake
                matches = [{"name": parts[1]}]
                data["streams"].append(matches[0])
            matches[0][parts[2]] = value
        else:
            data[key] = value
    if not data["streams"]:
        del data["streams"]
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a TOML config (or start from defaults), apply overrides, type-check and validate."""
    data: dict[str, Any] = {}
    text = ""
    if path is not None:
        try:
            text = Path(path).read_text()
            data = tomllib.loads(text)
        except FileNotFoundError:
            raise InputError(f"config file {path} not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{path}: invalid TOML: {exc}") from None
    try:
        return validate(_parse(apply_overrides(data, overrides or [])))
    except ValueError as exc:
        raise InputError(located_error(path, text, str(exc))) from None


def located_error(path: str | Path | None, text: str, message: str) -> str:
    """A config error as `file:line N: ...`, the line being where the key it names is set (when the file sets it)."""
    if path is None:
        return message
    named = re.match(r"config[^:]*: (?:unknown key\(s\) \['([^']+)'|`?(\w+)`?)", message)
    key = named and (named[1] or named[2])
    lines = text.splitlines()
    row = next((i for i, line in enumerate(lines) if key and re.match(rf"\s*\[*\s*{re.escape(key)}\b", line)), None)
    return f"{path}{f':line {row + 1}' if row is not None else ''}: {message}"


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """The inverse of TrainConfig.to_dict (used to resume a run from its manifest)."""
    return validate(_parse(data))
