"""One audited training run: the run's own method and settings on the private split plus canaries.

The audit run is a second training run on the private data: it draws its own
secret DP noise and is accounted on its own.  It samples at the released run's
q = B/n (n without the canaries), so its steps and calibrated noise are the
released run's whatever number of canaries were drawn in.
Its model never leaves the temporary folder; ``audit.json`` holds the canary
scores' summary, the bound and the audit run's accounted epsilon.  The file is
for the curator: it is computed on private records (through a DP mechanism
whose budget is not part of any release's ledger).

Scores (higher: more likely "in"):

* diffusion models (dpsad, dpdm): the fall of the canary's denoising loss,
  ``loss_reference - loss_trained``, over the same fixed (t, noise) draws; the
  reference is the run's public teacher (dpsad), the teacher a warm-started
  dpdm starts from, or nothing (dpdm trained from scratch: the canaries are
  alike, so the raw loss ranks them);
* dp-GAN: the trained critic's score of the canary (the critic is trained to
  score training records high; the generator is post-processing of it).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..data.datafile import PreparedData
from ..errors import DpsadError
from ..privacy.accounting import SGMComponent, Accountant
from ..privacy.books.ledger import read_ledgers, verdict
from ..training.diffusion_training import load_diffusion_model
from ..data.image_tensors import images_to_tensor
from .bound import epsilon_lower_bound, largest_reachable_bound
from .canaries import canary_images, draw_membership, with_canaries
from .gradient import gradient_canary_scores

AUDITABLE = ("dpsad", "dpdm", "dpgan")
WORK_PREFIX = ".audit-work-"


@torch.no_grad()
def denoising_losses(model, diffusion, x0: torch.Tensor, y: torch.Tensor, draws: int, seed: int,
                     batch_size: int = 250) -> np.ndarray:
    """Mean denoising loss per image over ``draws`` fixed (t, noise) draws.  x0 [m,C,H,W] in [-1,1], y [m] -> [m].

    The draws depend on ``seed`` and the shapes only, so two models scored
    with the same seed see exactly the same noisy inputs.
    """
    gen = torch.Generator().manual_seed(seed)
    m = x0.shape[0]
    t_all = torch.randint(diffusion.num_timesteps, (draws, m), generator=gen)
    noise_all = torch.randn((draws, m) + tuple(x0.shape[1:]), generator=gen)
    total = torch.zeros(m)
    device = x0.device
    for d in range(draws):
        for start in range(0, m, batch_size):
            sl = slice(start, start + batch_size)
            t, noise = t_all[d, sl].to(device), noise_all[d, sl].to(device)
            xt = diffusion.q_sample(x0[sl], t, noise)
            out = model(xt, t, y[sl])
            total[sl] += diffusion.output_mse(out, diffusion.target(x0[sl], xt, t, noise), t).cpu()
    return (total / draws).numpy()


@torch.no_grad()
def critic_scores(checkpoint: str, x0: torch.Tensor, y: torch.Tensor, device) -> np.ndarray:
    """The trained dp-GAN critic's scores [m] of images x0 [m,C,H,W] in [-1,1]."""
    from ..files.artifacts import load_torch
    from ..gan.models import Critic, GANConfig

    state = load_torch(checkpoint, map_location=device)
    critic = Critic(GANConfig(**state["gan_config"])).to(device)
    critic.load_state_dict(state["critic"])
    return critic.eval()(x0, y).cpu().numpy()


