"""π0's pass@1 / pass@10 of SmolLM2-135M-Instruct on the pyfunc task, with the sampling done on a lent GPU.

`spolake eval` does the same on CPU, but 40 problems × 10 samples did not finish in 65 minutes on the busy 2-core
machine. This splits it at the one place that needs the accelerator:

    prep    (here)    the prompts exactly as `spolake eval` feeds them to the sampler: `render_prompt`, chunks of
                      EvalSettings.batch_prompts, one `derive_seed(seed, "eval", first prompt_id)` per chunk
    sample  (GPU)     the GGUF model de-quantized as `spolake model import` does it, sampled by the project's own
                      `TransformersPolicy.sample` (no lake needed: the GPU machine has torch and transformers only)
    judge   (here)    every response judged in the sandbox by `judge_many` (the task's verifier), pass@k by
                      `mean_pass_at_k`: the same functions `spolake eval` uses

    .venv/bin/python bench/real_model_pi0.py prep --lake LAKE --out prompts.json      # after `prompts add --dataset pyfunc`
    python3 bench/real_model_pi0.py sample --gguf FILE --prompts prompts.json --out samples.json   # on the GPU
    .venv/bin/python bench/real_model_pi0.py judge --lake LAKE --samples samples.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's spo_lake, without installing it
from dry_run import parse_args, random_model, scratch  # noqa: E402

SETTINGS = {  # name: (problems, samples per problem, max new tokens); temperature 0.4, top-p 0.95 (paper §5)
    "doc40": (40, 10, 96),  # the command docs/real-model.md gives
    "p100": (100, 20, 256),  # the paper's n = 20, room for a whole function
}


def prep(args) -> None:
    from spo_lake.lake import Lake
    from spo_lake.lake.rows import derive_seed
    from spo_lake.models.tokens import render_prompt
    from spo_lake.rl.evaluation import EvalSettings, select_problems

    lake, out = Lake(args.lake), {}
    for name, (problems_n, n, max_new) in args.settings.items():
        s = EvalSettings(n=n, temperature=0.4, top_p=0.95, ks=tuple(k for k in (1, 10) if k <= n), max_new_tokens=max_new,
                         seed=args.seed)
        problems = select_problems(lake, "p.task = 'pyfunc'", None, problems_n)
        chunks = [{"prompt_ids": [p.prompt_id for p in chunk], "texts": [render_prompt(p) for p in chunk],
                   "seed": derive_seed(s.seed, "eval", chunk[0].prompt_id)}
                  for chunk in (problems[i:i + s.batch_prompts] for i in range(0, len(problems), s.batch_prompts))]
        out[name] = {"n": n, "temperature": s.temperature, "top_p": s.top_p, "max_new_tokens": max_new,
                     "chunks": chunks}
    Path(args.out).write_text(json.dumps(out))
    print({name: sum(len(c["texts"]) for c in v["chunks"]) for name, v in out.items()})


def sample(args) -> None:
    import torch

    from spo_lake.models.backend import TransformersPolicy
    from spo_lake.models.importing import _load_gguf

    started = time.perf_counter()
    if args.gguf:
        model, tokenizer = _load_gguf(Path(args.gguf))
        policy = TransformersPolicy(model.to(args.device), tokenizer, model_id="smollm2-135m-instruct-q4_1")
    else:
        policy = TransformersPolicy.from_pretrained(args.model, args.device)
    loaded = time.perf_counter() - started
    runs = json.loads(Path(args.prompts).read_text())
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
           "torch": torch.__version__, "load_s": loaded, "runs": {}}
    for name, run in runs.items():
        t0, samples = time.perf_counter(), []
        for chunk in run["chunks"]:
            results = policy.sample(chunk["texts"], n=run["n"], temperature=run["temperature"], top_p=run["top_p"],
                                    max_new_tokens=run["max_new_tokens"], seed=chunk["seed"])
            samples += [{"prompt_id": chunk["prompt_ids"][r.prompt_index], "text": r.text,
                         "tokens": len(r.token_ids), "finish": r.finish_reason} for r in results]
        seconds = time.perf_counter() - t0
        tokens = sum(s["tokens"] for s in samples)
        out["runs"][name] = {**{k: run[k] for k in ("n", "temperature", "top_p", "max_new_tokens")},
                             "seconds": seconds, "tokens": tokens, "samples": samples}
        print(f"{name}: {len(samples)} samples, {tokens} tokens in {seconds:.1f} s ({tokens / seconds:.0f} tok/s)")
    Path(args.out).write_text(json.dumps(out))


def judge(args) -> None:
    from collections import Counter

    from spo_lake.lake import Lake
    from spo_lake.rl.evaluation import select_problems
    from spo_lake.scores import mean_pass_at_k
    from spo_lake.tasks import SandboxOptions
    from spo_lake.tasks.judge import judge_many

    data = json.loads(Path(args.samples).read_text())
    problems = {p.prompt_id: p for p in select_problems(Lake(args.lake), "p.task = 'pyfunc'")}
    report = {"device": data["device"], "runs": {}}
    for name, run in data["runs"].items():
        samples = run["samples"]
        verdicts = judge_many([(problems[s["prompt_id"]], s["text"]) for s in samples], SandboxOptions())
        correct: dict[str, int] = {}
        per_family: dict[str, list[int]] = {}
        for s, v in zip(samples, verdicts):
            correct[s["prompt_id"]] = correct.get(s["prompt_id"], 0) + v.passed
        for pid, c in correct.items():
            family = problems[pid].metadata.get("family", "?") if problems[pid].metadata else "?"
            per_family.setdefault(family, []).append(c)
        ns, cs = [run["n"]] * len(correct), list(correct.values())
        report["runs"][name] = {
            "problems": len(correct), "n": run["n"], "max_new_tokens": run["max_new_tokens"],
            **{f"pass@{k}": mean_pass_at_k(ns, cs, k) for k in (1, 10) if k <= run["n"]},
            "problems_with_a_pass": sum(c > 0 for c in cs),
            "verdicts": dict(Counter(v.verdict for v in verdicts)),
            "finish": dict(Counter(s["finish"] for s in samples)),
            "mean_tokens": run["tokens"] / len(samples), "sample_seconds": run["seconds"],
            "per_family_pass@1": {f: sum(c) / (run["n"] * len(c)) for f, c in sorted(per_family.items())},
        }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb")
    p = verbs.add_parser("prep")
    p.add_argument("--lake", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    s = verbs.add_parser("sample")
    source = s.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf")
    source.add_argument("--model", help="a transformers model directory instead of a GGUF file")
    s.add_argument("--prompts", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--device", default="cuda")
    j = verbs.add_parser("judge")
    j.add_argument("--lake", required=True)
    j.add_argument("--samples", required=True)
    j.add_argument("--out")
    parser.set_defaults(settings=SETTINGS)
    args = parse_args(parser, settings={"dry": (2, 2, 8)})
    if args.dry_run:
        return dry_run(args)
    if args.verb is None:
        parser.error("give a verb: prep, sample or judge")
    {"prep": prep, "sample": sample, "judge": judge}[args.verb](args)


def dry_run(args: argparse.Namespace) -> None:
    """prep, sample and judge in turn on 2 pyfunc problems, sampled on CPU from a random-weight model."""
    from spo_lake.ingest.datasets import ingest_dataset
    from spo_lake.lake import Lake

    root = scratch("real-model-pi0-")
    lake = Lake.init(root / "lake")
    ingest_dataset(lake, "pyfunc", None, n=2, seed=0)
    texts = lake.sql("SELECT prompt FROM prompts").column("prompt").to_pylist()
    model = random_model(root / "model", texts)
    prep(argparse.Namespace(**vars(args), lake=str(root / "lake"), out=str(root / "prompts.json"), seed=0))
    sample(argparse.Namespace(gguf=None, model=model, prompts=str(root / "prompts.json"),
                              out=str(root / "samples.json"), device="cpu"))
    judge(argparse.Namespace(lake=str(root / "lake"), samples=str(root / "samples.json"), out=None))


if __name__ == "__main__":
    main()
