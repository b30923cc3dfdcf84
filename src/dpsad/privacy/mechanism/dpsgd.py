"""The DP-SGD mechanism: Poisson sampling, per-example gradients, clipping, noise.

Privacy model (see docs/PRIVACY.md): a record is one training example
(image and label); adjacency is add/remove of one record.  One step of
:class:`DPSGD` is the sampled Gaussian mechanism with sampling rate q, clip
norm C and noise multiplier sigma, provided that

* the batch comes from :class:`PoissonSampler` (each record independently
  with probability q; the batch size is not fixed and may be zero);
* ``example_loss`` of record i depends on record i alone (plus data-independent
  or already-released state) -- all K noise draws of one record live inside
  its loss, before clipping;
* the gradient of that whole loss w.r.t. *all* trained parameters is clipped
  once to C in l2 (parameter space), and N(0, sigma^2 C^2 I) is added to the
  sum, once per step, before division by the *expected* batch size.

Nothing here scales the noise by the number of timesteps or noise draws.

The randomness the guarantee rests on (which records are in a batch, and the
noise) must be secret: :func:`dp_generators` seeds it from the operating
system's entropy unless a seed is fixed for tests, and then the ledger says
``noise_seed: fixed`` and the verdict is false.
"""

from __future__ import annotations

import math
import random
import secrets
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from ...errors import DpsadError, PrivacyError
from ...runtime.distributed import SINGLE
from .clipped_sum import clipped_sum
from .precision import full_precision, tf32_switches  # noqa: F401  (tf32_switches: part of this module's interface)
from .per_example import hook_per_example_gradients, unsupported_layers

PER_EXAMPLE_MODES = ("auto", "ghost", "hooks", "vmap")
# Poisson inclusion is decided on integers: a draw uniform on [0, 2^53) against floor(q 2^53), so each record's
# inclusion probability is exactly that threshold over 2^53, never above the accountant's q.  A float32 draw
# compared with q rounds q up by as much as 6e-4 of itself at q = 1e-4, above what the accountant analyses.
SAMPLING_BITS = 53
# The CPU generator (a Mersenne Twister): its 624 32-bit state words, and the size of its serialised state
MT19937_WORDS = 624
CPU_GENERATOR_STATE_BYTES = 5056
# fp32 computes a norm over a million coordinates to within a few 1e-7 of its value: clipping to C(1 - margin)
# keeps every example's contribution at most C, whatever the rounding of its norm.
CLIP_MARGIN = 1e-5
# The ghost engine sums a layer's clipped gradients by book-keeping, a product separate from the Gram matrices that
# gave the norm: its fp32 rounding (about 1e-6 of the terms' magnitudes) stands between the two, so the target
# keeps a wider margin there.  0.1% of each clipped gradient: no measurable cost in signal.
GHOST_CLIP_MARGIN = 1e-3


@dataclass
class DPRandomness:
    """The generators of one DP training run: ``sampling`` (Poisson batches and the per-example
    timesteps / diffusion noise drawn with them) and ``noise`` (the Gaussian noise of the mechanism).

    ``seed_kind`` is ``secret`` or ``fixed``, for the ledger.  Their states may
    be saved only in the resumable checkpoint (``*.resume``, deleted when the
    run ends), never in a finished artifact.
    """

    sampling: torch.Generator
    noise: torch.Generator
    seed_kind: str


def dp_generators(noise_seed: int | None, distributed=None) -> DPRandomness:
    """Generators for Poisson sampling and DP noise: each a whole state of 624 words from ``secrets``
    (:func:`generator_of_state`), unless ``noise_seed`` is set.

    With data parallelism every process must draw the same batches and the
    same noise, so the first process's secret words are broadcast to the others.
    """
    if noise_seed is None:
        words = [secrets.randbits(32) for _ in range(2 * MT19937_WORDS)]
        if distributed is not None and distributed.enabled:
            words = distributed.broadcast_ints(words)
        sampling, noise = generator_of_state(words[:MT19937_WORDS]), generator_of_state(words[MT19937_WORDS:])
        return DPRandomness(sampling=sampling, noise=noise, seed_kind="secret")
    sampling, noise = torch.Generator(), torch.Generator()
    sampling.manual_seed(int(noise_seed))
    noise.manual_seed(int(noise_seed) + 7_919)
    return DPRandomness(sampling=sampling, noise=noise, seed_kind="fixed")