def _train(method: str, data: PreparedData, settings: dict, inputs: dict, params: dict, workdir: Path,
           device, log, planned_n: int) -> tuple[str, list[dict]]:
    """Train ``method`` on ``data`` with the mechanism planned for ``planned_n`` records; returns (checkpoint
    path, the audit run's own ledger entries)."""
    out, ledger = str(workdir / "model.pt"), str(workdir / "ledger.json")
    common = dict(data=data, labels_mode=params["labels"], device=device, out_path=out,
                  loss_csv=str(workdir / "loss.csv"), ledger_path=ledger, log=log,
                  pseudo_labels=inputs.get("labels"), planned_n=planned_n)
    if method == "dpsad":
        from ..training.student import train_student

        train_student(teacher_path=inputs["teacher"], upstream_ledgers=inputs["upstream_ledgers"], settings=settings,
                      **common)
    elif method == "dpdm":
        from ..training.dpdm import train_dpdm

        train_dpdm(settings=settings, diffusion_settings=params["diffusion"], stage_name="audit_dpdm",
                      init_path=inputs.get("teacher"), upstream_ledgers=inputs["upstream_ledgers"], **common)
    else:
        from ..gan.train import train_dpgan

        train_dpgan(settings=settings, upstream_ledgers=inputs["upstream_ledgers"], **common)
    upstream = {entry["uid"] for entry in read_ledgers(inputs["upstream_ledgers"]) if entry.get("uid")}
    return out, [entry for entry in read_ledgers([ledger]) if entry.get("uid") not in upstream]


def _scores(method: str, checkpoint: str, inputs: dict, x0, y, draws: int, seed: int, device) -> np.ndarray:
    if method == "dpgan":
        return critic_scores(checkpoint, x0, y, device)
    model, diffusion, _ = load_diffusion_model(checkpoint, device, use_ema=True)
    trained = denoising_losses(model, diffusion, x0, y, draws, seed)
    if inputs.get("teacher"):  # dpsad, warm-started dpdm: the fall below the starting model's loss
        teacher, _, _ = load_diffusion_model(inputs["teacher"], device, use_ema=True)
        return denoising_losses(teacher, diffusion, x0, y, draws, seed) - trained
    return -trained


def claimed_epsilon(entries: list[dict], settings: dict, delta: float) -> float | None:
    """For paper mode: the epsilon the paper's calibration claims (noise multiplier not divided by T)."""
    if settings.get("mode") != "paper":
        return None
    student = next(e for e in entries if e["stage"] == "distill_student")
    return Accountant("rdp").epsilon([SGMComponent(settings.paper_noise_multiplier, student["sample_rate"], student["steps"])], delta)


def gradient_audit(entries: list[dict], settings: dict, included: np.ndarray, n: int, log) -> dict:
    """Gradient canaries through DPSGD at the audit run's own q, steps and noise (see :mod:`.gradient`)."""
    noisy = [e for e in entries if e["private"] and e["mechanism"] == "sgm"]
    if not noisy:
        return {"computed": False, "reason": "the run has no DP-SGD entry"}
    main = noisy[0]
    batch = main.get("batch")
    shared = [e for e in noisy if batch is not None and e.get("batch") == batch] or [main]
    sigmas = [float(e["noise_multiplier"]) for e in shared]
    # Paper mode's discriminator reads the private batch without noise: an engine with sigma 0.
    sigmas += [0.0 for e in entries if e["private"] and e["mechanism"] == "none"]
    expected_batch = float(main["sample_rate"]) * n
    scores = gradient_canary_scores(included, sample_rate=float(main["sample_rate"]), steps=int(main["steps"]),
                                    noise_multipliers=sigmas, clip_norm=float(main.get("clip_norm") or 1.0),
                                    expected_batch_size=expected_batch)
    log.info("gradient canaries: noise multipliers %s, q %.5f, %d steps", sigmas, main["sample_rate"], main["steps"])
    return {"computed": True, "scores": scores, "noise_multipliers": sigmas, "sample_rate": main["sample_rate"],
            "steps": main["steps"],
            "note": ("audit of the mechanism, not of the pipeline: Dirac canaries (gradient C along one coordinate "
                     "each) through the run's DPSGD engines at its own q, steps and noise multipliers"
                     + ("; paper mode is simulated by its effective parameter-space noise sigma/T and a noise-free "
                        "discriminator, with canary gradients of norm C, the case most favourable to it"
                        if settings.get("mode") == "paper" else ""))}


