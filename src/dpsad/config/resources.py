"""What each job asks a scheduler for: memory (MB) and runtime (minutes) from the config and the data, threads
and GPUs from the workflow's table (``workflow/resources.yaml``).  Pure functions of the configuration, the job's
wildcards and the data's shape, as :mod:`.inputs` is of the first two: the rules call them.

Failure prevented: a fixed request per rule is too small for a large dataset (a job killed for memory or time,
resubmitted identically) or far too large for the demo.  The requests grow with records, image size and
channels, steps x batch and the UNet's width and depth; each retry multiplies them by the attempt.

An estimate, not a GPU measurement: one example through a UNet is ``base_channels^2 x H x W x sum_l mult_l^2 x
(num_res_blocks + 1) / 4^l`` units; on 2 CPU cores the default teacher took 5.1e-9 s a unit, the DP stages twice
that, MoCo 1.1 ms and the evaluation CNNs 0.4 ms a 28 x 28 image; a GPU is assumed :data:`GPU_SPEEDUP` times
faster (``benchmarks/gpu_smoke.sh`` measures it).  Runtime is ``SAFETY x (overhead + work)`` rounded up to 10
minutes and capped at :data:`MAX_RUNTIME_MINUTES` (a longer stage resumes from its checkpoint on retry); memory
is the process (1 GB, 4 GB with CUDA), the data (uint8 read, float32 in memory) and on the CPU a batch's
activations (6 bytes a unit).  Records and image shape come from ``data.h5`` once prepared, else the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import DpsadError
from .stages import METHOD_KEYS, audit_run_by_name, dpdm_settings, method_settings, run_by_name, sample_settings

CPU_SECONDS_PER_UNIT = 5.1e-9
DP_WORK_FACTOR = 2.0
MOCO_CPU_SECONDS = 1.1e-3  # one 28 x 28 grey view through MoCo's encoder, forward and back
CLASSIFIER_CPU_SECONDS = 4.0e-4  # one 28 x 28 grey image through an evaluation CNN
INCEPTION_CPU_SECONDS = 0.05  # one image through Inception-v3 at 299 x 299, whatever its own size
GPU_SPEEDUP = 100.0
# The encoders read the private split one record at a time (a record's label from that record alone): on a GPU
# each call is bound by its kernel launches, not by the work, so GPU_SPEEDUP does not apply to it
ONE_RECORD_GPU_CALL_SECONDS = 0.01
SAFETY = 1.5
OVERHEAD_MINUTES = 5.0
MIN_RUNTIME_MINUTES = 15
MAX_RUNTIME_MINUTES = 2880  # 48 h, a common partition limit
BYTES_PER_ACTIVATION_UNIT = 6.0
CPU_PROCESS_MB, GPU_PROCESS_MB = 1000, 4000
UNKNOWN_RECORDS = 100_000
SMALL_JOB_THREADS = 2  # the threads a runtime estimate is scaled from
CLASSES = 10  # sampling and Private Evolution count per class; the label set is not known before prepare_data
# Sim-PE (pe.simulator) renders each candidate with the font renderer on a CPU core: about 2 ms with its vote, and
# holds its parameters, the elastic fields (2 x 28 x 28 float64) most of them
RENDER_SECONDS, GLYPH_PARAMETER_BYTES = 4e-3, 2 * 28 * 28 * 8
# Records of the built-in sources (train + test files), before the split; their native (size, channels).
KNOWN_SOURCE_RECORDS = {"mnist5k": 5_000, "mnist": 70_000, "fashion_mnist": 70_000, "celeba": 202_599}
NATIVE_SHAPE = {"mnist5k": (28, 1), "font_digits": (28, 1), "font_letters": (28, 1), "mnist": (28, 1), "fashion_mnist": (28, 1)}


def work_bound(settings: dict, method: str, n: int) -> tuple[float, int]:
    """(example gradients, the largest expected batch) a section's DP training may take on ``n`` records: the batch
    the dp_sizing rule would pick is bounded by the largest it may pick (no accountant runs for scheduling)."""
    dp_sizing = settings["dp_sizing"]
    compute_key, steps_key = METHOD_KEYS[method]
    largest = max(1, min(int(dp_sizing["max_sample_rate"] * n), int(dp_sizing[compute_key]) // int(dp_sizing[steps_key])))
    batch = int(settings.get("batch_size") or largest)
    if settings.get("epochs"):
        return float(settings["epochs"]) * n, batch
    if settings.get("steps") and settings.get("batch_size"):
        return float(settings["steps"]) * batch, batch
    return float(dp_sizing[compute_key]), batch


@dataclass(frozen=True)
class DataShape:
    """Records per split and the image shape of one dataset."""

    private: int
    public: int
    test: int
    image_size: int
    channels: int

    @property
    def records(self) -> int:
        return self.private + self.public + self.test

    @property
    def pixels(self) -> int:
        return self.image_size * self.image_size * self.channels


@dataclass(frozen=True)
class JobRequest:
    """One job's first-attempt request: memory in MB, runtime in minutes."""

    mem_mb: int
    runtime: int


