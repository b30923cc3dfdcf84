"""A cluster user's workflow: GPU requests, execution settings that rerun nothing, the pinned
environment, the configuration reference, tracebacks in rule logs, and use as a Snakemake module."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from test_workflow import ROOT, planned_jobs, snakemake, workdir
from workflow_helpers import TWO_THREAD_RULES, resource_lines, run_snakemake

from dpsad.config import validate_config
from dpsad.runtime.devices import launch_plan
from dpsad.config.resources import RuleTable
from dpsad.errors import DpsadError
from dpsad.jobs.stage import run_stage

TRAINING_RULES = {"train_teacher", "distill_student", "train_dpdm", "train_dpgan", "sample"}
RULE_TABLE = RuleTable.read(ROOT / "workflow" / "resources.yaml")


def job_resources(result: subprocess.CompletedProcess) -> dict[str, dict[str, str]]:
    """{rule: {resource: value}} of the largest memory request among each rule's jobs in a dry run."""
    return {rule: max(jobs, key=lambda job: int(job.get("mem_mb", 0))) for rule, jobs in resource_lines(result).items()}


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["mnist", "celeba64"])
def test_paper_configs_ask_slurm_for_a_gpu_on_every_training_rule(tmp_path, name):
    overlay = tmp_path / "kmeans.yaml"  # every teacher on k-means labels: none can be the feature teacher; and
    # Inception weights (a dry run downloads nothing), so that the inception_figures stage is in the plan
    overlay.write_text("labels: kmeans\nkmeans: {teacher: null}\nevaluate: {inception_weights: download}\n")
    extra = (str(overlay),) if name == "mnist" else ()
    result = snakemake(workdir(tmp_path), "all", "-n", "--profile", "slurm", "--configfile", f"config/paper/{name}.yaml", *extra)
    resources = job_resources(result)
    expected = TRAINING_RULES | ({"train_moco", "extract_features", "kmeans_labels"} if extra else set())
    assert expected <= set(resources)
    for rule in expected:
        assert resources[rule].get("gpu") == "1", (rule, resources[rule])
    if extra:  # the rules that ask for GPUs are the ones the workflow's table gives a GPU (workflow/resources.yaml)
        # (audit_run is not in all; the paper configurations run no Private Evolution; cluster_report is sized as
        # kmeans_labels)
        assert {r for r, res in resources.items() if res.get("gpu") == "1"} == (
            RULE_TABLE.gpu_rules - {"audit_run", "train_pe"}) | {"cluster_report"}
    for rule in ("prepare_data", "account", "compare", "release_run"):
        assert "gpu" not in resources[rule]
    # memory and runtime are the rules' estimates from the config (dpsad.config.resources), not Snakemake's defaults
    assert int(resources["distill_student"]["mem_mb"]) >= 4000 and int(resources["train_dpdm"]["runtime"]) >= 60


PAPER_DRY_RUN = ("all", "-n", "--profile", "slurm", "--configfile", "config/paper/mnist.yaml")


@pytest.mark.e2e
def test_a_set_resources_override_of_one_rule_keeps_every_other_rules_resources(tmp_path):
    cwd = workdir(tmp_path)
    before = resource_lines(snakemake(cwd, *PAPER_DRY_RUN))
    after = resource_lines(snakemake(cwd, *PAPER_DRY_RUN, "--set-resources", "train_teacher:gpu=4",
                                     "--default-resources", "slurm_partition=gpu"))
    assert {job["gpu"] for job in after["train_teacher"]} == {"4"}

    def workflow_requests(lines):  # the computing rules' own requests (Snakemake's defaults fill the rest)
        return {r: [{k: v for k, v in j.items() if k in ("gpu", "gres", "mem_mb", "runtime")} for j in jobs]
                for r, jobs in lines.items() if r != "train_teacher" and "runtime" in before[r][0]}

    assert len(workflow_requests(before)) >= 8 and workflow_requests(after) == workflow_requests(before)
    assert all(job["slurm_partition"] == "gpu" for jobs in after.values() for job in jobs if "mem_mb" in job)


