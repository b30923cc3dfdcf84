"""Typed settings: one frozen dataclass a training method, built once from the validated configuration.

Each field is a key of the method's section in ``workflow/schemas/config.schema.yaml`` (tests keep the two
equal), plus the run's target (``target_epsilon``, ``delta``) and the ``dp_sizing`` keys the method reads.
Fields are marked on the class:

- :func:`execution_only`: how a job runs, not what it computes (checkpoint spacing, per-example engine,
  microbatch, precision).  They are left out of :meth:`Settings.result_view`, the rule's params, so that
  changing them (after a CUDA out-of-memory, say) never reruns a stage nor spends budget again;
- :func:`optional`: keys the schema gives no default, left out of every view while unset or set to what their
  absence means, so that a configuration that never names them keeps the params it had and one that writes
  them out at that meaning gets the same;
- ``inputs_sha256``: the content of the job's inputs, set by the stage (:func:`with_inputs`); it joins the
  resume digest (:meth:`RunSettings.resume_view`), not the params (Snakemake tracks the inputs itself).

The privacy layer reads a method's section by key (``settings["dp"]["accountant"]``): every class is also a
read-only :class:`~collections.abc.Mapping` of its fields, so that code needs no import of this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from ..errors import DpsadError


EXECUTION_ONLY = "execution_only"
OPTIONAL = "optional"
ABSENT = "absent"
DEFAULT_EMA_WARMUP = 10  # the EMA's warm-up where ema_warmup is left out (training.schedules.EMA)
INTERNAL = "internal"


def execution_only() -> Any:
    """A field that decides how a job runs, not what it computes: never in the rule's params."""
    return field(metadata={EXECUTION_ONLY: True})


def optional(absent: Any = None) -> Any:
    """A field the schema gives no default: None where the section leaves it out, and left out of every view while
    it holds None or ``absent``, the value the training reads the missing key as (:func:`means_absent`).
    Failure prevented: a key written out at that meaning (``dp.subspace: false``) changing a rule's params, so that
    a DP stage would train and spend its budget again for a configuration that computes the same."""
    return field(default=None, metadata={OPTIONAL: True, ABSENT: absent})


def means_absent(value: Any, absent: Any) -> bool:
    """Whether an optional key's ``value`` is what its absence means: None, or ``absent`` of the same type (an
    integer 0 is not ``false``)."""
    return value is None or (absent is not None and type(value) is type(absent) and value == absent)


@dataclass(frozen=True, kw_only=True)
class Settings(Mapping):
    """Base of every settings class: construction from a section, the views, and a read-only Mapping."""

    NESTED: ClassVar[dict[str, type[Settings]]] = {}

    @classmethod
    def from_section(cls, section: Mapping, where: str = "config"):
        """The settings of a complete (validated, defaults filled) section; unknown or missing keys are
        one-line errors naming ``where``."""
        names = {f.name: f for f in fields(cls) if f.name != "inputs_sha256" and not f.metadata.get(INTERNAL)}
        unknown = sorted(set(section) - set(names))
        if unknown:
            raise DpsadError(f"{where}: unknown key {', '.join(map(repr, unknown))} for {cls.__name__}, expected one of "
                             f"{', '.join(sorted(names))}")
        missing = sorted(name for name, f in names.items() if name not in section and not f.metadata.get(OPTIONAL))
        if missing:
            raise DpsadError(f"{where}: {cls.__name__} lacks {', '.join(missing)}, expected a section validated by "
                             "the configuration schema (which fills its defaults)")
        values = {}
        for name, value in section.items():
            nested = cls.NESTED.get(name)
            values[name] = nested.from_section(value, f"{where}.{name}") if nested and isinstance(value, Mapping) else value
        return cls(**values)

    def as_dict(self) -> dict:
        """Every key that is set, nested settings as dicts: what a checkpoint stores (a plain dict, so a checkpoint
        loads without this class)."""
        return self._view(keep_execution=True)

    def result_view(self) -> dict:
        """The keys that shape the result, sorted (nested too): a rule's params, its rerun trigger.

        Sorted because Snakemake compares params as text: the order in which configuration layers were
        merged must not look like a change."""
        return self._view(keep_execution=False)

    def unused_keys(self) -> frozenset[str]:
        """Keys these settings hold but the training does not read (a DP stage's ``dp_sizing`` where batch and
        length are set; ``dp_sizing.<key>`` for one key of it): left out of :meth:`result_view`, so that editing
        them reruns no stage and spends nothing."""
        return frozenset()

    def _view(self, keep_execution: bool) -> dict:
        out = {}
        unused = frozenset() if keep_execution else self.unused_keys()
        for f in self._present():
            if f.name == "inputs_sha256" and not keep_execution or f.metadata.get(EXECUTION_ONLY) and not keep_execution:
                continue
            if f.name in unused:
                continue
            value = getattr(self, f.name)
            out[f.name] = value._view(keep_execution) if isinstance(value, Settings) else as_plain(value)
            if isinstance(out[f.name], dict):
                out[f.name] = {k: v for k, v in out[f.name].items() if f"{f.name}.{k}" not in unused}
        return sorted_keys(out)

    def _present(self) -> list:
        """The fields that are keys of the section: not the internal ones, an optional one only when it holds
        more than its absence means (:func:`optional`), ``inputs_sha256`` only once a stage set it."""
        return [f for f in fields(self) if not f.metadata.get(INTERNAL)
                and not (f.metadata.get(OPTIONAL) and means_absent(getattr(self, f.name), f.metadata[ABSENT]))
                and not (f.name == "inputs_sha256" and not getattr(self, f.name))]

    # a read-only Mapping of the keys that are set, for code that reads a section by key
    def __getitem__(self, key: str):
        if key not in {f.name for f in self._present()}:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter([f.name for f in self._present()])

    def __len__(self) -> int:
        return len(self._present())


