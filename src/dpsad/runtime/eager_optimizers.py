"""torch's optimizers without the wrappers that exist for ``torch.compile``.

torch wraps ``step`` of its optimizers in a function that marks graph breaks for the compiler, and
``add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` in ``torch._disable_dynamo``; the first
call of either imports ``torch._dynamo``, 1.06 s of a process on 2 cores.  This pipeline never compiles.
:func:`eager` gives a subclass whose methods call torch's own functions under those two wrappers, with the gradient
mode ``step``'s wrapper sets, so each update computes exactly what torch's class computes, its ``state_dict`` is
torch's, and its step hooks and profiler label are torch's (``Optimizer.__init__`` wraps the subclass's ``step``
in them as it does torch's).

Who gains: the jobs that compute no per-example gradient (the teachers without DP, MoCo, the classifiers of
``evaluate``): 14 of the tiny run's 20 training jobs.  A DP training still imports ``torch._dynamo``, from
``torch.func``, which forms its per-example gradients.

Assumption: nothing calls ``torch.compile`` on these optimizers.  Only wrappers whose code is one of the two above
are taken off; on a torch whose wrappers differ, the method stays torch's: slower to start, the same result.
"""

from __future__ import annotations

from functools import cache

import torch
from torch.optim import optimizer as torch_optimizer

UNWRAPPED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _probe() -> None:
    return None


# The code objects of torch's compile-only wrappers, read off wrappers of a probe function.
COMPILE_ONLY_WRAPPERS = tuple(
    getattr(make(_probe), "__code__", None)
    for make in (torch._disable_dynamo, getattr(torch_optimizer, "_use_grad_for_differentiable", lambda f: f)))


def _unwrapped(function):
    """``function`` under its compile-only wrappers; any other wrapper (one that may do work) is kept, and with it
    everything under it.  torch's step profiler wrapper, also a ``functools.wraps`` wrapper, is kept: it is put back
    on the subclass by ``Optimizer.__init__`` anyway."""
    while getattr(function, "__code__", None) in COMPILE_ONLY_WRAPPERS and hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def _step_function(optimizer_class):
    """The class's own ``step`` under its compile-only wrappers (under torch's profiler wrapper where an earlier
    optimizer of the class put one on it)."""
    step = optimizer_class.step
    if getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):  # Optimizer._patch_step_function's wrapper
        step = step.__wrapped__
    return _unwrapped(step)


@cache
def eager(optimizer_class: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """A subclass ``Eager<Name>`` of ``optimizer_class`` (``torch.optim.Adam``, ``AdamW``, ``SGD``) that never imports
    ``torch._dynamo``, built with the same arguments.  Its ``step`` is the class's ``step`` when this is first called
    for it: patch ``eager(cls).step``, not ``cls.step``, to replace it afterwards."""
    step_function = _step_function(optimizer_class)

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults["differentiable"]):  # what torch's step wrapper sets
            return step_function(self, closure)

    methods = {name: _unwrapped(getattr(optimizer_class, name)) for name in UNWRAPPED_METHODS}
    name = f"Eager{optimizer_class.__name__}"
    subclass = type(name, (optimizer_class,), {"step": step, **methods, "__module__": __name__, "__qualname__": name})
    globals()[name] = subclass  # where pickle looks a class up
    return subclass