@dataclass(frozen=True)
class RuleTable:
    """The workflow's table of each rule's threads and GPU use (``workflow/resources.yaml``)."""

    threads: dict[str, int]
    gpu_rules: frozenset[str]
    default_threads: int = SMALL_JOB_THREADS
    local_jobs_at_once: int = 1

    @classmethod
    def read(cls, path) -> "RuleTable":
        """The table in ``path``; a one-line error for a file that is not one."""
        try:
            table = yaml.safe_load(Path(path).read_text())
            rules = table["rules"]
            threads = {rule: int(row["threads"]) for rule, row in rules.items() if "threads" in row}
            gpus = frozenset(rule for rule, row in rules.items() if row.get("gpu"))
            default, at_once = int(table["default_threads"]), int(table.get("local_jobs_at_once", 1))
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as err:
            raise DpsadError(f"{path}: not a table of rule resources ({err}), expected default_threads and rules: "
                             "{rule: {threads: N, gpu: true|false}}") from None
        if (least := min([default, at_once, *threads.values()])) < 1:
            raise DpsadError(f"{path}: threads or local_jobs_at_once {least}, expected at least 1")
        return cls(threads, gpus, default, at_once)

    def rule_threads(self, rule: str) -> int:
        """The table's threads of a rule's jobs: the CPUs a SLURM job asks for (resource ``cpus_per_task``)."""
        return self.threads.get(rule, self.default_threads)

    def local_threads(self, rule: str, cores: int | None) -> int:
        """Threads of a rule's job in a run on ``cores`` (None: unknown, the table's): at most ``cores /
        local_jobs_at_once``, so that that many jobs run side by side (small models gain little from a second
        thread, docs/running.md)."""
        threads = self.rule_threads(rule)
        return max(1, min(threads, int(cores) // self.local_jobs_at_once)) if cores else threads

    def uses_gpu(self, rule: str) -> bool:
        return rule in self.gpu_rules


def read_prepared_shape(path: Path) -> DataShape | None:
    """The shape recorded in a prepared ``data.h5``, or None when it is absent or unreadable."""
    if not Path(path).is_file():
        return None
    try:
        import h5py

        with h5py.File(path, "r") as handle:
            attrs = handle.attrs
            return DataShape(*(int(attrs[key]) for key in ("n_train", "n_public", "n_test", "image_size", "channels")))
    except (OSError, KeyError, ValueError):
        return None


def configured_shape(section: dict) -> DataShape:
    """The shape a dataset's config section implies before ``prepare_data`` has run (an estimate)."""
    source = section["source"]
    native_size, native_channels = NATIVE_SHAPE.get(source, (64, 3))
    size = section.get("image_size") or native_size
    channels = section.get("channels", 3) if source == "imagefolder" else native_channels
    if source in ("font_digits", "font_letters"):
        records = 10 * int(section.get("n_per_class") or 100)
    else:
        records = KNOWN_SOURCE_RECORDS.get(source, UNKNOWN_RECORDS)
    test = round(records * (section.get("test_fraction") or 0.0))
    pool = records - test
    if public_section := section.get("public"):  # a separate public source
        public = configured_shape({**public_section, "image_size": size}).records
        private = round(pool * (section.get("private_fraction") or 1.0))
    else:
        public = round(pool * (section.get("public_fraction") or 0.0))
        private = round(pool * (section.get("private_fraction") or (1.0 - (section.get("public_fraction") or 0.0))))
    return DataShape(private, public, test, int(size), int(channels))


def unet_units(model: dict, image_size: int) -> float:
    """Work of one example through the UNet, in units of base_channels^2 x pixels (see the module docstring)."""
    depth = sum(mult * mult / 4 ** level for level, mult in enumerate(model["channel_mult"]))
    return model["base_channels"] ** 2 * image_size ** 2 * depth * (model["num_res_blocks"] + 1)


def unet_parameters(model: dict) -> float:
    """About how many parameters the UNet has (within 15% of the real count on four configs)."""
    return 60 * model["base_channels"] ** 2 * sum(m * m for m in model["channel_mult"]) * (model["num_res_blocks"] + 1)


def attempt_request(first: int, attempt: int, what: str) -> int:
    """A retry's request: the first attempt's times the attempt, runtime capped at MAX_RUNTIME_MINUTES."""
    scaled = first * attempt
    return min(scaled, max(first, MAX_RUNTIME_MINUTES)) if what == "runtime" else scaled


def job_request(config: dict, rule: str, wildcards: dict, shape: DataShape, table: RuleTable) -> JobRequest:
    """The first attempt's request of one job of ``rule`` (the workflow's rule name, not a module's alias), from
    the validated config, the job's wildcards and its dataset's shape."""
    gpus = int(config["gpus_per_job"]) if table.uses_gpu(rule) else 0
    model, size = config["model"], shape.image_size
    units = unet_units(model, size)
    activations = extra = 0.0
    if rule == "prepare_data":
        gpus, seconds = 0, shape.records * 2e-3 * shape.pixels / 784  # decode, resize, split: ~2 ms a small image
        extra = shape.records * shape.pixels * 8  # the sources' float64 arrays before conversion
    elif rule == "train_teacher":
        teacher = config["teachers"][wildcards["teacher"]]
        seconds = teacher["steps"] * teacher["batch_size"] * units * CPU_SECONDS_PER_UNIT
        activations = teacher["batch_size"] * units * BYTES_PER_ACTIVATION_UNIT
    elif rule in ("distill_student", "train_dpdm", "train_dpgan", "audit_run"):
        run = audit_run_by_name(config, wildcards["audited"]) if rule == "audit_run" else run_by_name(config, wildcards["run"])
        settings = dpdm_settings(config, run) if rule == "train_dpdm" else method_settings(config, run)
        if run["method"] == "dpgan":
            gan_units = settings["width"] ** 2 * size**2 * 2
            examples, batch = work_bound(settings, "dpgan", shape.private)
            seconds = (settings["warm_steps"] * batch + examples) * gan_units * CPU_SECONDS_PER_UNIT * DP_WORK_FACTOR
            activations = batch * gan_units * BYTES_PER_ACTIVATION_UNIT
        else:  # DP-SAD's student or DPDM (an audit of a non-DP run is sized like a student)
            trains_dpdm = rule == "train_dpdm" or run["method"] == "dpdm"  # a PE run's DPDM generator too
            examples, batch = work_bound(settings, "dpdm" if trains_dpdm else "student", shape.private)
            seconds = examples * settings.get("timesteps_per_example", 1) * units * CPU_SECONDS_PER_UNIT * DP_WORK_FACTOR
            activations = batch * units * BYTES_PER_ACTIVATION_UNIT
            extra = 0.0 if gpus else 2 * settings["dp"]["microbatch_size"] * unet_parameters(model) * 4
        seconds *= 2 if rule == "audit_run" else 1  # an audit retrains the audited run once with canaries
    elif rule == "train_pe":  # the candidates (at most) each iteration and the final set
        pe = method_settings(config, run_by_name(config, wildcards["run"]))
        images = CLASSES * (pe["max_candidates_per_class"] * (pe["max_iterations"] + 1) + pe["final_per_class"])
        if pe.get("simulator") and pe["embedding"] == "pixels":  # rendered on the CPU; no model: no GPU (the Snakefile)
            gpus, seconds = 0, images * RENDER_SECONDS
            activations = 2 * CLASSES * max(pe["max_candidates_per_class"], pe["final_per_class"]) * GLYPH_PARAMETER_BYTES
        else:  # the teacher's images
            seconds = images * pe["sample_steps"] * units * CPU_SECONDS_PER_UNIT / 3
            activations = 250 * units * BYTES_PER_ACTIVATION_UNIT / 3
    elif rule == "inception_figures":  # the test images and each row's, at most inception_samples a side
        images = 2 * (len(config["runs"]) + 1) * min(config["evaluate"]["inception_samples"], shape.records)
        seconds = images * INCEPTION_CPU_SECONDS
    elif rule == "sample":  # forward passes only
        sample = sample_settings(config, run_by_name(config, wildcards["run"]))
        passes = sample["n_per_class"] * CLASSES * sample["steps"] * (2 if sample.get("guidance") else 1)
        seconds = passes * units * CPU_SECONDS_PER_UNIT / 3
        activations = sample["batch_size"] * units * BYTES_PER_ACTIVATION_UNIT / 3
    else:  # small networks, in image passes
        evaluate = config["evaluate"]
        cnn = evaluate.get("cnn_trainings", 3) * evaluate["classifier_epochs"]
        passes = {
            "train_moco": config["moco"]["epochs"] * shape.public * 2,
            "extract_features": shape.records,
            "kmeans_labels": shape.records * 3,
            "train_evaluator": evaluate["evaluator_epochs"] * (shape.private + shape.public),
            "evaluate": cnn * config["sample"]["n_per_class"] * 10 + shape.test,
            "evaluate_real": cnn * (shape.private + shape.public) + shape.test,
        }.get(rule, shape.records)
        per_pass = MOCO_CPU_SECONDS if rule in ("train_moco", "extract_features") else CLASSIFIER_CPU_SECONDS
        seconds = passes * per_pass * shape.pixels / 784
    seconds = seconds / (GPU_SPEEDUP * gpus) if gpus else seconds * SMALL_JOB_THREADS / max(table.rule_threads(rule), 1)
    one_at_a_time = rule == "extract_features" or rule == "kmeans_labels" and config["kmeans"]["features"] == "teacher"
    if gpus and one_at_a_time:
        seconds += shape.private * ONE_RECORD_GPU_CALL_SECONDS
    minutes = SAFETY * (OVERHEAD_MINUTES + seconds / 60)
    process = GPU_PROCESS_MB if gpus else CPU_PROCESS_MB + activations / 2**20
    megabytes = process + (shape.records * shape.pixels * 5 + extra) / 2**20  # the data: uint8 read, float32 used
    return JobRequest(int(math.ceil(SAFETY * megabytes / 1000) * 1000),
                      min(MAX_RUNTIME_MINUTES, max(MIN_RUNTIME_MINUTES, int(math.ceil(minutes / 10) * 10))))