@pytest.mark.e2e
def test_a_gres_given_to_a_rule_replaces_its_gpu_request(tmp_path):
    resources = job_resources(snakemake(workdir(tmp_path), *PAPER_DRY_RUN, "--set-resources", "train_teacher:gres=gpu:a100:2"))
    assert resources["train_teacher"]["gres"] == "gpu:a100:2" and resources["train_teacher"]["gpu"] == "0"
    assert resources["distill_student"]["gpu"] == "1" and "gres" not in resources["distill_student"]


@pytest.mark.e2e
def test_the_default_config_asks_for_no_gpu(tmp_path):
    resources = job_resources(snakemake(workdir(tmp_path), "all", "-n", "--profile", "slurm"))
    assert all(r.get("gpu", "0") == "0" for r in resources.values())


def test_the_gpus_a_job_asked_for_are_read_from_gpu_or_gres():
    from dpsad.runtime.devices import requested_gpus

    def job(**resources):
        return SimpleNamespace(resources=SimpleNamespace(**resources))

    assert requested_gpus(job()) == 0 and requested_gpus(job(gpu=0)) == 0
    assert requested_gpus(job(gpu=2)) == 2 and requested_gpus(job(gres="gpu:a100:4")) == 4
    assert requested_gpus(job(gres="gpu")) == 1 and requested_gpus(job(gres="tmpfs:10G")) == 0


@pytest.mark.e2e
def test_distributed_processes_follow_the_gpus_and_tasks_requested():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    def plan(device, processes="auto", **resources):
        job = SimpleNamespace(resources=SimpleNamespace(**resources), config={"distributed": {"processes": processes}})
        found = launch_plan(job, device)
        return found.agents, found.processes_per_agent, found.nodes

    assert plan(cuda, gpu=4) == (1, 4, 1) and plan(cuda, gpu=0) == (1, 1, 1)
    assert plan(cpu, gpu=4) == (1, 1, 1) and plan(cpu, 2) == (1, 2, 1)
    # several nodes: one launcher per task, the job's GPUs shared among them
    assert plan(cuda, gpu=8, nodes=2, tasks=2) == (2, 4, 2) and plan(cpu, tasks=2) == (2, 1, 1)
    # --config hands nested values over as strings; "auto" and a positive integer are the choices
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert validate_config({**copy.deepcopy(base), "distributed": {"processes": "2"}})["distributed"]["processes"] == 2
    assert validate_config(copy.deepcopy(base))["distributed"]["processes"] == "auto"
    with pytest.raises(DpsadError, match=r"distributed.processes = 0, expected a positive integer, or auto"):
        validate_config({**copy.deepcopy(base), "distributed": {"processes": 0}})


def test_a_crash_lands_in_the_rule_log_with_its_traceback(tmp_path):
    log = tmp_path / "stage.log"  # Snakemake creates the log folder before the script runs
    fake = SimpleNamespace(log=[str(log)], threads=1, output=[str(tmp_path / "out.pt")], rule="train_teacher")

    def body(snakemake, log):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(RuntimeError):
        run_stage(fake, body)
    text = log.read_text()
    assert "Traceback" in text and "CUDA out of memory" in text and "train_teacher failed with RuntimeError" in text