def as_plain(value):
    """``value`` with every Mapping (settings included) a dict and every tuple a list: what JSON and a
    checkpoint hold (a checkpoint must load without this module's classes)."""
    if isinstance(value, Mapping):
        return {key: as_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_plain(item) for item in value]
    return value


def sorted_keys(value):
    """``value`` with every dict's keys in sorted order, recursively."""
    if isinstance(value, dict):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(item) for item in value]
    return value


@dataclass(frozen=True, kw_only=True)
class RunSettings(Settings):
    """What every trained run adds to its method's section: the target, and the stage's input digest."""

    target_epsilon: float | None
    delta: float
    inputs_sha256: str = ""

    def resume_view(self) -> dict:
        """:meth:`result_view` and the inputs' content: what a resumable checkpoint must share with the run that
        resumes it.  Without the execution-only keys, a training stopped by a CUDA out-of-memory continues once
        ``microbatch_size`` is lowered instead of starting over (and spending its noise draws again)."""
        return {**self.result_view(), "inputs_sha256": self.inputs_sha256}


def sized(settings: Settings, planned: Mapping) -> Settings:
    """``settings`` with the sizes a DP plan filled in where the section left them out (``planned``: the plan's
    :attr:`~dpsad.privacy.mechanism.plan.DpPlan.settings`): its batch_size, and its steps where the class has
    that key (DPDM; a student or critic counts its steps in the plan)."""
    names = {f.name for f in fields(settings)}
    return replace(settings, **{key: planned[key] for key in ("batch_size", "steps") if key in names and key in planned})


def with_inputs(settings: Settings, digest: str) -> Settings:
    """``settings`` of a job whose inputs have the content ``digest`` (:func:`dpsad.jobs.stage.inputs_sha256`)."""
    return replace(settings, inputs_sha256=digest)


@dataclass(frozen=True, kw_only=True)
class DpTraining(Settings):
    """``dp``: DP-SGD of a trained component (schema ``$defs/dp_training``)."""

    clip_norm: float
    accountant: str
    noise_seed: int | None
    clip_from_public: bool
    clip_update_every: int
    subspace: bool | None = optional(absent=False)
    microbatch_size: int = execution_only()
    per_example: str = execution_only()
    precision: str = execution_only()


@dataclass(frozen=True, kw_only=True)
class PeDp(Settings):
    """``pe.dp``: the accountant and the noise seed of Private Evolution's histograms."""

    accountant: str
    noise_seed: int | None


@dataclass(frozen=True, kw_only=True)
class TeacherSettings(RunSettings):
    """A diffusion model trained by the plain loop or DP-SGD: a teacher (``teachers.<name>``, schema
    ``$defs/teacher``)."""

    NESTED: ClassVar[dict[str, type[Settings]]] = {"dp": DpTraining}

    split: str
    privacy: str
    labels: Any
    epochs: float | None
    steps: int | None
    batch_size: int | None
    lr: float
    warmup_steps: int
    ema_decay: float
    ema_warmup: int | None = optional(absent=DEFAULT_EMA_WARMUP)
    label_dropout: float
    grad_clip: float
    seed: int
    timesteps_per_example: int
    trainable: str | None = optional(absent="all")  # training.adapters.choose_trainable's reading of None
    lora_rank: int | None = optional()
    init: str
    population: str | None = optional()
    noise_distribution: str
    lognormal_mean: float
    lognormal_std: float
    loss_weighting: str
    lr_schedule: str
    lr_decay_rate: float
    model: dict
    dp: DpTraining
    checkpoint_every: int = execution_only()


def unused_sizing(dp_sizing: Mapping, batch_size, length, compute_key: str) -> frozenset[str]:
    """What a DP training reads of its ``dp_sizing`` keys (:func:`dpsad.privacy.mechanism.plan.sized_settings`):
    nothing where batch and length are set, only the compute where the batch alone is (the steps spend it)."""
    if batch_size and length:
        return frozenset({"dp_sizing"})
    if batch_size:
        return frozenset(f"dp_sizing.{key}" for key in dp_sizing if key != compute_key)
    return frozenset()