def generator_of_state(words: list[int]) -> torch.Generator:
    """A CPU generator whose whole Mersenne Twister state is ``words`` (624 integers in [0, 2^32)).

    Failure prevented: ``manual_seed`` keeps only a seed's low 32 bits, so a training's batches and its noise
    would each be fixed by a 32-bit key, which a search over 2^32 replays of the training finds.  The state is
    written into the generator's own serialised form (``the_initial_seed``, ``left``, ``seeded``, ``next``, then
    the 624 words, each in 8 bytes), and a copy's first draws are checked against Python's own Mersenne Twister
    given the same words: a torch whose form differs stops here."""
    if len(words) != MT19937_WORDS or not all(0 <= w < 2 ** 32 for w in words):
        raise ValueError(f"{len(words)} state words, expected {MT19937_WORDS} integers in [0, 2^32)")
    generator = torch.Generator()
    generator.manual_seed(0)  # left = 1, seeded: the first draw twists the state written below
    state = generator.get_state()
    slots = state.view(torch.int64)
    if state.numel() != CPU_GENERATOR_STATE_BYTES or slots[3:3 + MT19937_WORDS].max() >= 2 ** 32:
        raise PrivacyError(f"this torch's CPU generator state has {state.numel()} bytes, expected "
                           f"{CPU_GENERATOR_STATE_BYTES} (a Mersenne Twister's): cannot seed it with secret words")
    slots[3:3 + MT19937_WORDS] = torch.tensor(words, dtype=torch.int64)
    generator.set_state(state)
    copy, python = torch.Generator(), random.Random()
    copy.set_state(state)
    python.setstate((3, (*words, MT19937_WORDS), None))
    # an int64 draw below 2^32 takes two words, and its value is the second
    expected = [python.getrandbits(32) for _ in range(8)][1::2]
    if torch.randint(0, 2 ** 32, (4,), generator=copy, dtype=torch.int64).tolist() != expected:
        raise PrivacyError("the CPU generator does not draw from the secret state written into it, expected the "
                           "Mersenne Twister of those words: cannot seed it")
    return generator


class PoissonSampler:
    """Poisson subsampling of ``num_records`` records at ``sample_rate`` with a seeded generator.

    Assumption: every record is included in each batch independently with
    probability at most q = sample_rate (:attr:`inclusion_probability`); the
    accountant analyses q, and a subsampled Gaussian's loss grows with its rate.
    """

    def __init__(self, num_records: int, sample_rate: float, generator: torch.Generator):
        if num_records <= 0:
            raise ValueError(f"num_records = {num_records}, expected at least one record")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate = {sample_rate}, expected a number in (0, 1]")
        if generator.device.type != "cpu":  # the exactly uniform integer draw below is the CPU generator's
            raise ValueError(f"a sampling generator on {generator.device}, expected one on the CPU")
        self.num_records = num_records
        self.sample_rate = sample_rate
        self.generator = generator
        self.threshold = math.floor(sample_rate * 2 ** SAMPLING_BITS)  # exact: scaling by a power of two

    @property
    def inclusion_probability(self) -> float:
        """Each record's exact probability of being in a batch: at most ``sample_rate``, within 2^-53 of it."""
        return self.threshold / 2 ** SAMPLING_BITS

    def sample(self) -> torch.Tensor:
        """Indices of this step's batch (int64, possibly empty)."""
        draws = torch.randint(0, 2 ** SAMPLING_BITS, (self.num_records,), generator=self.generator, dtype=torch.int64)
        return torch.nonzero(draws < self.threshold, as_tuple=False).flatten()


ExampleLoss = Callable[..., torch.Tensor]


