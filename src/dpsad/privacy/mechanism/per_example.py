"""Per-example gradients from one batched forward and backward pass (module hooks).

:func:`~dpsad.privacy.mechanism.dpsgd.per_example_gradients` vmaps the gradient of
a one-example loss; that is general but pays for a batched convolution per
example.  Here the loss runs once on the whole batch; hooks keep each
trained layer's input a and the gradient g of the summed loss w.r.t. its
output, and each example's parameter gradient is assembled from its own rows
of (a, g): an outer product for linear layers, unfold-then-multiply for
convolutions, sums of normalised input times g for GroupNorm, a scatter for
embeddings.  The parameters' batch gradient is never formed.

Assumptions the privacy of :class:`~dpsad.privacy.mechanism.dpsgd.DPSGD` rests on,
checked where possible:

* ``batched_loss(model, *inputs)`` returns losses [N], loss i a function of
  example i alone (the same function the one-example loss computes);
* every call of the model inside it takes rows grouped by example: R = N*M
  rows, rows i*M .. i*M+M-1 belonging to example i (checked: R divisible by N);
* rows do not interact inside the model (GroupNorm, no BatchNorm: checked by
  the supported layer types, and once per engine against the vmap reference).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

BatchedLoss = Callable[..., torch.Tensor]
SUPPORTED_LAYERS = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.Embedding)


IntegerHighs = Callable[[nn.Module], tuple]


def per_example_from_batched(batched_loss: BatchedLoss, integer_highs: IntegerHighs | None = None) -> Callable:
    """The one-example loss ``loss(call, *example) -> scalar`` of a batched loss, for vmap and loops.

    Both forms are then one definition: the example runs as a batch of one.
    The batched form stays attached as ``.batched`` so that DP-SGD may use hooks.
    ``integer_highs(model)``: for each input, the exclusive upper end of its integer values (labels, timesteps)
    or None, so that the engines' first-call check can draw made-up integers that vary by row
    (:func:`.dpsgd.check_inputs`); without it they are all 0.
    """

    def loss(call, *example):
        return batched_loss(call, *(x.unsqueeze(0) for x in example)).squeeze(0)

    loss.batched = batched_loss
    loss.integer_highs = integer_highs
    return loss


def with_batched_form(example_loss: Callable, batched_loss: BatchedLoss) -> Callable:
    """Attach a separately written batched form to ``example_loss`` (tests of the hooks' self-check use this)."""
    example_loss.batched = batched_loss
    return example_loss


def trained_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules that own trainable parameters directly, with their names."""
    return [(name, module) for name, module in model.named_modules()
            if any(p.requires_grad for p in module.parameters(recurse=False))]


def unsupported_layers(model: nn.Module) -> list[str]:
    """Trained modules the hooks cannot handle (empty list: hooks apply)."""
    bad = []
    for name, module in trained_layers(model):
        if not isinstance(module, SUPPORTED_LAYERS):
            bad.append(f"{name or 'model'} ({type(module).__name__})")
        elif isinstance(module, nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"
                                                or isinstance(module.padding, str)):
            bad.append(f"{name} (Conv2d with groups, non-zero or string padding)")
        elif isinstance(module, nn.Embedding) and (module.padding_idx is not None or module.max_norm is not None):
            bad.append(f"{name} (Embedding with padding_idx or max_norm)")
    return bad


LayerCalls = list[tuple[str, nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]]


def layer_calls(model: nn.Module, batched_loss: BatchedLoss, inputs: tuple[torch.Tensor, ...],
                autocast_bf16: bool = False) -> LayerCalls:
    """One batched forward and backward of ``batched_loss``: for each trained layer (name, module), the input a
    and the output gradient g of the summed loss of each of its calls, fp32 (floating inputs) and detached.

    Rows are checked to be grouped by example (a multiple of N rows each call).  ``autocast_bf16``: the forward
    pass runs under bf16 autocast; a and g are cast to fp32 before any per-example product."""
    n = int(inputs[0].shape[0])
    layers = trained_layers(model)
    records: dict[nn.Module, list] = {module: [] for _, module in layers}

    def keep(module, args, output):
        records[module].append((args[0].detach(), output))

    handles = [module.register_forward_hook(keep) for _, module in layers]
    try:
        device_type = inputs[0].device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast_bf16):
            losses = batched_loss(model, *inputs)
        losses = losses.float()
    finally:
        for handle in handles:
            handle.remove()
    if losses.shape != (n,):
        raise ValueError(f"batched loss has shape {tuple(losses.shape)}, expected ({n},): one loss per example")
    outputs = [out for module in records for _, out in records[module]]
    out_grads = iter(torch.autograd.grad(losses.sum(), outputs, allow_unused=True))
    calls: LayerCalls = []
    for prefix, module in layers:
        pairs = []
        for activation, output in records[module]:
            g = next(out_grads)
            g = torch.zeros_like(output) if g is None else g
            if activation.shape[0] % n:
                raise ValueError(f"layer {prefix} saw {activation.shape[0]} rows for {n} examples, expected a multiple "
                                 "(rows grouped by example)")
            pairs.append((activation.float() if activation.is_floating_point() else activation, g.detach().float()))
        calls.append((prefix, module, pairs))
    return calls


def parameter_name(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def layer_gradients(module: nn.Module, pairs: list[tuple[torch.Tensor, torch.Tensor]], n: int,
                    skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Per-example gradients of one layer over all its calls: {trained parameter name: [N, *shape]}, but for the
    parameters named in ``skip``."""
    per_param: dict[str, torch.Tensor] = {}
    skip = skip + tuple(pname for pname, p in module.named_parameters(recurse=False) if not p.requires_grad)
    for activation, g in pairs:
        for pname, value in _layer_gradients(module, activation, g, n, skip).items():
            per_param[pname] = per_param[pname] + value if pname in per_param else value
    out = {}
    for pname, param in module.named_parameters(recurse=False):
        if param.requires_grad and pname not in skip:
            # not .get(pname, zeros): its default would be built (and zero-filled) for every parameter
            out[pname] = per_param[pname] if pname in per_param else torch.zeros(
                (n,) + tuple(param.shape), device=param.device, dtype=param.dtype)
    return out


def hook_per_example_gradients(model: nn.Module, batched_loss: BatchedLoss, inputs: tuple[torch.Tensor, ...],
                               autocast_bf16: bool = False) -> dict[str, torch.Tensor]:
    """Per-example gradients of ``batched_loss`` w.r.t. the trainable parameters: name -> [N, *param.shape] (fp32).

    ``autocast_bf16``: the forward pass runs under bf16 autocast; activations and
    output gradients are cast to fp32 before the per-example products.
    """
    n = int(inputs[0].shape[0])
    result: dict[str, torch.Tensor] = {}
    for prefix, module, pairs in layer_calls(model, batched_loss, inputs, autocast_bf16):
        for pname, value in layer_gradients(module, pairs, n).items():
            result[parameter_name(prefix, pname)] = value
    return result


def _layer_gradients(module: nn.Module, a: torch.Tensor, g: torch.Tensor, n: int,
                     skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Per-example gradients of one layer call: input a [N*M, ...], output gradient g [N*M, ...] -> {param: [N, ...]}
    (a linear or convolution weight named in ``skip`` is not formed)."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(module, nn.Linear):
        a2, g2 = a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])
        if "weight" not in skip:
            out["weight"] = torch.bmm(g2.transpose(1, 2), a2)
        if module.bias is not None:
            out["bias"] = g2.sum(dim=1)
    elif isinstance(module, nn.Conv2d):
        if "weight" not in skip:
            out["weight"] = _conv_weight_gradients(module, a, g, n)
        if module.bias is not None:
            out["bias"] = g.reshape(n, -1, g.shape[1], g[0, 0].numel()).sum(dim=(1, 3))
    elif isinstance(module, nn.GroupNorm):
        normalised = F.group_norm(a, module.num_groups, eps=module.eps)
        channels = a.shape[1]
        if module.weight is not None:
            out["weight"] = (normalised * g).reshape(n, -1, channels, normalised[0, 0].numel()).sum(dim=(1, 3))
        if module.bias is not None:
            out["bias"] = g.reshape(n, -1, channels, g[0, 0].numel()).sum(dim=(1, 3))
    elif isinstance(module, nn.Embedding):
        idx = a.reshape(n, -1)
        g2 = g.reshape(n, idx.shape[1], module.embedding_dim)
        weight = torch.zeros((n,) + tuple(module.weight.shape), device=g.device, dtype=g.dtype)
        out["weight"] = weight.scatter_add_(1, idx[..., None].expand(-1, -1, module.embedding_dim), g2)
    else:  # guarded by unsupported_layers
        raise TypeError(f"no per-example gradient rule for {type(module).__name__}")
    return out


