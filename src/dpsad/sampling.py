"""Draw a synthetic dataset from a trained generator (teacher, non-private model or student)."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from .errors import DpsadError
from .samplers import SAMPLERS
from .utils import make_generator, tensor_to_images


def balanced_labels(num_classes: int, n_per_class: int) -> np.ndarray:
    """[0]*n + [1]*n + ... : labels balanced across classes."""
    return np.repeat(np.arange(num_classes, dtype=np.int64), n_per_class)


def generate(model, diffusion, *, num_classes: int, settings: dict, device: torch.device, progress: bool = True):
    """Return (images uint8 [N,H,W,C], labels int64 [N] or None) per the ``sample`` settings."""
    if settings["sampler"] not in SAMPLERS:
        raise DpsadError(f"sampler '{settings['sampler']}', expected one of {', '.join(SAMPLERS)}")
    if num_classes > 0:
        labels = balanced_labels(num_classes, settings["n_per_class"])
        if settings.get("n_samples"):
            labels = np.resize(labels, settings["n_samples"])
    else:
        labels = None
    total = len(labels) if labels is not None else int(settings.get("n_samples") or settings["n_per_class"] * 10)
    cfg = model.config
    gen = make_generator(settings["seed"], device)
    chunks = []
    batch = settings["batch_size"]
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
        chunks.append(tensor_to_images(x))
    return np.concatenate(chunks), labels


@torch.no_grad()
def generate_gan(generator, *, settings: dict, device: torch.device):
    """Samples of a GAN generator with the same label layout as :func:`generate`.  -> (uint8 [N,H,W,C], labels or None)."""
    num_classes = generator.config.num_classes
    if num_classes > 0:
        labels = balanced_labels(num_classes, settings["n_per_class"])
        if settings.get("n_samples"):
            labels = np.resize(labels, settings["n_samples"])
        total = len(labels)
    else:
        labels = None
        total = int(settings.get("n_samples") or settings["n_per_class"] * 10)
    gen = make_generator(settings["seed"], device)
    chunks = []
    for start in range(0, total, settings["batch_size"]):
        size = min(settings["batch_size"], total - start)
        y = (torch.from_numpy(labels[start:start + size]) if labels is not None else torch.zeros(size, dtype=torch.long)).to(device)
        z = torch.randn(size, generator.config.latent_dim, generator=gen, device=device)
        chunks.append(tensor_to_images(generator(z, y)))
    return np.concatenate(chunks), labels


def load_any_generator(path, device, use_ema: bool = True):
    """(sample function(settings) -> (images, labels), class names) for a diffusion or GAN checkpoint."""
    from .release import RELEASED_DIFFUSION, RELEASED_GAN
    from .training.common import load_checkpoint

    kind = load_checkpoint(path, map_location="cpu").get("kind")
    if kind in (RELEASED_DIFFUSION, RELEASED_GAN):
        return load_released_generator(path, device)
    if kind == "dpgan":
        from .gan.train import load_gan_generator

        generator, state = load_gan_generator(path, device)
        return (lambda settings: generate_gan(generator, settings=settings, device=device)), state.get("class_names", [])
    from .training.teacher import load_diffusion_model

    model, diffusion, state = load_diffusion_model(path, device, use_ema=use_ema)
    return (lambda settings: generate(model, diffusion, num_classes=model.config.num_classes, settings=settings,
                                      device=device)), state.get("class_names", [])


def load_released_generator(path, device):
    """(sample function, class names) for a release's ``generator.pt`` (weights and model config only)."""
    from .diffusion import DiffusionConfig, GaussianDiffusion
    from .gan.models import GANConfig, Generator
    from .models.unet import UNet, UNetConfig
    from .release import RELEASED_GAN
    from .training.common import load_checkpoint

    state = load_checkpoint(path, map_location=device)
    if state["kind"] == RELEASED_GAN:
        generator = Generator(GANConfig(**state["gan_config"])).to(device)
        generator.load_state_dict(state["weights"])
        generator.eval()
        return (lambda settings: generate_gan(generator, settings=settings, device=device)), state["class_names"]
    model = UNet(UNetConfig.from_dict(state["model_config"])).to(device)
    model.load_state_dict(state["weights"])
    model.eval()
    diffusion = GaussianDiffusion(DiffusionConfig(**state["diffusion_config"]))
    return (lambda settings: generate(model, diffusion, num_classes=model.config.num_classes, settings=settings,
                                      device=device)), state["class_names"]
