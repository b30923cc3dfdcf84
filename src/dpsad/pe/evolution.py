"""Private Evolution: candidates from the run's teacher, one noisy vote histogram an iteration, variations of the
most-voted candidates; the last iteration's variations are the synthetic set.

Privacy (see :mod:`dpsad.privacy.mechanism.histogram` for the mechanism and its assumptions): the private records are read
in exactly one place, the votes, whose counts leave only through :func:`noisy_histogram`.  The teacher (the run's
generator) is public or a DP training, such as the run's own DPDM model (``pe.dpdm_share``), whose spending is an
upstream component of the plan and of the ledger written here; the embedding is fixed by it (``pixels``: the
image itself; ``teacher``: the teacher's encoder features), the candidates come from it, and which candidates are
varied is post-processing of the noisy counts.
"""

from __future__ import annotations

import csv
from dataclasses import asdict

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.datafile import PreparedData
from ..errors import DpsadError, PrivacyError
from ..files.artifacts import save_torch
from ..moco.teacher_features import teacher_features
from ..privacy import accounting
from ..privacy.mechanism.histogram import nearest_votes, noisy_histogram, plan_pe, selection_weights
from ..privacy.books.ledger import components_of, make_entry, read_ledgers, write_ledger
from ..privacy.books.preparation import stamped
from ..privacy.mechanism.dpsgd import dp_generators
from ..privacy.mechanism.precision import full_precision
from ..training.diffusion_training import load_diffusion_model, training_data
from ..data.image_tensors import tensor_to_images
from ..runtime.devices import make_generator
from .variation import generate

PE_KIND = "pe_population"
EMBEDDINGS = ("pixels", "teacher")


def embedder(kind: str, teacher_path, device):
    """(images [N,C,H,W] in [-1, 1], alone) -> features float64 [N, D], a fixed public function of each image:
    the image itself (``pixels``) or the public teacher's encoder features (``teacher``, those k-means can use).

    ``alone``: compute each image's features in a batch of its own, so that they cannot depend, even in the last
    bit, on which other images share its batch (a kernel's rounding can change with the batch): the private
    records' features must not move when another record is added or removed."""
    if kind == "pixels":
        return lambda x, alone=False: x.flatten(1).double().cpu()
    if kind != "teacher":
        raise DpsadError(f"pe.embedding = {kind!r}, expected one of {', '.join(EMBEDDINGS)}")

    def features(x, alone=False):
        with full_precision():
            found = teacher_features(tensor_to_images(x), teacher_path, device, batch=1 if alone else 500)
        return torch.from_numpy(found).double()

    return features


def per_class_draw(weights: torch.Tensor, labels: torch.Tensor, classes: int, size: int,
                   generator: torch.Generator) -> torch.Tensor:
    """Indices [classes x size]: ``size`` draws with replacement per class, by ``weights`` within the class."""
    chosen = []
    for label in range(classes):
        members = torch.nonzero(labels == label).flatten()
        picks = torch.multinomial(weights[members].float(), size, replacement=True, generator=generator)
        chosen.append(members[picks])
    return torch.cat(chosen)