def test_environment_file_is_pinned_and_needs_no_path_into_the_checkout():
    env = yaml.safe_load((ROOT / "envs" / "dpsad.yaml").read_text())
    assert "python=3.11" in env["dependencies"]
    pins = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict))
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+-]*", pin) for pin in pins), pins
    pyproject = (ROOT / "pyproject.toml").read_text()
    block = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    declared = {re.match(r'\s*"([A-Za-z0-9_.-]+)', line).group(1).lower() for line in block.splitlines() if '"' in line}
    assert declared == {pin.split("==")[0].lower() for pin in pins}
    assert 'requires-python = ">=3.11"' in pyproject
    # one file of tested versions: the environment pins exactly what both README commands install
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731  (PEP 503)
    tested = {norm(name): version for name, version in (line.split("==") for line in
              (ROOT / "envs" / "constraints.txt").read_text().splitlines() if line and not line.startswith("#"))}
    pinned = {norm(pin.split("==")[0]): pin.split("==")[1] for pin in pins}
    assert {name: tested.get(name) for name in pinned} == pinned
    makefile = (ROOT / "Makefile").read_text()
    (definition,) = re.findall(r"^PIP_INSTALL := ((?:.*\\\n)*.*)$", makefile, re.M)
    assert definition.endswith(" -c $(CONSTRAINTS)"), definition
    assert makefile.count("$(PIP_INSTALL) -e .\n") == 1 and makefile.count("$(PIP_INSTALL) -e '.[test]'") == 1
    # every install goes through the constraints, but the installer's own, at its pinned version
    assert re.search(r"^UV_VERSION := \d+\.\d+\.\d+$", makefile, re.M)
    assert [line for line in makefile.splitlines() if "pip install" in line and "PIP_INSTALL := " not in line] == [
        "\ttest -x $(VENV)/bin/uv || $(VENV)/bin/python -m pip install --disable-pip-version-check -q uv==$(UV_VERSION)"]
    assert "CONSTRAINTS := envs/constraints.txt" in makefile
    # the versions this suite runs with are the file's (a drifted install would fail here, not in a user's job)
    import importlib.metadata as metadata

    for name in ("torch", "snakemake", "numpy", "opacus", "dp-accounting", "h5py"):
        assert metadata.version(name) == tested[name], name


def test_the_installer_is_given_the_sources_pip_is_configured_with_and_no_folder_of_its_own():
    """uv reads no pip configuration: the Makefile passes pip's wheel folders and local indexes (a machine that keeps
    torch's wheels on its disk for pip), and names none itself."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pip_sources", ROOT / "envs" / "pip_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    listing = ("global.cert='/etc/ssl/ca.crt'\n"
               "global.extra-index-url='file:///srv/a/simple file:///srv/b/simple'\n"
               "global.find-links='/srv/wheels'\n:env:.find-links='/srv/wheels'\n")
    assert module.uv_options(listing) == ("--find-links /srv/wheels --extra-index-url file:///srv/a/simple "
                                          "--extra-index-url file:///srv/b/simple --index-strategy unsafe-best-match")
    assert module.uv_options("global.cert='/etc/ssl/ca.crt'\n") == ""  # no configured source: PyPI alone
    makefile = (ROOT / "Makefile").read_text()
    assert "$(PIP_SOURCES)" in makefile and not re.search(r"/(opt|srv|mnt)/", makefile)


@pytest.mark.e2e  # starts a Python process
def test_the_doctor_says_whether_a_gpu_job_would_start_here():
    import sys

    run = lambda *args: subprocess.run([sys.executable, "-m", "dpsad.runtime.doctor", *args], capture_output=True, text=True)  # noqa: E731
    cpu = run("--gpus", "0")
    assert cpu.returncode == 0 and f"torch {torch.__version__}" in cpu.stdout and "would start here" in cpu.stdout
    if not torch.cuda.is_available():
        gpu = run("--gpus", "1")
        assert gpu.returncode == 1 and "a job asking for 1 GPU(s) would NOT start" in gpu.stdout
        if torch.version.cuda:
            assert f"built for CUDA {torch.version.cuda}" in gpu.stdout and "needs" in gpu.stdout


def _schema_keys(node, keys):
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            keys.add(key)
            _schema_keys(value, keys)
        for value in node.values():
            if isinstance(value, (dict, list)):
                _schema_keys(value, keys)
    elif isinstance(node, list):
        for value in node:
            _schema_keys(value, keys)
    return keys


def test_the_configuration_page_describes_every_key_of_the_schema():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    readme = (ROOT / "docs" / "configuration.md").read_text()
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    documented = set(re.findall(r"`([^`]+)`", prose))
    words = {word for span in documented for word in re.split(r"[^A-Za-z0-9_]+", span) if word}
    missing = sorted(_schema_keys(schema, set()) - words)
    assert not missing, f"docs/configuration.md does not describe: {missing}"


@pytest.mark.parametrize("name", sorted(f"{p.parent.name}/{p.stem}" for folder in ("paper", "gpu")
                                         for p in (ROOT / "config" / folder).glob("*.yaml")))
def test_the_gpu_configurations_clip_with_the_hooks_engine_and_the_demo_keeps_auto(name):
    """On one H200 the hooks engine ran the DP-SAD student 1.3-1.5x faster than ghost (benchmarks/README.md): the
    configurations made for GPUs choose it; the demo's CPU configuration keeps auto (ghost, level there)."""
    gpu = validate_config(yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text()))
    demo = validate_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    for section in ("student", "dpdm"):
        assert gpu[section]["dp"]["per_example"] == "hooks", (name, section)
        assert demo[section]["dp"]["per_example"] == "auto", section


