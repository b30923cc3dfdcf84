"""Sim-PE: Private Evolution over the public font renderer's parameters (``pe.simulator: true``).

The loop of :func:`dpsad.pe.evolution.private_evolution` with the renderer (:mod:`.font_simulator`) in the place of
the diffusion teacher: candidates are parameter sets, rendered to vote on; the most-voted are varied by moving their
parameters.  That module's loop is left as it is, not shared: its code is Private Evolution's mechanism digest, and
editing it would rerun every PE run of every workspace.

Privacy (:mod:`dpsad.privacy.mechanism.histogram` for the mechanism and its assumptions): the private records are
read in one place, the votes, whose counts leave only through :func:`noisy_histogram`; one histogram an iteration,
each record one vote (sensitivity 1), as many histograms as the plan, which is composed with the upstream ledgers.
The renderer, its parameters and their randomness are public (the run's ``pe.seed``); which candidates are varied
is post-processing of the noisy counts.  The classes must be the dataset's own labels: each is rendered as the
public source's character of the same index (with ``simulator_cases: both``, that letter in either case), a mapping
fixed before any record is read.
"""

from __future__ import annotations

import csv
from dataclasses import asdict

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.datafile import PreparedData
from ..data.font_glyphs import source_characters
from ..errors import DpsadError, PrivacyError
from ..files.artifacts import save_torch
from ..privacy import accounting
from ..privacy.books.ledger import components_of, make_entry, read_ledgers, write_ledger
from ..privacy.books.preparation import stamped
from ..privacy.mechanism.dpsgd import dp_generators
from ..privacy.mechanism.histogram import nearest_votes, noisy_histogram, plan_pe, selection_weights
from ..training.diffusion_training import training_data
from ..data.image_tensors import tensor_to_images
from ..runtime.devices import make_generator
from .evolution import PE_KIND, embedder, per_class_draw
from .font_simulator import FontSimulator


def simulator_classes(data: PreparedData, public_source: dict | None) -> str:
    """The public source's characters, class i as ``chars[i]``; an error unless the source is a font renderer whose
    classes are the dataset's, in the same order (case aside: a and A are one class)."""
    if not public_source:
        raise DpsadError("pe.simulator: true but the dataset has no separate public source, expected data.<dataset>."
                         "public with source font_digits or font_letters")
    chars = source_characters(public_source)
    names = [str(name).lower() for name in data.class_names or []]
    if names != [char.lower() for char in chars]:
        raise DpsadError(f"pe.simulator: true but the dataset's classes {names} are not the public renderer's "
                         f"{list(chars)}, expected the same classes in the same order")
    return chars