def per_example_gradients(model: nn.Module, example_loss: ExampleLoss, inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """Gradients of ``example_loss`` for each example, w.r.t. the model's trainable parameters.

    ``example_loss(model, params, *example)`` returns a scalar for one example;
    ``example`` holds the i-th row of every tensor in ``inputs`` (leading
    dimension removed).  Returns name -> [N, *param.shape].
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def loss_of(trainable, *example):
        def call(*args, **kwargs):
            return functional_call(model, {**trainable, **frozen, **buffers}, args, kwargs)
        return example_loss(call, *example)

    grads = vmap(grad(loss_of), in_dims=(None,) + (0,) * len(inputs), randomness="error")(params, *inputs)
    return {n: grads[n] for n in names}


def clip_per_example(grads: dict[str, torch.Tensor], clip_norm: float) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Scale each example's whole gradient to l2 norm at most C.  Returns (clipped sums [param shapes], norms [N])."""
    flat = {n: g.reshape(g.shape[0], -1) for n, g in grads.items()}
    with full_precision():  # the norm and the sum from the same fp32 tensors (a TF32 sum would round them)
        norms = torch.sqrt(sum(torch.linalg.vector_norm(f, dim=1).square() for f in flat.values()))
        flat, norms = drop_non_finite(flat, norms)
        factors = (clip_norm * (1.0 - CLIP_MARGIN) / (norms + 1e-12)).clamp(max=1.0)
        # factors @ [N, P]: one pass over the per-example gradients, no [N, P] temporary
        summed = {n: (factors @ f).reshape(grads[n].shape[1:]) for n, f in flat.items()}
    return summed, norms


def drop_non_finite(flat: dict[str, torch.Tensor], norms: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Zero the whole gradient of each example whose norm is not finite; its norm becomes inf (factor 0).

    flat: name -> [N, P]; norms: [N] or [N, groups].  Clipping is then defined for every example: one record's
    NaN or overflow adds nothing instead of turning the noisy sum into NaN, which would stop the training on a
    private record's value.  Zero is a clipped gradient like any other, so the sensitivity is unchanged."""
    finite = torch.isfinite(norms) if norms.dim() == 1 else torch.isfinite(norms).all(dim=1)
    if bool(finite.all()):
        return flat, norms
    flat = {n: torch.where(finite[:, None], f, torch.zeros((), dtype=f.dtype, device=f.device)) for n, f in flat.items()}
    return flat, torch.where(finite[:, None] if norms.dim() > 1 else finite, norms, torch.full_like(norms, math.inf))


def clip_per_group(grads: dict[str, torch.Tensor], group_of: dict[str, int], bounds: list[float]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Clip each example's gradient restricted to parameter group j to l2 norm c_j (dp-GAN's grouped clipping).

    Returns (clipped sums, per-example norms [N, k]).  One example then moves
    group j of the sum by at most c_j, so its whole contribution by at most
    sqrt(sum_j c_j^2); :class:`DPSGD` adds noise calibrated to that (see ``add_noise``).
    """
    k = len(bounds)
    n = next(iter(grads.values())).shape[0]
    sq = torch.zeros(n, k, device=next(iter(grads.values())).device)
    for name, g in grads.items():
        sq[:, group_of[name]] += g.flatten(1).pow(2).sum(dim=1)
    norms = sq.sqrt()
    flat, norms = drop_non_finite({name: g.flatten(1) for name, g in grads.items()}, norms)
    factors = (torch.tensor(bounds, device=norms.device)[None] * (1.0 - CLIP_MARGIN) / (norms + 1e-12)).clamp(max=1.0)
    with full_precision():
        summed = {name: (factors[:, group_of[name]] @ f).reshape(grads[name].shape[1:]) for name, f in flat.items()}
    return summed, norms


def gaussian_noise_like(tensors: dict[str, torch.Tensor], std: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Independent N(0, std^2) noise with the shapes, dtypes and devices of ``tensors``, drawn in float64.

    Failure prevented: torch's float32 normal draws come from 24-bit uniforms, so a pair of them never lies
    beyond sqrt(48 ln 2) = 5.77 standard deviations, with a mass of 2^-24 on that edge; one example's gradient
    moves outcomes past it that no neighbouring dataset can give, far more often than delta over a model's
    coordinates.  float64's 53-bit uniforms move the edge to 8.57 and its mass to 2^-53 a pair."""
    return {
        n: (torch.randn(t.shape, generator=generator, device=generator.device, dtype=torch.float64) * std).to(
            device=t.device, dtype=t.dtype)
        for n, t in tensors.items()
    }


def check_inputs(chunk: tuple[torch.Tensor, ...], integer_highs: tuple | None = None,
                 rows: int = 3) -> tuple[torch.Tensor, ...]:
    """``rows`` made-up examples shaped as ``chunk``'s, for the engines' first-batch check.

    From a fixed seed: floating inputs uniform in [-1, 1] (the data's range), integer inputs (labels, timesteps)
    uniform below their ``integer_highs`` entry (0 where it has none), so that a loss that regroups any input
    shows.  No private value enters the check: whether it passes, and the run with it, says nothing of a record."""
    generator = torch.Generator().manual_seed(0)
    highs = tuple(integer_highs or ()) + (None,) * len(chunk)
    made = []
    for x, high in zip(chunk, highs):
        shape = (rows,) + tuple(x.shape[1:])
        if x.is_floating_point():
            values = torch.rand(shape, generator=generator) * 2 - 1
        else:  # rows differ wherever the range allows: example i's values are the drawn ones shifted by i
            drawn = torch.randint(0, int(high or 1), shape, generator=generator)
            shift = torch.arange(rows).reshape((rows,) + (1,) * (len(shape) - 1))
            values = (drawn + shift) % int(high or 1)
        made.append(values.to(dtype=x.dtype, device=x.device))
    return tuple(made)


def _not_within(diff: torch.Tensor, tolerance: torch.Tensor) -> bool:
    """Whether any ``diff`` exceeds its tolerance, a NaN counting as exceeding (``diff > tol`` is False for NaN)."""
    return bool((~(diff <= tolerance)).any())


@dataclass
class StepStats:
    batch_size: int
    mean_norm: float
    clipped_fraction: float


class DPSGD:
    """Computes the privatised gradient of one step and writes it to ``param.grad``.

    ``expected_batch_size`` = q * n: the noisy sum is divided by this fixed
    number, never by the realised batch size (which would leak it).
    """

    def __init__(self, model: nn.Module, example_loss: ExampleLoss, *, noise_multiplier: float, clip_norm: float,
                 expected_batch_size: float, noise_generator: torch.Generator, microbatch_size: int = 64,
                 group_of: dict[str, int] | None = None, group_bounds: list[float] | None = None,
                 distributed=None, per_example: str = "auto", precision: str = "fp32"):
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier = {noise_multiplier}, expected >= 0")
        if clip_norm <= 0:
            raise ValueError(f"clip_norm = {clip_norm}, expected > 0")
        if expected_batch_size <= 0:
            raise ValueError(f"expected_batch_size = {expected_batch_size}, expected > 0")
        self.model = model
        self.example_loss = example_loss
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.expected_batch_size = float(expected_batch_size)
        self.noise_generator = noise_generator
        self.microbatch_size = int(microbatch_size)
        # Grouped clipping: group_of maps each parameter to a group j with bound group_bounds[j].
        self.group_of = group_of
        self.group_bounds = list(group_bounds) if group_bounds is not None else None
        # Data parallelism: each process clips its shard; sums are all-reduced; noise is added once (same seed everywhere).
        self.distributed = distributed or SINGLE
        self.per_example = self._choose_per_example(per_example)
        if precision not in ("fp32", "bf16"):
            raise DpsadError(f"precision = '{precision}', expected fp32 or bf16")
        if precision == "bf16" and self.per_example not in ("ghost", "hooks"):
            raise DpsadError("precision = 'bf16' needs per-example gradients from hooks, expected per_example: auto, "
                             "ghost or hooks and a model of supported layers")
        # bf16: forward and backward run under autocast; the per-example gradients are formed in fp32 from
        # the saved activations and output gradients, and clipped and summed in fp32, so the bound is exact.
        self.precision = precision
        self._engine_checked = False

    def _choose_per_example(self, mode: str) -> str:
        """``auto``: where the loss has a batched form and every trained layer is supported, ``ghost`` (one batched
        pass; norms without per-example gradients where cheaper, :mod:`.clipped_sum`) on a CPU and ``hooks`` (every
        per-example gradient from the same pass) on an accelerator, the faster of the two on each in
        benchmarks/stage_throughput.py; ``vmap`` otherwise.  All three clip the same per-example gradients, but for
        an example whose norm overflows fp32 in ghost's Gram products (entries near 1e19): ghost adds zero for it."""
        if mode not in PER_EXAMPLE_MODES:
            raise DpsadError(f"per_example = '{mode}', expected one of {', '.join(PER_EXAMPLE_MODES)}")
        batched = getattr(self.example_loss, "batched", None)
        unsupported = unsupported_layers(self.model)
        if mode in ("ghost", "hooks") and (batched is None or unsupported):
            why = "the loss has no batched form" if batched is None else "unsupported layers: " + ", ".join(unsupported)
            raise DpsadError(f"per_example = '{mode}' cannot be used here ({why}), expected auto or vmap")
        if mode == "auto":
            if batched is None or unsupported:
                return "vmap"
            on_cpu = all(p.device.type == "cpu" for p in self.model.parameters())
            return "ghost" if on_cpu else "hooks"
        return mode

    def per_example_gradients(self, chunk: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """Per-example gradients of one microbatch by the chosen method: name -> [N, *shape]."""
        if self.per_example == "vmap":
            return per_example_gradients(self.model, self.example_loss, chunk)
        return hook_per_example_gradients(self.model, self.example_loss.batched, chunk,
                                          autocast_bf16=self.precision == "bf16")

    def check_engine_once(self, inputs: tuple[torch.Tensor, ...]) -> None:
        """Before the first batch, compare the ``ghost`` or ``hooks`` engine with vmap on made-up examples shaped as
        ``inputs`` (which may be empty; :func:`check_inputs`), in full fp32 whatever training uses.

        The engines rely on the batched loss grouping rows by example, a promise of the caller; a wrong grouping
        would clip the wrong quantity.  Made-up examples whose gradients are not finite, or all zero, are refused:
        NaN passes no comparison and zero passes every one.  Nothing here reads a record, so whether the check
        passes says nothing of one; it runs on the whole batch's shapes before any process takes its shard, so
        every process of a data-parallel run checks at the same step."""
        if self._engine_checked or self.per_example == "vmap":
            return
        highs = getattr(self.example_loss, "integer_highs", None)
        few = check_inputs(inputs, highs(self.model) if highs else None)
        with full_precision():
            reference = per_example_gradients(self.model, self.example_loss, few)
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in reference.values()]).square().sum(dim=0).sqrt()
        if not bool(torch.isfinite(norms).all()) or bool((norms == 0).any()):
            raise PrivacyError(f"the engines' first-batch check got gradient norms {norms.tolist()} on made-up "
                               "examples, so it cannot compare the engines; expected finite, non-zero gradients on "
                               "inputs in the data's range")
        if self.per_example == "ghost":
            self._check_ghost(few, reference)
        else:
            self._check_hooks(few, reference)
        self._engine_checked = True

    def _check_hooks(self, few: tuple[torch.Tensor, ...], reference: dict[str, torch.Tensor]) -> None:
        # Both sides in full fp32: under TF32 the two engines round differently by more than the tolerance, which
        # is kept tight enough to catch a batched loss that mixes examples.
        with full_precision():
            checked = hook_per_example_gradients(self.model, self.example_loss.batched, few)
        for name, ref in reference.items():
            diff = (checked[name] - ref).flatten(1).norm(dim=1)
            if _not_within(diff, 1e-3 * ref.flatten(1).norm(dim=1) + 1e-5):
                raise PrivacyError(f"per-example gradients from hooks differ from vmap for '{name}': "
                                   "the batched loss does not match the per-example loss, expected equal values")

    def _check_ghost(self, few: tuple[torch.Tensor, ...], reference: dict[str, torch.Tensor]) -> None:
        # Each example's norm, in order, and the clipped sum: a permutation alone leaves the sum as it is, not the norms.
        bounds = self.group_bounds or [self.clip_norm]
        with full_precision():
            checked, checked_norms = clipped_sum(self.model, self.example_loss.batched, few, bounds=bounds,
                                                 group_of=self.group_of, margin=GHOST_CLIP_MARGIN)
            scale = (1 - GHOST_CLIP_MARGIN) / (1 - CLIP_MARGIN)  # the ghost engine's target, in clip_*'s terms
            expected, expected_norms = (
                clip_per_example(reference, self.clip_norm * scale) if self.group_bounds is None
                else clip_per_group(reference, self.group_of, [b * scale for b in self.group_bounds]))
        expected_norms = expected_norms.reshape(checked_norms.shape[0], -1)
        if _not_within((checked_norms - expected_norms).abs(), 1e-3 * expected_norms + 1e-9):
            raise PrivacyError("the per-example norms of the ghost engine differ from vmap's: the batched loss does "
                               "not match the per-example loss, expected equal values")
        # Each example adds at most the bound to a parameter's sum, so fp32 rounding scales with that, not
        # with the sum's norm (which nearly vanishes when the examples' gradients cancel); a batched loss that
        # mixes examples errs by the order of a bound.
        for name, ref in expected.items():
            if not float((checked[name] - ref).norm()) <= 1e-3 * float(ref.norm()) + 1e-5 * len(few[0]) * max(bounds):
                raise PrivacyError(f"the clipped sum of the ghost engine differs from vmap's for '{name}': the "
                                   "batched loss does not match the per-example loss, expected equal values")

    @property
    def total_sensitivity(self) -> float:
        """Largest change of the clipped sum from adding or removing one record: C, or sqrt(sum c_j^2) with groups."""
        if self.group_bounds is None:
            return self.clip_norm
        return float(sum(c * c for c in self.group_bounds) ** 0.5)

    def clipped_chunk_sum(self, chunk: tuple[torch.Tensor, ...]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The ghost engine's clipped sum of one microbatch and the norms [N, groups] (:mod:`.clipped_sum`)."""
        bounds = self.group_bounds or [self.clip_norm]
        return clipped_sum(self.model, self.example_loss.batched, chunk, bounds=bounds, group_of=self.group_of,
                           margin=GHOST_CLIP_MARGIN, autocast_bf16=self.precision == "bf16")

    def clip_and_accumulate(self, inputs: tuple[torch.Tensor, ...]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Sum over the batch of per-example clipped gradients, in microbatches.  Returns (sum, norms [N])."""
        self.check_engine_once(inputs)
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        total = {n: torch.zeros_like(p) for n, p in params.items()}
        norms = []
        n = inputs[0].shape[0] if inputs else 0
        for start in range(0, n, self.microbatch_size):
            chunk = tuple(x[start:start + self.microbatch_size] for x in inputs)
            if self.per_example == "ghost":
                summed, group_norms = self.clipped_chunk_sum(chunk)
                chunk_norms = group_norms.pow(2).sum(dim=1).sqrt()
            elif self.group_bounds is None:
                summed, chunk_norms = clip_per_example(self.per_example_gradients(chunk), self.clip_norm)
            else:
                summed, group_norms = clip_per_group(self.per_example_gradients(chunk), self.group_of, self.group_bounds)
                chunk_norms = group_norms.pow(2).sum(dim=1).sqrt()
            for name in total:
                total[name] += summed[name]
            norms.append(chunk_norms)
        return total, (torch.cat(norms) if norms else torch.zeros(0))

    def add_noise(self, summed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add N(0, sigma^2 C^2) to every coordinate of the clipped sum.

        With k groups of bounds c_j, group j gets N(0, (sigma sqrt(k) c_j)^2): dividing
        group j by c_j turns the step into one with sensitivity sqrt(k) and noise
        sigma sqrt(k) in every coordinate, i.e. noise multiplier sigma.  (dp-GAN's
        paper argues "parallel composition" over groups, which does not apply:
        every group depends on the same record.)
        """
        if self.noise_multiplier == 0.0:  # no noise: also avoids 0 * inf when C is unbounded
            return summed
        if self.group_bounds is None:
            noise = gaussian_noise_like(summed, self.noise_multiplier * self.clip_norm, self.noise_generator)
            return {n: summed[n] + noise[n] for n in summed}
        k = len(self.group_bounds)
        out = {}
        for name, value in summed.items():
            std = self.noise_multiplier * (k ** 0.5) * self.group_bounds[self.group_of[name]]
            out[name] = value + gaussian_noise_like({name: value}, std, self.noise_generator)[name]
        return out

    def scale_grad(self, noisy: dict[str, torch.Tensor]) -> None:
        """Divide by the expected batch size and store as ``.grad`` for the optimiser."""
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                param.grad = noisy[name] / self.expected_batch_size

    def step_gradients(self, inputs: tuple[torch.Tensor, ...]) -> StepStats:
        """Clip, accumulate, add noise and scale for one Poisson batch (possibly empty)."""
        self.check_engine_once(inputs)
        summed, norms = self.clip_and_accumulate(self.distributed.shard(inputs))
        self.distributed.all_reduce_sum_(summed)
        self.scale_grad(self.add_noise(summed))
        count = int(norms.numel())
        return StepStats(
            batch_size=count,
            mean_norm=float(norms.mean()) if count else 0.0,
            clipped_fraction=float((norms > self.total_sensitivity).float().mean()) if count else 0.0,
        )