# no_public.yaml is run with --replace-workflow-config (the default's teachers train on a public split it lacks)
@pytest.mark.parametrize("name", sorted(f"{p.parent.name}/{p.stem}" for folder in ("paper", "examples", "gpu")
                                         for p in (ROOT / "config" / folder).glob("*.yaml") if p.stem != "no_public"))
def test_paper_configs_mean_the_same_merged_over_the_default(name):
    """--configfile merges over config/config.yaml: nothing of the demo may leak into a paper run or an example."""
    from snakemake.utils import update_config

    paper = yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())
    alone = validate_config(copy.deepcopy(paper))
    merged = copy.deepcopy(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    update_config(merged, copy.deepcopy(paper))
    merged = validate_config(merged)
    used = {run["teacher"] for run in alone["runs"]} | {alone["sweep"]["teacher"], alone["kmeans"]["teacher"]}
    for key in alone:
        if key == "teachers":  # the demo's other teachers stay, unused: no run of the paper config names them
            assert {t: merged["teachers"][t] for t in alone["teachers"]} == alone["teachers"]
            assert not used & (set(merged["teachers"]) - set(alone["teachers"]))
        elif key == "data":  # the demo's dataset entry stays, unused: only the listed datasets run
            assert {d: merged["data"][d] for d in alone["datasets"]} == {d: alone["data"][d] for d in alone["datasets"]}
        else:
            assert merged[key] == alone[key], key


@pytest.mark.e2e
def test_a_config_file_is_merged_over_the_default(tmp_path):
    overlay = tmp_path / "two_runs.yaml"
    overlay.write_text("runs:\n  - {name: dpsad_eps2, method: dpsad, teacher: public, target_epsilon: 2.0}\n")
    cwd = workdir(tmp_path)
    # the default's release list names runs this file replaced: a stale name is an error, not a surprise
    stale = snakemake(cwd, "all", "-n", "--configfile", str(overlay), check=False)
    assert stale.returncode != 0
    assert "data.mnist5k.release lists 'public', expected one of the runs (dpsad_eps2)" in stale.stdout + stale.stderr
    overlay.write_text(overlay.read_text() + "data: {mnist5k: {release: [dpsad_eps2]}}\n")
    jobs = planned_jobs(snakemake(cwd, "all", "-n", "--configfile", str(overlay)))
    # the default's teachers, data and sections remain; only the run list is replaced
    assert jobs["distill_student"] == 1 and jobs["train_teacher"] == 1 and jobs["prepare_data"] == 1
    assert jobs["release_run"] == 1 and jobs["release_budget"] == 1


@pytest.mark.e2e
def test_workflow_runs_as_a_module_of_another_workflow(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "Snakefile").write_text(f'''
configfile: "{ROOT}/config/config.yaml"


module dpsad:
    snakefile:
        "{ROOT}/Snakefile"
    config:
        config


use rule * from dpsad as dpsad_*


rule all:
    input:
        rules.dpsad_all.input,
    default_target: True
''')
    jobs = planned_jobs(snakemake(host, "-n", "--cores", "1"))
    assert jobs["dpsad_distill_student"] == 3 and jobs["dpsad_release_run"] == 2 and jobs["all"] == 1
    assert jobs["dpsad_release_budget"] == 1 and jobs["dpsad_privacy_spent"] == 1
    release = planned_jobs(snakemake(host, "-n", "--cores", "1", "dpsad_release"))
    assert release["dpsad_release_run"] == 2 and "dpsad_evaluate" not in release
    # the renamed rules keep the workflow's own requests; overriding one of them leaves the others alone
    (tmp_path / "direct").mkdir()
    direct = resource_lines(snakemake(workdir(tmp_path / "direct"), "all", "-n", "--config", "gpus_per_job=1"))
    hosted = resource_lines(snakemake(host, "-n", "--cores", "1", "--config", "gpus_per_job=1", "--set-resources",
                                      "dpsad_distill_student:mem_mb=99000"))
    assert {job["mem_mb"] for job in hosted["dpsad_distill_student"]} == {"99000"}
    assert direct["train_teacher"][0]["gpu"] == "1" and int(direct["train_teacher"][0]["mem_mb"]) >= 4000
    assert {f"dpsad_{rule}": jobs for rule, jobs in direct.items() if rule not in ("all", "distill_student")} == {
        rule: jobs for rule, jobs in hosted.items() if rule not in ("all", "dpsad_distill_student")}


@pytest.mark.e2e
def test_a_host_workflow_builds_a_release_through_the_module_with_the_modules_own_package(tmp_path):
    """use rule * from dpsad as dpsad_* (the README's recipe), from a copy of the checkout while this checkout's
    package is the one installed: the jobs run the module's src/, and the release is built."""
    import shutil

    from dpsad.synthetic import load_synthetic

    module = tmp_path / "dpsad_copy"
    module.mkdir()
    for name in ("Snakefile", "workflow", "config", "src", "profiles", "envs"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(
            ROOT / name, module / name, **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")}
                                          if (ROOT / name).is_dir() else {}))
    (module / "tests" / "data").mkdir(parents=True)
    shutil.copy2(ROOT / "tests" / "data" / "tiny.yaml", module / "tests" / "data" / "tiny.yaml")
    host = tmp_path / "host"
    host.mkdir()
    (host / "host.yaml").write_text("student: {epochs: 0.05, batch_size: 16}\n"
                                    "runs: [{name: dpsad_eps10, method: dpsad, teacher: public, target_epsilon: 10.0}]\n"
                                    "data: {mnist5k: {release: [dpsad_eps10]}}\n")
    (host / "Snakefile").write_text(f'''
configfile: "{module}/config/config.yaml"
configfile: "{module}/tests/data/tiny.yaml"
configfile: "host.yaml"


module dpsad:
    snakefile:
        "{module}/Snakefile"
    config:
        config


use rule * from dpsad as dpsad_*
''')
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one_thread_each = [f"dpsad_{rule}=1" for rule in TWO_THREAD_RULES]  # as the other workflow tests, under its prefix
    result = run_snakemake(host, ["dpsad_release", "--cores", "2", "--set-threads", *one_thread_each], env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    released = load_synthetic(host / "release" / "mnist5k" / "dpsad_eps10" / "synthetic.h5")
    assert released.attrs["dp_guarantee"] is True and released.attrs["epsilon"] <= 10.0
    for log in ("prepare_data", "train_teacher_public", "distill_student_dpsad_eps10"):
        assert f"from {module / 'src' / 'dpsad'}" in (host / "logs" / "mnist5k" / f"{log}.log").read_text(), log


def test_license_and_catalog_files_exist():
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    catalog = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())
    assert catalog["usage"]["software-stack-deployment"]["conda"] is False  # --sdm conda is unsupported
    assert Path(ROOT / "slurm").resolve() == (ROOT / "profiles" / "slurm").resolve()


@pytest.mark.e2e  # starts a Python process
def test_no_rule_names_a_conda_environment_and_the_lint_accepts_only_that(tmp_path):
    import sys

    rules = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
    assert not [path.name for path in rules if re.search(r"^\s+(conda|container):", path.read_text(), re.MULTILINE)]
    accepted = "Lints for rule a (line 1, x.smk):\n    * Specify a conda environment or container for each rule.:\n      text\n"
    other = accepted + "Lints for rule b (line 9, x.smk):\n    * No log directive defined:\n      text\n"
    for name, output, code, expected in (("accepted", accepted, 1, 0), ("other", other, 1, 1), ("broken", "Traceback\n", 1, 1),
                                         ("clean", "", 0, 0)):
        fake = tmp_path / name
        fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write({output!r})\nsys.exit({code})\n")
        fake.chmod(0o755)
        done = subprocess.run([sys.executable, str(ROOT / ".ci" / "lint.py"), str(fake)], capture_output=True, text=True)
        assert done.returncode == expected, (name, done.stdout, done.stderr)
        if expected:
            assert "error: snakemake --lint: " in done.stderr
    assert "No log directive defined" in subprocess.run([sys.executable, str(ROOT / ".ci" / "lint.py"), str(tmp_path / "other")],
                                                         capture_output=True, text=True).stderr


def test_requests_grow_with_the_data_and_the_work_and_with_each_retry(tmp_path):
    import h5py

    from dpsad.config.resources import MAX_RUNTIME_MINUTES, DataShape, attempt_request, configured_shape, read_prepared_shape

    def job_request(config, rule, wildcards, shape):
        from dpsad.config.resources import job_request

        return job_request(config, rule, wildcards, shape, RULE_TABLE)

    config = validate_config(yaml.safe_load((ROOT / "config" / "paper" / "mnist.yaml").read_text()))
    small = configured_shape(config["data"]["mnist"])
    assert (small.image_size, small.channels) == (28, 1) and small.records == 70_000
    large = DataShape(small.private * 10, small.public, small.test, 64, 3)
    student = {"dataset": "mnist", "run": "dpsad_eps10"}
    on_small, on_large = job_request(config, "distill_student", student, small), job_request(config, "distill_student", student, large)
    assert on_large.mem_mb > on_small.mem_mb and on_large.runtime > on_small.runtime
    teacher = {"dataset": "mnist", "teacher": "public"}
    longer = copy.deepcopy(config)
    longer["teachers"]["public"]["steps"] *= 4
    assert job_request(longer, "train_teacher", teacher, small).runtime > job_request(config, "train_teacher", teacher, small).runtime
    wider = copy.deepcopy(config)
    wider["model"]["base_channels"] *= 2
    assert job_request(wider, "train_teacher", teacher, small).runtime > job_request(config, "train_teacher", teacher, small).runtime
    # the private split's features go through the encoder one record at a time: on a GPU, launch-bound calls
    gpu = copy.deepcopy(config)
    gpu["gpus_per_job"] = 1
    many = DataShape(1_000_000, small.public, small.test, 28, 1)
    features = {"dataset": "mnist"}
    assert job_request(gpu, "extract_features", features, many).runtime >= 1_000_000 * 0.01 / 60
    assert job_request(gpu, "extract_features", features, small).runtime < job_request(gpu, "extract_features", features, many).runtime
    # a retry asks for more; runtime stops at the partition-friendly cap, where checkpoints carry the work on
    assert attempt_request(on_small.mem_mb, 2, "mem_mb") == 2 * on_small.mem_mb
    assert attempt_request(1200, 2, "runtime") == 2400 and attempt_request(2000, 3, "runtime") == MAX_RUNTIME_MINUTES
    # once prepare_data has run, its file's record counts and image shape are used
    prepared = tmp_path / "data.h5"
    with h5py.File(prepared, "w") as handle:
        handle.attrs.update(n_train=123, n_public=45, n_test=67, image_size=32, channels=3)
    assert read_prepared_shape(prepared) == DataShape(123, 45, 67, 32, 3)
    assert read_prepared_shape(tmp_path / "absent.h5") is None


def test_a_sim_pe_job_is_sized_as_a_cpu_job_holding_its_candidates_parameters():
    from dpsad.config.resources import configured_shape, job_request

    def requests(gpus_per_job, max_candidates_per_class):
        config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
        config.update(gpus_per_job=gpus_per_job, pe={"max_candidates_per_class": max_candidates_per_class})
        config["runs"].append({"name": "simpe", "method": "pe", "target_epsilon": 10.0, "pe": {"simulator": True}})
        config = validate_config(config)
        shape = configured_shape(config["data"]["mnist5k"])
        return {run: job_request(config, "train_pe", {"dataset": "mnist5k", "run": run}, shape, RULE_TABLE)
                for run in ("simpe", "pe_eps1")}

    on_cpu, with_gpus = requests(0, 100), requests(1, 100)
    assert with_gpus["simpe"] == on_cpu["simpe"]  # a CPU job's request: it asks the scheduler for no GPU
    assert with_gpus["simpe"].mem_mb < with_gpus["pe_eps1"].mem_mb  # no GPU process to hold
    # its candidates' elastic fields (12.5 KB each) are what grows with them
    assert requests(0, 20_000)["simpe"].mem_mb >= on_cpu["simpe"].mem_mb + 4000


@pytest.mark.e2e
def test_a_gpu_job_asks_slurm_for_its_cpus_whatever_the_submitting_hosts_cores(tmp_path, monkeypatch):
    """Snakemake caps threads at the submitting machine's cores (2 here, and on many login nodes); the CPUs a job
    asks SLURM for, and computes with inside its allocation, are the rule's own."""
    from dpsad.runtime.threads import job_threads

    RULE_THREADS = RULE_TABLE.threads

    result = snakemake(workdir(tmp_path), *PAPER_DRY_RUN, "--cores", "2")
    resources = job_resources(result)
    for rule in ("train_teacher", "distill_student", "train_dpdm", "sample"):
        assert resources[rule]["cpus_per_task"] == str(RULE_THREADS[rule]) and RULE_THREADS[rule] > 2, rule
    job = SimpleNamespace(threads=2, resources=SimpleNamespace(cpus_per_task=8))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert job_threads(job) == 2  # on this machine: Snakemake's cap holds
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert job_threads(job) == 8  # in the SLURM job: what it was given


@pytest.mark.e2e
def test_a_local_run_shares_its_cores_between_two_jobs_and_slurm_jobs_keep_the_tables_cpus(tmp_path):
    assert RULE_TABLE.local_jobs_at_once == 2
    assert [RULE_TABLE.local_threads("train_teacher", cores) for cores in (1, 2, 3, 8, 16, 64)] == [1, 1, 1, 4, 8, 8]
    assert RULE_TABLE.local_threads("train_teacher", None) == 8 and RULE_TABLE.local_threads("compare", 2) == 1
    # in the workflow: the threads shown by a dry run on 2 and 8 cores, beside the CPUs a SLURM job asks for
    for cores, threads in (("2", None), ("8", "4")):  # Snakemake prints no threads line for one thread
        result = run_snakemake(workdir(tmp_path / cores if (tmp_path / cores).mkdir() is None else None),
                               ["all", "-n", "--cores", cores], {**os.environ})
        block = result.stdout[result.stdout.index("rule train_teacher:"):].split("\n\n")[0]
        shown = re.search(r"^\s+threads: (\d+)", block, re.M)
        assert (shown and shown.group(1)) == threads, (cores, block)
        assert "cpus_per_task=8" in block


def test_the_rule_table_is_read_with_one_line_errors(tmp_path):
    assert RULE_TABLE.rule_threads("train_teacher") == 8 and RULE_TABLE.rule_threads("compare") == 2
    assert RULE_TABLE.uses_gpu("distill_student") and not RULE_TABLE.uses_gpu("prepare_data")
    bad = tmp_path / "resources.yaml"
    for text, expected in (("rules: {train_teacher: {threads: 8}}\n", "default_threads"),
                           ("default_threads: 0\nrules: {}\n", "threads or local_jobs_at_once 0, expected at least 1"),
                           ("default_threads: 2\nlocal_jobs_at_once: 0\nrules: {}\n", "local_jobs_at_once 0, expected"),
                           ("[1, 2]\n", "not a table of rule resources")):
        bad.write_text(text)
        with pytest.raises(DpsadError, match=expected) as err:
            RuleTable.read(bad)
        assert "\n" not in str(err.value)
