"""Train MoCo on one split and extract backbone features for every split."""

from __future__ import annotations

import json

import numpy as np
import torch
from tqdm.auto import tqdm

from ..files.artifacts import create_hdf5, load_torch, save_torch
from ..files.atomic import atomic_path
from ..data.datafile import SPLITS, PreparedData, split_group
from ..errors import DpsadError
from ..privacy.books.ledger import make_entry, write_ledger
from ..privacy.books.preparation import RECORDS_ID, records_id_of, stamped
from ..privacy.books.public_preparation import stamped_public
from ..training.checkpoints import LossLog
from ..data.image_tensors import images_to_tensor
from ..runtime.devices import make_generator
from ..runtime.eager_optimizers import eager
from .augment import two_views
from .model import MoCo


def train_moco(data: PreparedData, settings: dict, device, out_path, ledger_path, loss_csv, log) -> None:
    """MoCo v2 on ``settings['split']`` (public by default).  Writes the encoder and a ledger entry.

    Training on the private split reads private records without noise: its
    ledger entry then makes every run that uses these labels
    ``dp_guarantee: false``.  ``label_weight`` > 0 also reads the split's
    labels (the public split's are public data); on a split without labels
    it is ignored, with a warning.
    """
    split = settings["split"]
    images = data.splits[split_group(split)].images
    if len(images) < 2:
        raise DpsadError(f"MoCo needs at least 2 images in the {split} split, found {len(images)}")
    label_weight = float(settings["label_weight"])
    labels = data.splits[split_group(split)].labels
    if label_weight > 0 and labels is None:  # unlabelled data runs on k-means labels with any configuration
        log.warning("train_moco: moco.label_weight = %g, but the %s split has no labels: training plain MoCo",
                    label_weight, split)
        label_weight = 0.0
    torch.manual_seed(settings["seed"])
    batch = min(settings["batch_size"], len(images))
    if batch < settings["batch_size"]:
        log.warning("train_moco: batch_size %d is larger than the %d images of the %s split; using %d",
                    settings["batch_size"], len(images), split, batch)
    # A queue longer than the images outside the batch would hold keys of the query's own image as negatives.
    queue = max(1, min(settings["queue_size"], len(images) - batch))
    if queue < settings["queue_size"]:
        log.warning("train_moco: queue_size %d is not below the %d images of the %s split minus a batch; using %d",
                    settings["queue_size"], len(images), split, queue)
    widths = tuple(settings["widths"])
    model = MoCo(images.shape[-1], settings["feature_dim"], queue, settings["momentum"], settings["temperature"],
                 widths=widths, pooling=settings["pooling"]).to(device)
    if settings["optimizer"] == "sgd":  # MoCo v2's choice for long ImageNet runs
        opt = eager(torch.optim.SGD)(model.query.parameters(), lr=settings["lr"], momentum=0.9, weight_decay=1e-4)
    else:  # learns in the few hundred steps a small public split affords (docs/methods.md, the MoCo levers)
        opt = eager(torch.optim.AdamW)(model.query.parameters(), lr=settings["lr"], weight_decay=1e-4)
    steps_per_epoch = max(1, len(images) // batch)
    total = settings["epochs"] * steps_per_epoch
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total)
    x = images_to_tensor(images)
    gen = make_generator(settings["seed"])
    losses = LossLog()
    y = torch.as_tensor(labels, dtype=torch.long) if label_weight > 0 else None
    log.info("MoCo: %d images (%s split), %d steps, queue %d, label weight %g", len(images), split, total,
             settings["queue_size"], label_weight)
    step = 0
    for _ in tqdm(range(settings["epochs"]), desc="train_moco"):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, steps_per_epoch * batch, batch):
            idx = order[start:start + batch]
            view_q, view_k = two_views(x[idx], gen, settings["augment"])
            batch_labels = None if y is None else y[idx].to(device)
            loss = model(view_q.to(device), view_k.to(device), batch_labels, label_weight).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 10 == 0 or step == total:  # the last step too: loss.csv is never empty
                losses.add(step=step, loss=float(loss.detach()))
    losses.write_csv(loss_csv)
    entry = make_entry(stage="train_moco", private=split == "private", mechanism="none", steps=step,
                       notes=f"MoCo trained without noise on the {split} split" + (" and its labels" if label_weight > 0 else ""))
    stamped_public(stamped([entry], data.attrs), data.attrs)
    state = {"query": model.query.state_dict(), "in_channels": images.shape[-1], "widths": list(widths),
             "pooling": settings["pooling"], "feature_dim": settings["feature_dim"], "settings": settings, "steps": step,
             "label_weight_used": label_weight, "ledger": [entry]}  # its ledger's, checked by the stages reading it
    save_torch(state, out_path)
    write_ledger(ledger_path, [entry])


def load_encoder(encoder_path, device) -> MoCo:
    """The trained query encoder of ``train_moco`` (key encoder and queue left out), in eval mode."""
    state = load_torch(encoder_path, map_location=device)
    model = MoCo(state["in_channels"], state["feature_dim"], queue_size=1, widths=tuple(state["widths"]),
                 pooling=state.get("pooling", "mean")).to(device)  # encoders saved before pooling existed: mean
    model.query.load_state_dict(state["query"])
    return model.eval()


@torch.no_grad()
def extract_features(data: PreparedData, encoder_path, device, out_path, batch: int = 500, which: str = "head", *,
                     ledger_entries: list[dict]) -> None:
    """L2-normalised features for every split -> features.h5 (groups train/public/test, dataset ``features``).

    ``which``: ``head`` (the projection head's output, the space the contrastive loss shapes) or
    ``backbone`` (the pooled encoder features before the head).  ``ledger_entries``: those of the features'
    ledger (the encoder's), kept in attribute ``ledger`` (JSON) for the stages reading the features to check.
    The private split's records go through the encoder one at a time: a batched convolution's rounding can
    depend on the batch-mates, and a record's label, and so its loss in every DP training, must depend on that
    record alone.
    """
    model = load_encoder(encoder_path, device)
    net = model.query if which == "head" else model.backbone
    with atomic_path(out_path) as tmp:
        with create_hdf5(tmp) as handle:
            for name in SPLITS:
                x = images_to_tensor(data.splits[name].images)
                step = 1 if name == "train" else batch
                chunks = [torch.nn.functional.normalize(net(x[s:s + step].to(device)), dim=1).cpu()
                          for s in range(0, len(x), step)]
                width = model.query[-1].out_features if which == "head" else model.backbone.out_dim
                feats = torch.cat(chunks).numpy() if chunks else np.zeros((0, width), np.float32)
                handle.create_group(name).create_dataset("features", data=feats.astype(np.float32))
            handle.attrs["ledger"] = json.dumps(ledger_entries)
            if records := records_id_of(data.attrs):  # which preparation the private features describe
                handle.attrs[RECORDS_ID] = records