@dataclass(frozen=True, kw_only=True)
class DpdmSettings(TeacherSettings):
    """DPDM: the ``dpdm`` section (a teacher's keys) on the private split by DP-SGD, with its ``dp_sizing``
    keys (compute, fewest steps, the shared rule)."""

    dp_sizing: dict

    def unused_keys(self) -> frozenset[str]:
        """The sizing keys the plan does not read, and ``population`` (a teacher's key: DPDM trains on the private
        split; the configuration check refuses one set for DPDM)."""
        sizing = unused_sizing(self.dp_sizing, self.batch_size, self.epochs or self.steps, "example_gradients")
        return sizing | {"population"}


@dataclass(frozen=True, kw_only=True)
class Discriminator(Settings):
    privacy: str
    base_channels: int


@dataclass(frozen=True, kw_only=True)
class BudgetSplit(Settings):
    student: float
    discriminator: float


@dataclass(frozen=True, kw_only=True)
class StudentSettings(RunSettings):
    """The DP-SAD student (``student``, schema ``$defs/student``) with its ``dp_sizing`` keys."""

    NESTED: ClassVar[dict[str, type[Settings]]] = {"dp": DpTraining, "discriminator": Discriminator,
                                                   "budget_split": BudgetSplit}

    mode: str
    allow_unsound: bool
    epochs: float | None
    batch_size: int | None
    lr: float
    disc_lr: float
    lr_schedule: str
    timesteps_per_example: int
    noise_distribution: str
    lognormal_mean: float
    lognormal_std: float
    adv_weight: float
    data_weight: float
    teacher_weight: float
    label_dropout: float
    ema_decay: float
    ema_warmup: int | None = optional(absent=DEFAULT_EMA_WARMUP)
    init_from_teacher: bool
    trainable: str
    lora_rank: int | None = optional()
    discriminator: Discriminator
    budget_split: BudgetSplit
    paper_noise_multiplier: float
    seed: int
    dp: DpTraining
    dp_sizing: dict
    checkpoint_every: int = execution_only()

    def unused_keys(self) -> frozenset[str]:
        """:func:`unused_sizing`'s ``dp_sizing`` keys; the paper mechanism's keys in ``mode: sound``."""
        sizing = unused_sizing(self.dp_sizing, self.batch_size, self.epochs, "example_gradients")
        return sizing | ({"paper_noise_multiplier", "allow_unsound"} if self.mode == "sound" else frozenset())


@dataclass(frozen=True, kw_only=True)
class DpganSettings(RunSettings):
    """The dp-GAN baseline (``dpgan``, schema ``$defs/dpgan``) with its critic's ``dp_sizing`` keys."""

    NESTED: ClassVar[dict[str, type[Settings]]] = {"dp": DpTraining}

    epochs: float | None
    batch_size: int | None
    lr: float
    n_critic: int
    gp_weight: float
    latent_dim: int
    width: int
    warm_steps: int
    grouping: str
    groups: int
    adaptive_clipping: bool
    public_batch_size: int
    seed: int
    dp: DpTraining
    dp_sizing: dict
    checkpoint_every: int = execution_only()

    def unused_keys(self) -> frozenset[str]:
        return unused_sizing(self.dp_sizing, self.batch_size, self.epochs, "critic_example_gradients")


@dataclass(frozen=True, kw_only=True)
class PeSettings(RunSettings):
    """Private Evolution (``pe``, schema ``$defs/pe``): it plans its own sizes, so no ``dp_sizing``."""

    NESTED: ClassVar[dict[str, type[Settings]]] = {"dp": PeDp}

    max_iterations: int
    votes_per_noise: float
    min_candidates_per_class: int
    max_candidates_per_class: int
    threshold_sigmas: float
    embedding: str
    variation_start: float
    variation_end: float
    final_per_class: int
    sample_steps: int
    eta: float
    seed: int
    dpdm_share: float | None = optional()
    simulator: bool | None = optional(absent=False)
    simulator_cases: str | None = optional(absent="public")
    dp: PeDp

    def unused_keys(self) -> frozenset[str]:
        """``simulator_cases`` where PE evolves a generator, not the renderer: it changes nothing there."""
        return frozenset() if self.simulator else frozenset({"simulator_cases"})


MethodSettings = TeacherSettings | DpdmSettings | StudentSettings | DpganSettings | PeSettings


def execution_only_names(cls: type[Settings]) -> dict[str, list[str]]:
    """The execution-only fields of ``cls`` and of its nested settings: {"": [...], "dp": [...]}."""
    out = {"": [f.name for f in fields(cls) if f.metadata.get(EXECUTION_ONLY)]}
    for name, nested in cls.NESTED.items():
        out[name] = [f.name for f in fields(nested) if f.metadata.get(EXECUTION_ONLY)]
    return {key: value for key, value in out.items() if value}
