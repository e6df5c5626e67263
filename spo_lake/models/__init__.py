"""Policy backends (transformers; vLLM when present), scoring, and the built-in tiny model.

Import the submodules directly (`spo_lake.models.backend`, `.tiny`, `.vllm_backend`); this package stays
import-light so `spolake --help` does not load torch.
"""
from __future__ import annotations

from spo_lake.errors import InputError


def load_policy(path_or_name: str, backend: str = "auto", device: str | None = None, dtype: str | None = None,
                model_id: str | None = None):
    """A PolicyBackend for a local model directory or hub name.

    backend: "transformers", "vllm", "scripted", or "auto" (a scripted model directory is scripted, whatever the
    backend; else vLLM when it is importable and a GPU is present; spo_lake.models.scripted).
    device: for transformers, default "cuda" when available else "cpu".
    dtype: default float32 for transformers (exact scoring) and vLLM's own choice ("auto") for vLLM.
    model_id: what the lake records for it (default: `spo_lake.models.identity.model_identity`)."""
    from spo_lake.models.scripted import ScriptedPolicy, is_scripted
    from spo_lake.models.vllm_backend import VLLMPolicy, vllm_available

    if backend not in ("auto", "transformers", "vllm", "scripted"):
        raise InputError(f"unknown backend {backend!r}; use 'auto', 'transformers', 'vllm' or 'scripted'")
    if backend == "scripted" or is_scripted(path_or_name):
        return ScriptedPolicy.from_pretrained(path_or_name, model_id=model_id)
    if backend == "vllm" or (backend == "auto" and vllm_available()):
        return VLLMPolicy.from_pretrained(path_or_name, dtype=dtype or "auto", model_id=model_id)
    import torch

    from spo_lake.models.backend import TransformersPolicy

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return TransformersPolicy.from_pretrained(path_or_name, device=device, dtype=dtype or "float32",
                                              model_id=model_id)
