"""torch's optimizers without the wrappers that exist for ``torch.compile``.

torch wraps ``Optimizer.step`` of its optimizers, and ``add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict``, in functions that mark graph breaks for a compiler; the first call of each imports
``torch._dynamo``.  That import is 1.06 s of every job that trains (20 of the tiny run's 53 jobs, 11% of its CPU
time on 2 cores), and this pipeline never compiles.  :func:`eager` gives a subclass whose methods call torch's own
functions under those wrappers, with the gradient mode ``step``'s wrapper sets, so each update computes exactly what
torch's class computes, and its ``state_dict`` is torch's.

Assumption: nothing calls ``torch.compile`` on these optimizers.  On a torch whose wrappers differ, a method that
cannot be unwrapped stays torch's wrapper: slower to start, the same result.
"""

from __future__ import annotations

from functools import cache

import torch

UNWRAPPED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _unwrapped(function):
    """The function under ``functools.wraps`` wrappers (torch's compile markers and its step profiler hook)."""
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


@cache
def eager(optimizer_class: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """A subclass of ``optimizer_class`` (``torch.optim.Adam``, ``AdamW``, ``SGD``) that never imports
    ``torch._dynamo``; built with the same arguments."""
    step_function = _unwrapped(optimizer_class.step)

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults.get("differentiable", False)):  # what torch's step wrapper sets
            return step_function(self, closure)

    methods = {name: _unwrapped(getattr(optimizer_class, name)) for name in UNWRAPPED_METHODS}
    return type(optimizer_class.__name__, (optimizer_class,), {"step": step, **methods, "__module__": __name__})