def audit_run(*, method: str, data: PreparedData, run: dict, settings: dict, inputs: dict, params: dict,
              audit: dict, device, work_parent: str, log) -> dict:
    """Canaries in, one training run, scores, bounds.  Returns the ``audit.json`` content."""
    if method not in AUDITABLE:
        raise DpsadError(f"run '{run['name']}' has method '{method}', expected one of {', '.join(AUDITABLE)} to audit")
    m, seed = int(audit["canaries"]), int(audit["seed"])
    delta = float(run["delta"])
    if m * delta >= 0.1:
        raise DpsadError(f"canaries * delta = {m * delta:g}, expected well below 1 (fewer canaries or a smaller delta)")
    labels_mode = params["labels"]
    if labels_mode == "kmeans":
        raise DpsadError("the audit runs with labels: true or none, not kmeans (the canaries have no k-means labels)")
    conditional = labels_mode is True or labels_mode == "true"
    images, labels = canary_images(m, data.image_size, data.channels, data.num_classes if conditional else 0, seed)
    included = draw_membership(m, seed)
    augmented = with_canaries(data, images, labels, included)
    n = len(augmented.splits["train"])
    # The audited mechanism is the released run's: planned for the released run's n, so the same batch, q,
    # steps and calibrated noise however many canaries were drawn in (a record is still sampled with rate q).
    released_n = len(data.splits["train"])
    log.info("audit %s: %d canaries, %d in; %d training records; the DP plan of the released run's %d", run["name"],
             m, int(included.sum()), n, released_n)

    Path(work_parent).mkdir(parents=True, exist_ok=True)
    for stale in Path(work_parent).glob(f"{WORK_PREFIX}*"):  # left by a killed audit; it restarts from scratch
        shutil.rmtree(stale, ignore_errors=True)
        log.info("removed %s, left by an interrupted audit", stale)
    with tempfile.TemporaryDirectory(dir=work_parent, prefix=WORK_PREFIX) as tmp:
        checkpoint, entries = _train(method, augmented, settings, inputs, params, Path(tmp), device, log, released_n)
        x0 = images_to_tensor(images).to(device)
        y = torch.from_numpy(labels).to(device)
        scores = _scores(method, checkpoint, inputs, x0, y, int(audit["score_draws"]), seed + 2, device)

    upstream = read_ledgers(inputs["upstream_ledgers"])
    account = verdict(upstream + entries, delta=delta, accountant=settings.dp.accountant, target_epsilon=None,
                      num_private_records=n)
    bound = epsilon_lower_bound(scores, included, delta, alpha=float(audit["alpha"]))
    result = {
        "run": run["name"], "method": method, "mode": settings.get("mode", "sound"),
        "canaries": m, "canaries_in": int(included.sum()), "training_records": n, "delta": delta,
        "alpha": float(audit["alpha"]),
        "accounted_epsilon": account["epsilon"], "dp_guarantee": account["dp_guarantee"],
        "reasons": account["reasons"],
        "claimed_epsilon": claimed_epsilon(entries, settings, delta),
        "eps_lower_bound": bound.epsilon_lb, "bound": bound.to_dict(),
        "largest_reachable_lower_bound": largest_reachable_bound(included, delta, float(audit["alpha"])),
        "score": ("critic score" if method == "dpgan" else
                  "teacher loss - trained loss" if inputs.get("teacher") else "minus trained loss"),
        "score_draws": int(audit["score_draws"]),
        "mean_score_in": float(scores[included].mean()), "mean_score_out": float(scores[~included].mean()),
        "scores": [round(float(v), 6) for v in scores], "included": [bool(v) for v in included],
        "components": entries,
        "scope": ("curator only: a second training run on the private records plus canaries; its DP budget is "
                  "not part of any release's ledger"),
    }
    if audit["gradient_canaries"]:
        grad = gradient_audit(entries, settings, included, n, log)
        if grad.pop("computed"):
            gscores = grad.pop("scores")
            grad["eps_lower_bound"] = epsilon_lower_bound(gscores, included, delta, alpha=float(audit["alpha"])).epsilon_lb
        result["mechanism_audit"] = grad
    return result