def conv_engine(device: torch.device, rows_per_example: int) -> str:
    """Which per-example Conv2d weight gradient runs: ``opacus`` (Opacus's own grad sampler, im2col then one
    product per row) on accelerators, where no timing of this project's kernels stands beside Opacus's;
    ``im2col`` there too when an example has several rows (the product then also sums them, without Opacus's
    per-row [N*M, ...] gradients); ``grouped`` on the CPU, where the convolution's own weight gradient with the
    examples as groups ran 1.5-9x faster than im2col on the demo's larger maps (benchmarks/bench_conv_gradients.py)."""
    if device.type == "cpu":
        return "grouped"
    return "opacus" if rows_per_example == 1 else "im2col"


def _conv_weight_gradients(conv: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, n: int) -> torch.Tensor:
    """Per-example Conv2d weight gradients: a [N*M, I, H, W], g [N*M, O, Ho, Wo] -> [N, O, I, kh, kw].

    By :func:`conv_engine`: Opacus's grad sampler; ``F.unfold`` (im2col) with one batched product; or
    :func:`_grouped_convolution_gradients`, where the output map has at least 64 positions and the kernel is
    larger than 1x1: smaller maps and 1x1 kernels took im2col faster (benchmarks/bench_conv_gradients.py).
    """
    rows, channels_out, ho, wo = g.shape
    m = rows // n
    engine = conv_engine(g.device, m)
    if engine == "opacus" and conv.weight.requires_grad:  # Opacus skips a frozen weight
        from opacus.grad_sample.conv import compute_conv_grad_sample

        return compute_conv_grad_sample(conv, [a], g)[conv.weight].reshape(n, *conv.weight.shape)
    if engine == "grouped" and conv.kernel_size != (1, 1) and ho * wo >= 64:
        return _grouped_convolution_gradients(conv, a, g, n)
    g2 = g.reshape(n, m, channels_out, ho * wo).transpose(1, 2).reshape(n, channels_out, m * ho * wo)
    cols = F.unfold(a, conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride)
    d = cols.shape[1]
    cols = cols.reshape(n, m, d, ho * wo).transpose(1, 2).reshape(n, d, m * ho * wo)
    return torch.bmm(g2, cols.transpose(1, 2)).reshape(n, *conv.weight.shape)


def _grouped_convolution_gradients(conv: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, n: int) -> torch.Tensor:
    """Per-example weight gradients as one grouped convolution's weight gradient: the N examples side by side as
    N groups of channels (input [M, N*I, H, W], output gradient [M, N*O, Ho, Wo]), so group i's weight gradient,
    [O, I, kh, kw], is example i's, summed over its M rows by the convolution itself."""
    rows, channels_out, ho, wo = g.shape
    m, channels_in = rows // n, a.shape[1]
    x = a.reshape(n, m, channels_in, *a.shape[2:]).transpose(0, 1).reshape(m, n * channels_in, *a.shape[2:])
    dy = g.reshape(n, m, channels_out, ho, wo).transpose(0, 1).reshape(m, n * channels_out, ho, wo)
    weight = torch.nn.grad.conv2d_weight(x, (n * channels_out, channels_in, *conv.kernel_size), dy, stride=conv.stride,
                                         padding=conv.padding, dilation=conv.dilation, groups=n)
    return weight.reshape(n, *conv.weight.shape)
