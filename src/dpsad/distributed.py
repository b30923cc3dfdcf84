"""Data-parallel training inside one job (one process per GPU, or CPU processes with gloo).

For DP-SGD the privacy-relevant rule is: each process clips its share of the
Poisson batch per example, the clipped sums are all-reduced, and the noise is
added once to the reduced sum (every process draws the *same* noise from an
identically seeded generator, so the processes stay in step and the released
gradient carries exactly one N(0, sigma^2 C^2) draw).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """This process's share of a batch: rows rank, rank + world_size, ..."""
        if not self.enabled:
            return tensors
        return tuple(t[self.rank::self.world_size] for t in tensors)

    def all_reduce_sum_(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.enabled:
            for value in tensors.values():
                dist.all_reduce(value, op=dist.ReduceOp.SUM)

    def average_gradients_(self, model: torch.nn.Module) -> None:
        """Mean of ``.grad`` over processes (plain data parallelism for non-private training)."""
        if self.enabled:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad /= self.world_size

    def broadcast_ints(self, values: list[int]) -> list[int]:
        """The first process's ``values`` on every process (e.g. secret seeds that all processes must share)."""
        if not self.enabled:
            return list(values)
        box = [list(values)]
        dist.broadcast_object_list(box, src=0)
        return list(box[0])

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


SINGLE = DistributedContext()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, backend: str, port: int, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        fn(DistributedContext(rank, world_size), *args)
    finally:
        dist.destroy_process_group()


def launch(fn, world_size: int, backend: str = "gloo", *args) -> None:
    """Run ``fn(context, *args)`` in ``world_size`` processes on this node (single process when 1)."""
    if world_size <= 1:
        fn(SINGLE, *args)
        return
    # fork: the training closures of the stage scripts need not be picklable; CUDA is not initialised before this point.
    torch.multiprocessing.start_processes(_entry, args=(world_size, backend, _free_port(), fn, args), nprocs=world_size,
                                          join=True, start_method="fork")


def device_for(context: DistributedContext, requested: torch.device) -> torch.device:
    """cuda:<rank> for multi-GPU runs on CUDA, else the requested device."""
    if context.enabled and requested.type == "cuda":
        return torch.device(f"cuda:{context.rank}")
    return requested
