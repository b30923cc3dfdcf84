"""Draw a synthetic dataset from a trained generator (teacher, non-private model or student)."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import DpsadError
from ..data.image_tensors import tensor_to_images
from ..runtime.devices import make_generator
from .solvers import SAMPLERS


def balanced_labels(num_classes: int, n_per_class: int) -> np.ndarray:
    """[0]*n + [1]*n + ... : labels balanced across classes."""
    return np.repeat(np.arange(num_classes, dtype=np.int64), n_per_class)


MAX_SYNTHETIC_IMAGES = 10_000_000  # the schema's bound on n_samples; labels of that many take 80 MB


def planned_labels(num_classes: int, settings: dict) -> tuple[np.ndarray | None, int]:
    """(labels [N] or None when unconditional, N) for the ``sample`` settings."""
    if num_classes > 0 and not settings.get("n_samples") and num_classes * settings["n_per_class"] > MAX_SYNTHETIC_IMAGES:
        raise DpsadError(f"sample.n_per_class = {settings['n_per_class']} for {num_classes} classes makes "
                         f"{num_classes * settings['n_per_class']} images, expected at most {MAX_SYNTHETIC_IMAGES} "
                         "(lower n_per_class, or set n_samples)")
    if num_classes > 0:
        per_class = settings["n_per_class"]
        if settings.get("n_samples"):  # only as many per class as n_samples needs
            per_class = min(per_class, -(-settings["n_samples"] // num_classes))
        labels = balanced_labels(num_classes, per_class)
        if settings.get("n_samples"):
            labels = np.resize(labels, settings["n_samples"])
        return labels, len(labels)
    return None, int(settings.get("n_samples") or settings["n_per_class"] * 10)


class SampleStream:
    """Batches of samples drawn on demand: ``total`` images of ``image_shape`` [H,W,C].

    Iterating yields (images uint8 [b,H,W,C], labels int64 [b] or None); only one
    batch is in memory at a time, so a writer can stream 60,000 images to disk.
    """

    def __init__(self, total: int, image_shape: tuple[int, int, int], labelled: bool, batches):
        self.total, self.image_shape, self.labelled = total, image_shape, labelled
        self._batches = batches

    def __iter__(self):
        return iter(self._batches)

    def collect(self) -> tuple[np.ndarray, np.ndarray | None]:
        """All samples at once: (uint8 [N,H,W,C], labels [N] or None)."""
        parts = list(self)
        images = np.concatenate([b for b, _ in parts]) if parts else np.zeros((0,) + self.image_shape, np.uint8)
        labels = np.concatenate([lab for _, lab in parts]) if self.labelled and parts else None
        return images, labels


def diffusion_stream(model, diffusion, *, num_classes: int, settings: dict, device: torch.device,
                     progress: bool = True) -> SampleStream:
    """A :class:`SampleStream` of a diffusion model per the ``sample`` settings."""
    if settings["sampler"] not in SAMPLERS:
        raise DpsadError(f"sampler '{settings['sampler']}', expected one of {', '.join(SAMPLERS)}")
    labels, total = planned_labels(num_classes, settings)
    cfg = model.config
    batch = settings["batch_size"]

    def batches():
        gen = make_generator(settings["seed"], device)
        for start in tqdm(range(0, total, batch), desc=f"sample ({settings['sampler']})", disable=not progress):
            size = min(batch, total - start)
            y = (torch.from_numpy(labels[start:start + size]) if labels is not None
                 else torch.full((size,), model.null_class, dtype=torch.long)).to(device)
            shape = (size, cfg.in_channels, cfg.image_size, cfg.image_size)
            kwargs = {"guidance": settings["guidance"] if num_classes > 0 else 0.0, "generator": gen}
            if settings["sampler"] == "ddim":
                kwargs.update(steps=settings["steps"], eta=settings["eta"])
            elif settings["sampler"] == "dpmpp_2m":
                kwargs.update(steps=settings["steps"])
            x = SAMPLERS[settings["sampler"]](model, diffusion, shape, y, **kwargs)
            yield tensor_to_images(x), (labels[start:start + size] if labels is not None else None)

    return SampleStream(total, (cfg.image_size, cfg.image_size, cfg.in_channels), labels is not None, batches())


def gan_stream(generator, *, settings: dict, device: torch.device) -> SampleStream:
    """A :class:`SampleStream` of a GAN generator with the label layout of :func:`diffusion_stream`."""
    labels, total = planned_labels(generator.config.num_classes, settings)
    batch = settings["batch_size"]

    @torch.no_grad()
    def batches():
        gen = make_generator(settings["seed"], device)
        for start in range(0, total, batch):
            size = min(batch, total - start)
            y = (torch.from_numpy(labels[start:start + size]) if labels is not None
                 else torch.zeros(size, dtype=torch.long)).to(device)
            z = torch.randn(size, generator.config.latent_dim, generator=gen, device=device)
            yield tensor_to_images(generator(z, y)), (labels[start:start + size] if labels is not None else None)

    cfg = generator.config
    return SampleStream(total, (cfg.image_size, cfg.image_size, cfg.in_channels), labels is not None, batches())


def population_stream(state: dict, *, settings: dict) -> SampleStream:
    """A :class:`SampleStream` of a Private Evolution population: per class, its first images in order (at most as
    many as the population holds), with the label layout of :func:`diffusion_stream`."""
    images, population_labels = state["images"], state["labels"]
    labels, total = planned_labels(len(state["class_names"]) if state["conditional"] else 0, settings)
    classes = len(state["class_names"])
    held = len(images) if labels is None else int(np.bincount(population_labels, minlength=classes).min())
    wanted = total if labels is None else int(np.bincount(labels, minlength=classes).max())
    if wanted > held:
        raise DpsadError(f"sample asks for {wanted} images {'in all' if labels is None else 'a class'} of a Private "
                         f"Evolution population that holds {held}, expected at most {held} (raise pe.final_per_class "
                         "or lower sample.n_per_class): repeated images would count as new samples")
    if labels is None:
        order = np.resize(np.arange(len(images)), total)
    else:
        order = np.empty(total, dtype=np.int64)
        for label in np.unique(labels):
            members = np.flatnonzero(population_labels == label)
            if len(members) == 0:
                raise DpsadError(f"the population has no image of class {label}, expected every class")
            wanted = np.flatnonzero(labels == label)
            order[wanted] = np.resize(members, len(wanted))
    batch = settings["batch_size"]

    def batches():
        for start in range(0, total, batch):
            part = order[start:start + batch]
            yield images[part], (labels[start:start + batch] if labels is not None else None)

    return SampleStream(total, tuple(images.shape[1:]), labels is not None, batches())


def load_any_generator(path, device, use_ema: bool = True):
    """(stream function(settings) -> :class:`SampleStream`, class names) for a diffusion or GAN checkpoint."""
    from ..release_folder import RELEASED_DIFFUSION, RELEASED_GAN
    from ..training.checkpoints import load_checkpoint

    kind = load_checkpoint(path, map_location="cpu").get("kind")
    if kind in (RELEASED_DIFFUSION, RELEASED_GAN):
        return load_released_generator(path, device)
    if kind == "pe_population":
        state = load_checkpoint(path, map_location="cpu")
        return (lambda settings: population_stream(state, settings=settings)), state.get("class_names", [])
    if kind == "dpgan":
        from ..gan.train import load_gan_generator

        generator, state = load_gan_generator(path, device)
        return (lambda settings: gan_stream(generator, settings=settings, device=device)), state.get("class_names", [])
    from ..training.diffusion_training import load_diffusion_model

    model, diffusion, state = load_diffusion_model(path, device, use_ema=use_ema)
    return (lambda settings: diffusion_stream(model, diffusion, num_classes=model.config.num_classes, settings=settings,
                                              device=device)), state.get("class_names", [])


def load_released_generator(path, device):
    """(sample function, class names) for a release's ``generator.pt`` (weights and model config only)."""
    from ..diffusion import DiffusionConfig, GaussianDiffusion
    from ..gan.models import GANConfig, Generator
    from ..models.unet import UNet, UNetConfig
    from ..release_folder import RELEASED_GAN
    from ..training.checkpoints import load_checkpoint

    state = load_checkpoint(path, map_location=device)
    if state["kind"] == RELEASED_GAN:
        generator = Generator(GANConfig(**state["gan_config"])).to(device)
        generator.load_state_dict(state["weights"])
        generator.eval()
        return (lambda settings: gan_stream(generator, settings=settings, device=device)), state["class_names"]
    model = UNet(UNetConfig.from_dict(state["model_config"])).to(device)
    model.load_state_dict(state["weights"])
    model.eval()
    diffusion = GaussianDiffusion(DiffusionConfig(**state["diffusion_config"]))
    return (lambda settings: diffusion_stream(model, diffusion, num_classes=model.config.num_classes, settings=settings,
                                              device=device)), state["class_names"]