def simulator_evolution(*, data: PreparedData, settings: dict, labels_mode, public_source: dict | None, teacher_path,
                        device, out_path, ledger_path, votes_csv, upstream_ledgers: list[str], log) -> dict:
    """Run Sim-PE per ``settings`` (the ``pe`` section with the run's target and delta) on the renderer of
    ``public_source`` (the dataset's ``public`` section) and write the population checkpoint ``out_path`` (kind
    ``pe_population``: uint8 images [N,H,W,1], labels [N]), its ledger and one row an iteration in ``votes_csv``.
    ``teacher_path``: the run's teacher (its ledger among ``upstream_ledgers``), only for ``embedding: teacher``.
    Returns the ledger entry."""
    if not (labels_mode is True or labels_mode == "true"):
        raise DpsadError(f"pe.simulator: true with labels {labels_mode!r}, expected labels: true (the renderer draws "
                         "each class's character)")
    if settings["embedding"] == "teacher" and not teacher_path:
        raise DpsadError("pe.embedding: teacher with pe.simulator: true but no teacher, expected the run's teacher")
    chars = simulator_classes(data, public_source)
    private = training_data(data, "private", labels_mode, "cpu")
    classes, n = private.num_classes, private.n
    if private.x.shape[1] != 1:
        raise DpsadError(f"pe.simulator: true with {private.x.shape[1]}-channel images, expected grey images like the "
                         "font renderer's")
    target, delta = float(settings["target_epsilon"]), float(settings["delta"])
    if problem := accounting.delta_problem(delta, n):
        raise PrivacyError(f"{problem}, expected a smaller delta")
    plan = plan_pe(n, classes, target, delta, max_iterations=int(settings["max_iterations"]),
                   votes_per_noise=float(settings["votes_per_noise"]),
                   min_candidates_per_class=int(settings["min_candidates_per_class"]),
                   max_candidates_per_class=int(settings["max_candidates_per_class"]),
                   threshold_sigmas=float(settings["threshold_sigmas"]), accountant=settings["dp"]["accountant"],
                   fixed=components_of(read_ledgers(upstream_ledgers)))
    log.info("Sim-PE plan: n = %d, %d classes, sigma %.3f a histogram, threshold %.2f votes; %s", n, classes,
             plan.noise_multiplier, plan.threshold, plan.reason)
    randomness = dp_generators(settings["dp"]["noise_seed"])  # the histograms' noise: secret
    simulator = FontSimulator(chars, private.x.shape[-1], int(settings["seed"]),  # public randomness
                              cases=settings.get("simulator_cases") or "public")
    choice_gen = make_generator(int(settings["seed"]) + 1)  # which candidates are varied (on the CPU, as the weights)
    embed = embedder(settings["embedding"], teacher_path, device)
    private_features = embed(private.x, alone=True)
    private_labels = private.y.cpu()

    labels = torch.arange(classes).repeat_interleave(plan.candidates_per_class)
    params = simulator.fresh(labels.numpy())
    candidates = simulator.render(params)
    strengths = np.linspace(settings["variation_start"], settings["variation_end"], plan.iterations)
    rows = []
    for iteration in tqdm(range(plan.iterations), desc="Sim-PE"):
        noisy = noisy_histogram(nearest_votes(private_features, private_labels, embed(candidates), labels),
                                plan.noise_multiplier, randomness.noise)
        weights = selection_weights(noisy, labels, plan.threshold)
        last = iteration == plan.iterations - 1
        size = int(settings["final_per_class"]) if last else plan.candidates_per_class
        chosen = per_class_draw(weights, labels, classes, size, choice_gen)
        labels = labels[chosen]
        params = simulator.vary(params.take(chosen.numpy()), float(strengths[iteration]))
        candidates = simulator.render(params)
        rows.append({"iteration": iteration + 1, "strength": round(float(strengths[iteration]), 4),
                     "above_threshold": int((noisy >= plan.threshold).sum()), "candidates": int(len(noisy)),
                     "distinct_parents": int(chosen.unique().numel())})
        log.info("iteration %d: %d of %d candidates above the threshold, %d distinct parents, strength %.2f",
                 *(rows[-1][k] for k in ("iteration", "above_threshold", "candidates", "distinct_parents", "strength")))
    entry = make_entry(stage="sim_pe", private=True, mechanism="gaussian", sample_rate=1.0,
                       noise_multiplier=plan.noise_multiplier, steps=plan.iterations, clip_norm=1.0,
                       noise_seed=randomness.seed_kind,
                       notes=f"{plan.iterations} histograms of nearest-candidate votes on font-renderer candidates "
                             f"(Sim-PE, {settings['embedding']} embedding, {plan.candidates_per_class} candidates a "
                             "class), sensitivity 1 each")
    stamped([entry], data.attrs)  # the preparation of the records the votes read
    with open(votes_csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    glyphs = "".join(simulator.glyphs[label][form] for label, form in zip(params.labels, params.form))
    save_torch({"kind": PE_KIND, "images": tensor_to_images(candidates), "labels": labels.numpy().astype(np.int64),
                "glyphs": glyphs,  # each image's character (with both cases, the case the votes chose)
                "class_names": private.class_names, "conditional": True, "settings": settings,
                "plan": asdict(plan), "ledger": [entry]}, out_path)
    write_ledger(ledger_path, [entry], upstream=upstream_ledgers)
    return entry
