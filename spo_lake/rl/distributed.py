"""Multi-process training under `torchrun --nproc_per_node N` (torch.distributed: gloo on CPU, NCCL on GPU).

Every rank runs the whole trainer on its share of each batch: `batch_size` is per rank, so N ranks train on batches
of N × batch_size, and their gradients are averaged (one all-reduce per step) before every rank takes the same
optimizer step. Rank 0 is the only one that writes: lake rows (the other ranks' rollouts are gathered to it),
checkpoints, metrics and evaluations. One process (no torchrun) is the world of size 1, and nothing here changes it.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the training processes, and the few collectives the trainer uses."""

    rank: int = 0
    size: int = 1
    local_size: int = 1  # ranks on this machine (they share its cores)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def broadcast(self, value: T) -> T:
        """Rank 0's value, on every rank."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: T) -> list[T] | None:
        """Every rank's value, in rank order, on rank 0 (None elsewhere)."""
        if self.size == 1:
            return [value]
        out: list[Any] | None = [None] * self.size if self.main else None  # gather_object fills it
        dist.gather_object(value, out, dst=0)
        return out

    def all_gather(self, value: T) -> list[T]:
        if self.size == 1:
            return [value]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value)
        return out

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over the ranks: one all-reduce of all of them, flattened. Explicit
        rather than a DistributedDataParallel wrapper: the trainer keeps calling its own modules (policy, value model,
        the rollout worker's copy), and micro-batch accumulation needs no `no_sync`."""
        if self.size == 1:
            return
        params = list(parameters)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.size
        offset = 0
        for p, g in zip(params, grads):
            p.grad = flat[offset : offset + g.numel()].view_as(g).clone()
            offset += g.numel()

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def current_world() -> World:
    """The world this process trains in: the initialised process group's, else a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


@contextmanager
def process_group() -> Iterator[World]:
    """Join the torchrun job this process was started by (RANK/WORLD_SIZE/LOCAL_RANK in the environment) for the
    block; without torchrun, a world of one. CPU tensors go over gloo, CUDA tensors over NCCL."""
    if int(os.environ.get("WORLD_SIZE", 1)) == 1 or dist.is_initialized():
        yield current_world()
        return
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # the trainer's "cuda" is this rank's GPU
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield current_world()
    finally:
        dist.destroy_process_group()
