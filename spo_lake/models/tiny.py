"""The built-in tiny policy: a ~1 M-parameter LlamaForCausalLM SFT-trained on countdown on one CPU core (~2-3 min).

It exists so a first run needs no hub download and no GPU, and it is meant to be a *useful* π0 for RL:
diverse and imperfect. It learns from solver solutions mixed with near-misses (off-by-a-bit targets, a number
used twice, random expressions), and, like a model fine-tuned on chatty data, it often signs off with a line
after its answer ("Hope this helps!"), which the verifier (the answer is the last line) always rejects. That
habit is what RL can fix in minutes on a CPU and what carries over to unseen problems; the arithmetic itself
improves far more slowly (docs/results-sign-off-demo.md).

Two styles: "direct" answers with the expression only; "cot" first writes one reasoning line with the
intermediate results ("12+4=16, 16*2=32") and puts the expression on the last line, which is where the
countdown verifier looks.

Everything is real transformers: the tokenizer is a `tokenizers` BPE wrapped in PreTrainedTokenizerFast, the
model a LlamaForCausalLM, both saved with save_pretrained and loadable with the Auto* classes.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from spo_lake.errors import InputError
from spo_lake.models.tiny_data import training_pairs

if TYPE_CHECKING:  # the Llama classes are imported where a model is made: the scripted model needs only the tokenizer
    from transformers import LlamaForCausalLM

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# Numbers in chunks of up to 3 digits (as Llama 3 / GPT-4 do); BPE merges the text between them freely, so the
# fixed instruction text of a prompt shrinks to a few tokens.
PRE_TOKENIZE = r"\d{1,3}|\D+"
TRAIN_SEED_OFFSET = 1_000_003  # training problems never use the seeds users pass to `prompts add`


@dataclass(frozen=True)
class TinyConfig:
    """Everything that determines the built model; its hash names the build."""

    seed: int = 0
    style: str = "direct"  # "direct" or "cot"
    steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    n_problems: int = 4000
    answers_per_problem: int = 4
    near_miss_fraction: float = 0.1
    sign_off_fraction: float = 0.5  # answers followed by a sign-off line: a habit that fails verification
    product_fraction: float = 1.0  # < 1: a skill left out (problems that need * or / are this rare; tiny_data)
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    max_position_embeddings: int = 1024

    def __post_init__(self) -> None:
        if self.style not in ("direct", "cot"):
            raise InputError(f"unknown tiny-model style {self.style!r}; use 'direct' or 'cot'")
        counts = ("steps", "batch_size", "n_problems", "answers_per_problem", "hidden_size", "intermediate_size",
                  "num_layers", "num_heads", "max_position_embeddings")
        for name in counts:
            if getattr(self, name) < 1:
                raise InputError(f"tiny model: {name} must be at least 1, got {getattr(self, name)}")
        for name in ("near_miss_fraction", "sign_off_fraction", "product_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise InputError(f"tiny model: {name} must lie in [0, 1], got {getattr(self, name)}")
        if self.warmup_steps < 0 or not self.lr > 0 or self.weight_decay < 0:
            raise InputError(f"tiny model: need warmup_steps >= 0, lr > 0, weight_decay >= 0; got "
                             f"{self.warmup_steps}, {self.lr}, {self.weight_decay}")

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def build_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """A BPE over the corpus whose vocabulary also holds every 1-3 digit number, so each number in a
    problem is a single token (easier arithmetic for a tiny model)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(PRE_TOKENIZE), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    printable = [chr(c) for c in range(32, 127)] + ["\n"]
    numbers = [str(i) for i in range(1000)]
    trainer = trainers.BpeTrainer(
        vocab_size=100_000, special_tokens=SPECIAL_TOKENS, initial_alphabet=printable, show_progress=False
    )
    tokenizer.train_from_iterator(corpus + numbers, trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def encode_pairs(
    tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str]]
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with BOS, response ids with EOS) per (prompt, response) text pair."""
    prompts = tokenizer([p for p, _ in pairs]).input_ids
    responses = tokenizer([r for _, r in pairs], add_special_tokens=False).input_ids
    return [(p, r + [tokenizer.eos_token_id]) for p, r in zip(prompts, responses)]


def collate(
    examples: list[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels), each [B, L]; labels are -100 outside responses."""
    length = max(len(p) + len(r) for p, r in examples)
    input_ids = torch.full((len(examples), length), pad_id)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    labels = torch.full((len(examples), length), -100)
    for row, (p, r) in enumerate(examples):
        n = len(p) + len(r)
        input_ids[row, :n] = torch.tensor(p + r)
        attention_mask[row, :n] = 1
        labels[row, len(p) : n] = torch.tensor(r)
    return input_ids, attention_mask, labels


