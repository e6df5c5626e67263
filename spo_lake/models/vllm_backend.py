"""The PolicyBackend interface on vLLM, for GPU machines where `vllm` is installed.

Thin on purpose: vLLM does the batching, the KV cache and the sampling; this class only maps our
interface onto `vllm.LLM`. It cannot run on the CPU-only machines this project is developed and tested
on, so it is untested here (the tests cover only `vllm_available()` and the clear error); `TransformersPolicy` is the reference implementation and the two must agree
(sampled-from log-probs after temperature/top-p; token_ids include EOS or the stop-completing token).

Notes on the mapping:
- `logprobs_mode="processed_logprobs"` makes vLLM report the log-probs of the distribution it sampled
  from (after temperature and top-p), as our interface requires; vLLM's default reports raw ones.
- `score` uses `prompt_logprobs=0` on prompt+response: vLLM returns the log-prob of every prompt token.
"""
from __future__ import annotations

from typing import Sequence

from spo_lake.models.backend import SampleResult, encode_prompt, tokenize_response


def vllm_available() -> bool:
    """True when vllm imports and a CUDA GPU is present."""
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


class VLLMPolicy:
    def __init__(self, llm, model_id: str):
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.model_id = model_id
        self.precision = ("vllm", str(llm.llm_engine.model_config.dtype).removeprefix("torch."))

    @classmethod
    def from_pretrained(
        cls, path_or_name: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85, seed: int = 0,
        model_id: str | None = None,
    ) -> "VLLMPolicy":
        if not vllm_available():
            raise RuntimeError("the vLLM backend needs `pip install vllm` and a CUDA GPU; use the transformers backend")
        from vllm import LLM

        from spo_lake.models.identity import model_identity, resolve_model

        llm = LLM(
            model=resolve_model(path_or_name), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, seed=seed,
            logprobs_mode="processed_logprobs",
        )
        return cls(llm, model_id=model_id or model_identity(path_or_name))

    def encode_prompt(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def tokenize_response(self, prompt: str, response: str, add_eos: bool = True) -> tuple[list[int], list[int]]:
        return tokenize_response(self.tokenizer, prompt, response, add_eos)

    def sample(
        self,
        prompts: Sequence[str],
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        seed: int = 0,
    ) -> list[SampleResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop=list(stop or []) or None,
            include_stop_str_in_output=True, seed=seed, logprobs=0,
        )
        requests = [TokensPrompt(prompt_token_ids=self.encode_prompt(p)) for p in prompts]
        results = []
        for index, output in enumerate(self.llm.generate(requests, params, use_tqdm=False)):
            for completion in output.outputs:
                token_ids = list(completion.token_ids)
                logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids)]
                results.append(
                    SampleResult(
                        prompt_index=index,
                        token_ids=token_ids,
                        logprobs=logprobs,
                        finish_reason="length" if completion.finish_reason == "length" else "stop",
                        text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                        # processed log-probs are the model's own only without temperature and top-p
                        policy_logprobs=logprobs if temperature == 1.0 and top_p == 1.0 else None,
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