def private_evolution(*, data: PreparedData, settings: dict, labels_mode, teacher_path, device, out_path, ledger_path,
                      votes_csv, upstream_ledgers: list[str], log, pseudo_labels: str | None = None) -> dict:
    """Run Private Evolution per ``settings`` (the ``pe`` section with the run's target and delta) and write the
    population checkpoint ``out_path`` (kind ``pe_population``: uint8 images [N,H,W,C], labels [N]), its ledger and
    one row an iteration in ``votes_csv``.  Returns the ledger entry."""
    private = training_data(data, "private", labels_mode, "cpu", pseudo_labels)
    model, diffusion, _ = load_diffusion_model(teacher_path, device, use_ema=True)
    conditional = private.num_classes > 0
    if conditional and model.config.num_classes != private.num_classes:
        raise DpsadError(f"the teacher {teacher_path} is conditioned on {model.config.num_classes} classes but the run "
                         f"has {private.num_classes}, expected a teacher of the run's labels")
    classes, n = max(private.num_classes, 1), private.n
    target, delta = float(settings["target_epsilon"]), float(settings["delta"])
    if problem := accounting.delta_problem(delta, n):
        raise PrivacyError(f"{problem}, expected a smaller delta")
    plan = plan_pe(n, classes, target, delta, max_iterations=int(settings["max_iterations"]),
                   votes_per_noise=float(settings["votes_per_noise"]),
                   min_candidates_per_class=int(settings["min_candidates_per_class"]),
                   max_candidates_per_class=int(settings["max_candidates_per_class"]),
                   threshold_sigmas=float(settings["threshold_sigmas"]), accountant=settings["dp"]["accountant"],
                   fixed=components_of(read_ledgers(upstream_ledgers)))
    log.info("PE plan: n = %d, %d classes, sigma %.3f a histogram, threshold %.2f votes; %s", n, classes,
             plan.noise_multiplier, plan.threshold, plan.reason)
    randomness = dp_generators(settings["dp"]["noise_seed"])  # the histograms' noise: secret
    public_gen = make_generator(int(settings["seed"]), device)  # candidates and variations: public randomness
    choice_gen = make_generator(int(settings["seed"]) + 1)  # which candidates are varied (on the CPU, as the weights)
    embed = embedder(settings["embedding"], teacher_path, device)
    private_features = embed(private.x, alone=True)
    private_labels = private.y.cpu() if conditional else torch.zeros(n, dtype=torch.long)

    def model_labels(labels):
        return (labels if conditional else torch.full_like(labels, model.null_class)).to(device)

    steps, eta = int(settings["sample_steps"]), float(settings["eta"])
    labels = torch.arange(classes).repeat_interleave(plan.candidates_per_class)
    candidates = generate(model, diffusion, model_labels(labels), parents=None, strength=1.0, steps=steps, eta=eta,
                          generator=public_gen).cpu()
    strengths = np.linspace(settings["variation_start"], settings["variation_end"], plan.iterations)
    rows = []
    for iteration in tqdm(range(plan.iterations), desc="private evolution"):
        noisy = noisy_histogram(nearest_votes(private_features, private_labels, embed(candidates), labels),
                                plan.noise_multiplier, randomness.noise)
        weights = selection_weights(noisy, labels, plan.threshold)
        last = iteration == plan.iterations - 1
        size = int(settings["final_per_class"]) if last else plan.candidates_per_class
        chosen = per_class_draw(weights, labels, classes, size, choice_gen)
        labels = labels[chosen]
        candidates = generate(model, diffusion, model_labels(labels), parents=candidates[chosen],
                              strength=float(strengths[iteration]), steps=steps, eta=eta, generator=public_gen).cpu()
        rows.append({"iteration": iteration + 1, "strength": round(float(strengths[iteration]), 4),
                     "above_threshold": int((noisy >= plan.threshold).sum()), "candidates": int(len(noisy)),
                     "distinct_parents": int(chosen.unique().numel())})
        log.info("iteration %d: %d of %d candidates above the threshold, %d distinct parents, strength %.2f",
                 *(rows[-1][k] for k in ("iteration", "above_threshold", "candidates", "distinct_parents", "strength")))
    entry = make_entry(stage="private_evolution", private=True, mechanism="gaussian", sample_rate=1.0,
                       noise_multiplier=plan.noise_multiplier, steps=plan.iterations, clip_norm=1.0,
                       noise_seed=randomness.seed_kind,
                       notes=f"{plan.iterations} histograms of nearest-candidate votes ({settings['embedding']} "
                             f"embedding, {plan.candidates_per_class} candidates a class), sensitivity 1 each")
    stamped([entry], data.attrs)  # the preparation of the records the votes read
    with open(votes_csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    save_torch({"kind": PE_KIND, "images": tensor_to_images(candidates),
                "labels": labels.numpy().astype(np.int64) if conditional else None,
                "class_names": private.class_names, "conditional": conditional, "settings": settings,
                "plan": asdict(plan), "ledger": [entry]}, out_path)
    write_ledger(ledger_path, [entry], upstream=upstream_ledgers)
    return entry
