"""What a training step holds in memory, by tensor: the RSS of a process does not resolve it (the Python runtime and
the libraries dominate it at small sizes), so the trainer counts the tensors themselves once per run."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch


def tensor_mb(tensors: Iterable[object], exclude: frozenset[int] = frozenset()) -> float:
    """MiB of the distinct storages among `tensors` (views share theirs), other than those at `exclude` addresses."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in exclude:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values()) / 2**20


@contextmanager
def saved_for_backward() -> Iterator[list[torch.Tensor]]:
    """The tensors autograd saves for the backward pass of what runs inside (the activations), in a list."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def training_state(parameters: Sequence[torch.Tensor], reference: Sequence[torch.Tensor],
                   optimizer: torch.optim.Optimizer, activations: Sequence[torch.Tensor]) -> dict[str, float]:
    """MiB per kind: the parameters being trained (a PPO value model's included), a live π0, their gradients, the
    optimizer's states, the activations of one micro-batch (weights saved for backward are not new memory)."""
    weights = frozenset(p.untyped_storage().data_ptr() for p in [*parameters, *reference])
    state = {"params_mb": tensor_mb(parameters), "reference_mb": tensor_mb(reference),
             "grads_mb": tensor_mb(p.grad for p in parameters if p.grad is not None),
             "optimizer_mb": tensor_mb(v for s in optimizer.state.values() for v in s.values()),
             "activations_mb": tensor_mb(activations, weights)}
    return {**state, "total_mb": sum(state.values())}
