"""The benchmark and experiment scripts keep working on a CPU machine (tiny size)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def benchmark(name: str, folder: str = "benchmarks"):
    """The module <folder>/<name>.py, imported into this process (<folder> is on sys.path only meanwhile)."""
    sys.path.insert(0, str(ROOT / folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / folder))


@pytest.mark.e2e  # every stage of the three paper configurations, in a process of its own
@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")
def test_gpu_smoke_runs_every_stage_at_tiny_size_without_cuda():
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(["bash", "benchmarks/gpu_smoke.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    stages_part, _, opacus_part = out.stdout.partition("clipped sums agree")
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in stages_part.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")}
    # dpsad's DP step beside Opacus's on the same model and batch, after checking that both clip alike
    engines = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in opacus_part.splitlines()
               if line.startswith("| ") and not line.startswith("| step")}
    assert set(engines) == {"non-private step", "dpsad DPSGD, per_example vmap", "dpsad DPSGD, per_example hooks",
                            "dpsad DPSGD, per_example ghost", "Opacus GradSampleModule (hooks) + clip + noise"}
    assert min(engines.values()) > 0
    stages = ["teacher", "dpdm", "dpsad student (all)", "dpsad discriminator", "moco"]
    for stage in stages:
        assert stage in rows, (stage, out.stdout)
    assert any(name.startswith("dpgan critic") for name in rows) and any(name.startswith("sample ") for name in rows)
    for name, cells in rows.items():
        assert float(cells[2]) > 0, name  # images/s measured
    for name in ["dpdm", "dpsad student (all)", "dpsad discriminator"]:
        # the paper configuration's engine (hooks, the faster one on a GPU) and the DP/non-DP ratio
        assert rows[name][1].strip() == "hooks" and rows[name][4].strip().endswith("x"), name
        assert float(rows[name][6]) >= 0, name  # hours at the paper schedule
    assert "no CUDA device" in out.stdout and "config/paper/mnist.yaml" in out.stdout


def test_the_largest_batch_search_stops_where_a_kernel_leaves_its_32_bit_index_range(monkeypatch):
    """On an H200 vmap's convolutions stopped past 32-bit indexing before memory ran out: that batch does not fit,
    and any other error still stops the benchmark."""
    import torch

    stages = benchmark("stage_throughput")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def step_at(batch):
        if batch > 300:
            raise RuntimeError("Expected canUse32BitIndexMath(input) && canUse32BitIndexMath(output) to be true")

    assert stages.largest_fitting(stages.fits_on_the_card(step_at, None), 8) == 300

    def broken(batch):
        raise RuntimeError("a shape mismatch")

    with pytest.raises(RuntimeError, match="a shape mismatch"):
        stages.fits_on_the_card(broken, None)(8)


def test_the_sampling_hours_draw_each_class_the_configuration_names():
    """A release is n_per_class images of each class: CelebA's hair colours are 3, its gender 2, MNIST's digits 10."""
    import yaml

    stages = benchmark("stage_throughput")
    classes = {name: stages.configured_classes(next(iter(yaml.safe_load(
        (ROOT / "config" / "paper" / f"{name}.yaml").read_text())["data"].values())))
        for name in ("celeba64", "celeba_gender", "mnist")}
    assert classes == {"celeba64": 3, "celeba_gender": 2, "mnist": 10}
    assert stages.configured_classes({"source": "imagefolder", "class_names": ["cat", "dog"]}) == 2


@pytest.mark.e2e  # the benchmark script, twice, in processes of its own
def test_resource_estimates_print_each_stage_and_grow_with_the_records():
    def table(records):
        out = subprocess.run([sys.executable, "benchmarks/resource_estimates.py", "--config", "config/examples/imagefolder.yaml",
                              "--records", str(records), "--public-records", "10000"], cwd=ROOT, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": "src"}, timeout=120)
        assert out.returncode == 0, out.stderr
        return {" ".join(line.split()[:-4]): [float(x) for x in line.split()[-4:]] for line in out.stdout.splitlines()[2:]}

    small, large = table(50_000), table(500_000)
    assert {"prepare_data", "train_teacher public", "distill_student dpsad_eps10", "train_dpdm dpdm_eps10"} <= set(small)
    assert small["distill_student dpsad_eps10"][0] == 1 and small["evaluate_real"][0] == 0  # GPUs
    # runtime: a training sized by dp_sizing spends the compute it is given, however many records there are
    assert large["distill_student dpsad_eps10"][3] == small["distill_student dpsad_eps10"][3]
    assert large["evaluate_real"][3] > small["evaluate_real"][3]
    assert large["prepare_data"][2] > small["prepare_data"][2]  # memory


@pytest.mark.e2e  # the benchmark script in a process of its own
def test_the_convolution_benchmark_times_every_convolution_of_the_unet_with_each_kernel():
    out = subprocess.run([sys.executable, "benchmarks/bench_conv_gradients.py", "--batch", "4", "--repeats", "1"],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "src:benchmarks"},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| ")][1:]
    layers = [row[0].strip() for row in rows[:-1]]
    assert {"stem", "out_conv"} <= set(layers) and len(layers) > 10
    assert rows[-1][0].strip() == "total" and all(float(cell) > 0 for row in rows for cell in row[3:])


@pytest.mark.e2e  # starts a Python process
def test_the_sizing_table_pairs_each_run_with_its_before_and_averages_repeated_trainings(tmp_path):
    import csv

    rows = [("public", "0.5", "0.01", ""), ("nonprivate", "0.9", "0.01", "1"), ("dpsad_eps10", "0.7", "0.02", "0.5"),
            ("dpsad_eps10_r2", "0.8", "0.03", "0.75"), ("dpsad_eps10_before", "0.6", "0.02", "0.25"),
            ("dpdm_eps1", "n/c", "", "")]
    path = tmp_path / "toy.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "acc_cnn", "acc_cnn_std", "gap_closed"])
        writer.writerows(rows)
    out = subprocess.run([sys.executable, "experiments/sizing_table.py", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| ")}
    assert lines["dpsad_eps10"] == "| dpsad_eps10 | 0.600 +- 0.020 (0.25) | 0.750 +- 0.071 over 2 trainings (0.62) |"
    assert lines["dpdm_eps1"] == "| dpdm_eps1 | not run | not computed |"


def test_the_opacus_benchmark_draws_every_noise_on_the_device_of_its_tensors(monkeypatch):
    """On CUDA it stopped with "Expected a 'cuda' device type for generator but found 'cpu'".  CUDA's rule is
    enforced here on the meta device: Opacus's step on meta tensors takes a generator of that device, and every
    generator the script makes names its device."""
    import ast
    import copy

    import torch

    bench_opacus = benchmark("bench_opacus")
    from opacus import GradSampleModule

    class Generator:  # torch makes no meta generator: this one knows its device, as CUDA's does
        def __init__(self, device="cpu"):
            self.device = torch.device(device)

        def manual_seed(self, seed):
            return self

    real_randn = torch.randn

    def randn(*size, generator=None, device=None, **kwargs):
        if generator is not None and generator.device.type != torch.device(device or "cpu").type:
            raise RuntimeError(f"Expected a '{torch.device(device).type}' device type for generator but found "
                               f"'{generator.device.type}'")
        return real_randn(*size, device=device, **kwargs)

    monkeypatch.setattr(torch, "Generator", Generator)
    monkeypatch.setattr(torch, "randn", randn)
    meta = torch.device("meta")
    model = bench_opacus.UNet(bench_opacus.UNetConfig(in_channels=1, num_classes=10, **bench_opacus.DEMO)).to(meta)
    gsm = GradSampleModule(copy.deepcopy(model))
    diffusion = bench_opacus.GaussianDiffusion(bench_opacus.DiffusionConfig(timesteps=500))
    batch = (real_randn(2, 1, 16, 16, device=meta), torch.zeros(2, 1, dtype=torch.long, device=meta),
             torch.zeros(2, dtype=torch.long, device=meta), real_randn(2, 1, 1, 16, 16, device=meta))
    out = bench_opacus.opacus_step(gsm, diffusion, batch, clip=0.1, sigma=1.0,
                                   generator=bench_opacus.generator_on(meta, 4))
    assert all(v.device == meta for v in out.values())
    with pytest.raises(RuntimeError, match="Expected a 'meta' device type for generator but found 'cpu'"):
        bench_opacus.opacus_step(gsm, diffusion, batch, clip=0.1, sigma=1.0, generator=torch.Generator().manual_seed(3))
    tree = ast.parse((ROOT / "benchmarks" / "bench_opacus.py").read_text())
    made = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.Generator"]
    assert made and all(any(k.arg == "device" for k in node.keywords) for node in made)


@pytest.mark.e2e  # the experiment's plans at 2x and 4x the demo's compute
def test_the_compute_table_runs_get_the_rules_steps_and_its_table_groups_their_trainings(tmp_path):
    compute_table = benchmark("compute_table", "experiments")
    from dpsad.privacy.accounting import steps_for_epochs
    from dpsad.privacy.mechanism.plan import size_dp_training

    rule = {"example_gradients": 16000, "min_steps": 60, "target_snr": 200.0, "max_sample_rate": 0.25,
            "min_batch_size": 16}
    for method, epsilon, multiple, n in (("dpsad", 10.0, 4, 2000), ("dpdm", 1.0, 2, 1000)):
        run = compute_table.sized_run(method, epsilon, multiple, n, rule, "_r2")
        size = size_dp_training(n, epsilon, 1e-5, **{**rule, "example_gradients": multiple * rule["example_gradients"]})
        section = run["student" if method == "dpsad" else "dpdm"]
        assert run["name"] == f"{method}_eps{epsilon:g}_x{multiple}_r2" and section["batch_size"] == size.batch_size
        assert steps_for_epochs(section["epochs"], size.batch_size / n) == size.steps
    csv_path = tmp_path / "comparison.csv"
    csv_path.write_text("dataset,run,gap_closed\nd,public,\nd,dpsad_eps10_x1,0.4\nd,dpsad_eps10_x1_r2,0.6\n"
                        "d,dpsad_eps10_curriculum,0.5\nd,dpdm_eps10_x8,n/c\n")
    found = compute_table.cells(csv_path, None)
    assert found[("d", "dpsad eps 10", 1)][0] == [0.4, 0.6] and found[("d", "dpsad eps 10", "curriculum")][0] == [0.5]
    assert found[("d", "dpdm eps 10", 8)][0] == []  # not computed stays out of the mean
    assert compute_table._cell([0.4, 0.6]) == "0.50 +- 0.14 (2)" and compute_table._cell([]) == "not computed"
    # the demo's own records, nothing released (its release list names the demo's runs, not these)
    assert compute_table.checking_overlay("demo") == {"data": {"mnist5k": {"release": []}}}
    assert compute_table.checking_overlay("letters1k")["datasets"] == ["letters1k"]


def test_plan_check_finds_the_tiny_runs_plans_in_their_ledgers_and_a_changed_split_in_none(tiny_run, tmp_path, capsys):
    # in this process (its imports and the compositions this test run already made are not paid again)
    plan_check = benchmark("plan_check")
    script = [str(tiny_run), str(ROOT / "tests" / "data" / "tiny.yaml")]
    assert plan_check.main(script) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()]
    assert len(rows) == 8 and all(line.endswith(" same") for line in rows)  # three students x 2 updates, DPDM, dp-GAN
    split = tmp_path / "split.yaml"
    split.write_text("student: {budget_split: {student: 0.5, discriminator: 0.5}}\n")
    assert plan_check.main(script + [str(split)]) == 1
    verdicts = {line.split()[0]: line.split()[-1] for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    assert verdicts["dpsad_eps10"] == "DIFFERENT" and verdicts["dpdm_eps10"] == "same"


@pytest.mark.e2e  # the script runs Snakemake
def test_the_gpu_configuration_script_clears_the_lock_a_stopped_run_left(tmp_path):
    """benchmarks/gpu_config.sh stopped from outside (a time limit that ran out killed Snakemake before it let
    go of its lock) is run again as it is: the stale lock is cleared first, as `make demo` does; its summary of each
    job's seconds follows Snakemake's exit."""
    work = tmp_path / "gpu"
    (work / ".snakemake" / "locks").mkdir(parents=True)
    stale = work / ".snakemake" / "locks" / "0.output.lock"
    stale.write_text("results/comparison.md\n")
    out = subprocess.run(["bash", "benchmarks/gpu_config.sh", str(work), "--dry-run"], cwd=ROOT,
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "removed the lock of an interrupted run" in out.stderr and not stale.exists()
    assert "snakemake exit 0" in out.stdout and "This was a dry-run" in out.stdout + out.stderr
    assert "s  of job time in 0 jobs" in out.stdout, out.stderr[-2000:]  # the summary reads Snakemake's benchmarks


def test_the_largest_batch_search_finds_the_edge_of_what_fits():
    """stage_throughput.py --largest-batch on a GPU: doubling, then halving the gap, over a monotone fits(b)."""
    search = benchmark("stage_throughput").largest_fitting
    for edge in (8, 9, 100, 1000, 4096, 5000):
        tried = []
        fits = lambda b, edge=edge: tried.append(b) or b <= edge  # noqa: E731
        assert search(fits, 8) == edge, edge
        assert len(tried) <= 2 * edge.bit_length() + 2  # a logarithmic number of trial steps
    assert search(lambda b: False, 8) == 0
    assert search(lambda b: True, 8, limit=300) == 300


def test_the_levers_table_groups_trainings_and_states_the_gap_closed(tmp_path):
    levers_table = benchmark("levers_table", "experiments")
    results = tmp_path / "results" / "toy"
    for run, accuracy in (("public", 0.5), ("nonprivate", 0.9), ("pe_eps1", 0.6), ("pe_eps1_r2", 0.7),
                          ("public_n300", 0.6), ("nonprivate_n300", 1.0)):
        (results / run).mkdir(parents=True)
        (results / run / "metrics.json").write_text(json.dumps({"accuracy": {"cnn": accuracy}}))
    (tmp_path / "logs" / "toy").mkdir(parents=True)
    (tmp_path / "logs" / "toy" / "train_pe_pe_eps1.bench.tsv").write_text("s\th:m:s\n12.0\t0:00:12\n")
    (tmp_path / "logs" / "toy" / "train_pe_pe_eps1_r2.bench.tsv").write_text("s\th:m:s\n8.0\t0:00:08\n")
    rows = levers_table.table(tmp_path, "toy", ["pe_eps1", "pe_eps1_r2", "dpsad_eps1"])
    assert "| pe_eps1 | 2 | 0.650 +- 0.071 | 0.375 +- 0.177 | 10 |" in rows
    assert "| dpsad_eps1 | 0 | not computed: no metrics.json yet | | |" in rows
    beside = levers_table.table(tmp_path, "toy", ["pe_eps1_r2"], ("public_n300", "nonprivate_n300"))
    assert beside[2:] == ["| public_n300 | 1 | 0.600 | 0 | |", "| nonprivate_n300 | 1 | 1.000 | 1 | |",
                          "| pe_eps1 | 1 | 0.700 | 0.250 | 8 |"]


def test_the_sampling_levers_draw_every_row_again_with_the_changed_setting(tiny_run):
    script = [sys.executable, str(ROOT / "experiments" / "sampling_levers.py"), "mnist5k", "--workspace", str(tiny_run),
              "--config", str(ROOT / "tests" / "data" / "tiny.yaml")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(script + ["dpsad_eps10", "dpdm_eps10", "--set", "guidance=1.0"], capture_output=True,
                          text=True, env=env, check=True)
    rows = {row["run"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert list(rows) == ["public", "nonprivate", "dpsad_eps10", "dpdm_eps10"]
    # the changed setting, over the overlay layered on the default as the run was built (eta from the default's,
    # steps from the overlay's)
    assert all(row["sample"]["guidance"] == 1.0 and row["sample"]["eta"] == 1.0 and row["sample"]["steps"] == 4
               and 0 <= row["acc_cnn"] <= 1 for row in rows.values())
    floor, ceiling = rows["public"]["acc_cnn"], rows["nonprivate"]["acc_cnn"]
    if floor != ceiling:
        assert rows["dpsad_eps10"]["gap_closed"] == round((rows["dpsad_eps10"]["acc_cnn"] - floor) / (ceiling - floor), 3)
    else:
        assert rows["dpsad_eps10"]["gap_closed"].startswith("not computed")
    for change, message in (("guidence=1.0", "'guidence' is not a sample setting"),
                            ("sampler=ddpm", "'ddpm' is not a JSON value"), ("steps=0", "--set: ")):
        bad = subprocess.run(script + ["dpsad_eps10", "--set", change], capture_output=True, text=True, env=env)
        assert bad.returncode == 2 and message in bad.stderr and not bad.stdout
    pe = subprocess.run(script + ["pe_eps1"], capture_output=True, text=True, env=env)
    assert pe.returncode != 0 and "run 'pe_eps1': Private Evolution" in pe.stderr and not pe.stdout


@pytest.mark.e2e  # the benchmark times fresh processes
def test_the_job_start_benchmark_times_a_scripts_imports_and_the_first_optimizer_step(capsys):
    """One row a script, with what its imports load (the ledger stage loads none of the heavy libraries), then the
    first Adam step through the pipeline's optimizers and torch's own, then a small training's CPU time with either
    collector; a name not in workflow/scripts is refused."""
    job_start = benchmark("job_start")
    job_start.main(["--repeats", "1", "account.py"])
    lines = capsys.readouterr().out.splitlines()
    (account,) = [line for line in lines if line.startswith("| account.py |")]
    assert float(account.split("|")[2]) > 0 and account.split("|")[3].strip() == "-"
    steps = [line for line in lines if line.startswith(("| the pipeline's", "| torch's own"))]
    assert len(steps) == 2 and all(float(line.split("|")[2]) >= 0 for line in steps)
    trainings = [line for line in lines if line.startswith(("| the collector as a job", "| a plain process's"))]
    assert len(trainings) == 2 and all(float(line.split("|")[2]) > 0 for line in trainings)
    with pytest.raises(SystemExit, match=r"\['nonexistent.py'\] not in workflow/scripts"):
        job_start.main(["nonexistent.py"])


# What fit on one H200 (benchmarks/README.md, "On a GPU"): DPDM's per-example gradients of K = 8 draws of 64x64
# images ran out of memory with the CelebA batch of 128 in one chunk; 124 was the largest chunk that fit.
H200_DPDM_DRAW_PIXELS = 124 * 8 * 64 * 64


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "config" / "paper").glob("*.yaml")))
def test_each_paper_configurations_dpdm_chunk_fits_where_an_h200_measured_it(name):
    """A paper run's DPDM job must not stop on a CUDA out-of-memory error of a card as large as an H200: its chunk
    (the smaller of ``dp.microbatch_size`` and the batch) times K draws times the pixels stays within what fit."""
    import yaml

    from dpsad.config import dpdm_settings, validate_config
    from dpsad.config.resources import configured_shape

    config = validate_config(yaml.safe_load((ROOT / "config" / "paper" / f"{name}.yaml").read_text()))
    run = next(run for run in config["runs"] if run["method"] == "dpdm")
    settings = dpdm_settings(config, run)
    size = configured_shape(config["data"][config["datasets"][0]]).image_size
    chunk = min(settings.dp.microbatch_size, settings.batch_size)
    assert chunk * settings.timesteps_per_example * size * size <= H200_DPDM_DRAW_PIXELS, (name, chunk, size)
