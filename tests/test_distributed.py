"""Data-parallel DP-SGD on the CPU with gloo, through torch's own launcher as a job runs it: two processes give the
single-process update, one noise draw of the stated size, the single-process ledger, and the same secret seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpsad.runtime.distributed import LaunchPlan, launch_command, run_launcher
from dpsad.runtime.distributed import WORKER_ENV

WORKER = str(Path(__file__).with_name("distributed_worker.py"))


def launch(what: str, out_dir: Path, processes: int) -> None:
    """``what`` in ``processes`` processes through the launcher (1: in one plain process, as a job with one GPU)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", WORKER_ENV: "gloo"}
    if processes == 1:
        env.pop(WORKER_ENV)
        result = subprocess.run([sys.executable, WORKER, what, str(out_dir), "single"], env=env, capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        return
    command = launch_command(LaunchPlan(processes_per_agent=processes), [WORKER, what, str(out_dir)], slurm_job=None,
                             run_id="test")
    assert command[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in command
    assert run_launcher(command, env) == 0


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory) -> Path:
    """The launches the tests below read, made once (each process imports torch, a few seconds apiece):
    ``single``: the update and the DP teacher in one plain process; ``a``: the same two and the secret seeds in
    two processes; ``b``: the secret seeds again, in a second run of two processes."""
    out = tmp_path_factory.mktemp("distributed")
    for name in ("single", "a", "b"):
        (out / name).mkdir()
    launch("update,teacher", out / "single", 1)
    launch("update,teacher,secret", out / "a", 2)
    launch("secret", out / "b", 2)
    return out


def test_two_processes_give_the_one_process_update_and_one_noise_draw_of_the_stated_size(distributed_runs):
    from distributed_worker import CLIP, EXPECTED_BATCH, SIGMA

    single = torch.load(distributed_runs / "single" / "update_1.pt")
    double = torch.load(distributed_runs / "a" / "update_2.pt")
    for name in single:
        assert torch.allclose(single[name], double[name], atol=1e-6), name
    noise = torch.cat([g.flatten() for g in torch.load(distributed_runs / "a" / "noise_2.pt").values()])
    assert noise.numel() > 20_000
    expected = SIGMA * CLIP / EXPECTED_BATCH  # one draw of N(0, sigma^2 C^2) on the sum, over the expected batch
    assert abs(noise.std().item() / expected - 1) < 0.03 and abs(noise.mean().item()) < 0.03 * expected


def test_a_two_process_dp_teacher_writes_the_one_process_ledger_once(distributed_runs):
    """The whole DP teacher loop: one checkpoint, and a ledger equal to one process's but for the entry's uid."""
    one, two = (json.loads((distributed_runs / run / f"t{k}.json").read_text())["entries"]
                for run, k in (("single", 1), ("a", 2)))
    assert len(one) == len(two) == 1 and two[0]["mechanism"] == "sgm"
    strip = lambda entry: {k: v for k, v in entry.items() if k != "uid"}  # noqa: E731
    assert strip(one[0]) == strip(two[0])
    assert torch.load(distributed_runs / "a" / "t2.pt", weights_only=False)["step"] == one[0]["steps"] == 4


def test_secret_seeds_are_shared_by_all_processes_and_differ_between_runs(distributed_runs):
    """Every process must draw the same batches and noise; a new run must draw new ones."""
    a0, a1, b0 = (torch.load(distributed_runs / f, weights_only=False) for f in ("a/rank0.pt", "a/rank1.pt", "b/rank0.pt"))
    assert a0["kind"] == "secret"
    assert torch.equal(a0["sampling"], a1["sampling"]) and torch.equal(a0["noise"], a1["noise"])
    assert not torch.equal(a0["sampling"], b0["sampling"]) and not torch.equal(a0["noise"], b0["noise"])


def test_several_launchers_need_slurm_and_meet_at_this_node():
    import pytest

    with pytest.raises(ValueError, match="2 launchers need a SLURM allocation"):
        launch_command(LaunchPlan(agents=2), ["job.py"], slurm_job=None, run_id="x")
    command = launch_command(LaunchPlan(agents=2, processes_per_agent=4, nodes=2), ["job.py"], slurm_job="77", run_id="r")
    assert command[:6] == ["srun", "--jobid=77", "--ntasks=2", "--nodes=2", "--overlap", "--kill-on-bad-exit=1"]
    assert "--nnodes=2" in command and "--nproc-per-node=4" in command and "--rdzv-backend=c10d" in command
    assert any(arg.startswith("--rdzv-endpoint=") and arg.count(":") == 1 for arg in command) and command[-1] == "job.py"