def make_model(config: TinyConfig, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(config.seed)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(model_config)


def learning_rate(step: int, config: TinyConfig) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(progress * math.pi)))


def train(
    model: LlamaForCausalLM, examples: list[tuple[list[int], list[int]]], config: TinyConfig, pad_id: int
) -> list[float]:
    """SFT on response tokens; deterministic for config.seed (fixed data order and init). Returns the losses."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98)
    )
    order_rng = random.Random(config.seed)
    order: list[int] = []
    losses: list[float] = []
    model.train()
    columns = (
        TextColumn("tiny model"), BarColumn(), TextColumn("{task.completed}/{task.total} loss {task.fields[loss]}"),
        TimeElapsedColumn(), TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task("train", total=config.steps, loss="-")
        for step in range(config.steps):
            if len(order) < config.batch_size:  # a fresh shuffled epoch, appended so batches never straddle it oddly
                epoch = list(range(len(examples)))
                order_rng.shuffle(epoch)
                order += epoch
            batch, order = order[: config.batch_size], order[config.batch_size :]
            input_ids, attention_mask, labels = collate([examples[i] for i in batch], pad_id)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, config)
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            progress.update(bar, advance=1, loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
    model.eval()
    return losses


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with n intra-op threads. One is the default for the tiny model: its matrices are too small for
    threads to pay off, they stall badly on a busy machine, and a fixed count keeps builds bit-reproducible."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def is_built(out_dir: str | Path) -> bool:
    """Whether `out_dir` holds a finished build: tiny_config.json is written last."""
    return (Path(out_dir) / "tiny_config.json").exists()


def build_tiny_model(
    out_dir: str | Path, seed: int = 0, steps: int | None = None, style: str = "direct", threads: int = 1, **overrides
) -> Path:
    """Build, train and save the tiny model (model + tokenizer + tiny_config.json) into out_dir.

    `overrides` are other TinyConfig fields. Deterministic for a config and thread count on one machine.
    tiny_config.json is written last, so its presence marks a finished build."""
    unknown = sorted(set(overrides) - {f.name for f in fields(TinyConfig)})
    if unknown:
        known = ", ".join(f.name for f in fields(TinyConfig))
        raise InputError(f"unknown tiny-model setting(s) {', '.join(unknown)}; known: {known}")
    config = TinyConfig(seed=seed, style=style, **overrides)
    if steps is not None:
        config = replace(config, steps=steps)
    if Path(out_dir).is_file():  # found now, not after minutes of training
        raise InputError(f"{out_dir}: a file is there; a model is a directory")
    started = time.perf_counter()
    console = Console(stderr=True)
    with torch_threads(threads):
        with console.status("tiny model: generating countdown training data"):
            pairs = training_pairs(
                config.n_problems, TRAIN_SEED_OFFSET + config.seed, config.style, config.near_miss_fraction,
                config.answers_per_problem, config.sign_off_fraction, config.product_fraction,
            )
            tokenizer = build_tokenizer([text for pair in pairs for text in pair])
        model = make_model(config, tokenizer)
        losses = train(model, encode_pairs(tokenizer, pairs), config, tokenizer.pad_token_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tiny_config.json").unlink(missing_ok=True)  # an earlier build's marker must not vouch for this one
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary = {
        "config": asdict(config),
        "config_hash": config.hash(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (out / "tiny_config.json").write_text(json.dumps(summary, indent=2))
    return out
