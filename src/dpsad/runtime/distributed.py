"""Data-parallel training inside one job: processes started by torch's own launcher (torchrun).

For DP-SGD the privacy-relevant rule is: each process clips its share of the
Poisson batch per example, the clipped sums are all-reduced, and the noise is
added once to the reduced sum (every process draws the *same* noise from an
identically seeded generator, so the processes stay in step and the released
gradient carries exactly one N(0, sigma^2 C^2) draw).

Processes are never forked: the job runs ``python -m torch.distributed.run``
(on several SLURM tasks through ``srun``, one launcher per task, rendezvous at
the job's first node), which starts fresh interpreters.  Each one runs the
job's own script again with :data:`WORKER_ENV` set, trains, and stops; the
job's process keeps the outputs, the log and the bookkeeping.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

WORKER_ENV = "DPSAD_TRAINING_WORKER"  # set (to the backend) in the training processes torch's launcher starts


def is_worker() -> bool:
    """True in a training process started through torch's launcher by a job (this module)."""
    return bool(os.environ.get(WORKER_ENV))


def die_with_parent() -> None:
    """Ask Linux to end this process when its parent ends (PR_SET_PDEATHSIG), so no training outlives its job."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own handling of a lost job applies


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

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

    def broadcast_float(self, value: float) -> float:
        """The first process's ``value`` on every process: a clip norm each computes from the same public data, which
        two devices may round apart, so that no process clips to more than the one its noise is scaled to."""
        return float(self.broadcast_ints([float(value)])[0])

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


SINGLE = DistributedContext()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def worker_context() -> DistributedContext:
    """Join the process group the launcher set up (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_*``)."""
    backend = os.environ[WORKER_ENV]
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, rank=rank, world_size=world)
    return DistributedContext(rank, world, local)


def end_worker() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass(frozen=True)
class LaunchPlan:
    """How many launchers (``agents``: SLURM tasks, one per node or more) and processes each starts."""

    agents: int = 1
    processes_per_agent: int = 1
    nodes: int = 1

    @property
    def world_size(self) -> int:
        return self.agents * self.processes_per_agent


def launch_command(plan: LaunchPlan, program: list[str], *, slurm_job: str | None, run_id: str) -> list[str]:
    """The command that runs ``program`` (a script and its arguments) in ``plan.world_size`` processes through
    torch's launcher.

    One launcher: ``--standalone`` on this node.  Several (SLURM tasks): ``srun`` starts one per task in the
    job's allocation and they meet at this node (the job's first) on a free port."""
    run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={plan.processes_per_agent}"]
    if plan.agents == 1:
        return run + ["--standalone", "--nnodes=1", *program]
    if not slurm_job:
        raise ValueError(f"{plan.agents} launchers need a SLURM allocation (srun), expected tasks: 1 outside SLURM")
    endpoint = f"{socket.gethostname()}:{_free_port()}"
    return ["srun", f"--jobid={slurm_job}", f"--ntasks={plan.agents}", f"--nodes={plan.nodes}", "--overlap",
            "--kill-on-bad-exit=1"] + run + [f"--nnodes={plan.agents}", "--rdzv-backend=c10d",
                                             f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", *program]


def run_launcher(command: list[str], env: dict) -> int:
    """Run the launcher command and return its exit code; it ends with this process (see :func:`die_with_parent`)."""
    return subprocess.run(command, env=env, preexec_fn=die_with_parent).returncode


def device_for(context: DistributedContext, requested: torch.device) -> torch.device:
    """cuda:<local rank> for multi-GPU runs on CUDA, else the requested device."""
    if context.enabled and requested.type == "cuda":
        return torch.device(f"cuda:{context.local_rank}")
    return requested
