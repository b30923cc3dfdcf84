"""The trainings' optimizers: torch's own updates, started without loading torch's compiler."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpsad.runtime.eager_optimizers import eager

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dpsad"


def _train(optimizer_class, options: dict, steps: int = 6, state=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    optimizer = optimizer_class(model.parameters(), **options)
    if state is not None:
        optimizer.load_state_dict(state)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    for _ in range(steps):
        model(torch.randn(8, 5)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), optimizer.state_dict()


@pytest.mark.parametrize("optimizer_class, options", [
    (torch.optim.Adam, {"lr": 1e-2, "betas": (0.5, 0.9)}),
    (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 1e-4}),
    (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 1e-4}),
])
def test_an_eager_optimizer_updates_and_resumes_exactly_as_torchs_own(optimizer_class, options):
    """Same weights bit for bit, the same state_dict, and a state written by either resumes in the other (a
    checkpoint written before the trainings used them resumes unchanged)."""
    ours, our_state = _train(eager(optimizer_class), options)
    theirs, their_state = _train(optimizer_class, options)
    assert torch.equal(ours, theirs)
    assert isinstance(eager(optimizer_class)([torch.nn.Parameter(torch.zeros(1))], **options), optimizer_class)
    for key, value in their_state["state"][0].items():
        assert torch.equal(our_state["state"][0][key], value), key
    assert torch.equal(_train(eager(optimizer_class), options, state=their_state)[0],
                       _train(optimizer_class, options, state=our_state)[0])


def test_an_eager_optimizer_runs_torchs_step_hooks_and_pickles():
    """The hooks and the profiler label torch puts around a step are there (Optimizer.__init__ wraps the subclass's
    step as it wraps torch's), and an optimizer pickles (its class is found by name)."""
    import pickle

    parameter = torch.nn.Parameter(torch.ones(2))
    optimizer = eager(torch.optim.Adam)([parameter], lr=0.1)
    seen = []
    optimizer.register_step_pre_hook(lambda *args: seen.append("pre"))
    optimizer.register_step_post_hook(lambda *args: seen.append("post"))
    parameter.sum().backward()
    with torch.autograd.profiler.profile() as profile:
        optimizer.step()
    assert seen == ["pre", "post"]
    assert any(event.name == "Optimizer.step#EagerAdam.step" for event in profile.function_events)
    copy = pickle.loads(pickle.dumps(optimizer))
    assert type(copy) is eager(torch.optim.Adam) and torch.equal(copy.param_groups[0]["params"][0], parameter)


def test_only_torchs_compile_markers_are_taken_off():
    """A wrapper that is not one of torch's two compile-only ones stays, with what it wraps: on a torch whose
    wrappers do other work, the optimizer keeps torch's behaviour."""
    import functools

    from dpsad.runtime.eager_optimizers import _step_function, _unwrapped

    def update():
        return "torch's"

    @functools.wraps(update)
    def doing_work():
        return "wrapper's"

    assert _unwrapped(torch._disable_dynamo(doing_work)) is doing_work
    assert _unwrapped(torch._disable_dynamo(update)) is update
    assert _unwrapped(doing_work) is doing_work
    torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)  # torch puts its profiler wrapper on SGD.step
    assert getattr(torch.optim.SGD.step, "hooked", False)
    step = _step_function(torch.optim.SGD)  # under it and the compile marker: the update itself
    assert step.__qualname__ == "SGD.step" and not hasattr(step, "__wrapped__")


@pytest.mark.e2e  # starts a Python process
def test_an_eager_optimizers_whole_use_never_imports_torchs_compiler():
    """In a fresh process: build, step, zero, save and load a state, with a schedule (1 s of every training job)."""
    check = ("import sys, torch\nfrom dpsad.runtime.eager_optimizers import eager\n"
             "model = torch.nn.Linear(3, 2)\n"
             "for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):\n"
             "    opt = eager(cls)(model.parameters(), lr=0.1)\n"
             "    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)\n"
             "    model(torch.ones(4, 3)).sum().backward(); opt.step(); opt.zero_grad(); schedule.step()\n"
             "    opt.load_state_dict(opt.state_dict())\n"
             "print('torch._dynamo' in sys.modules)\n")
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False"


def test_every_training_builds_its_optimizer_through_eager():
    """Any ``torch.optim.<Optimizer>`` used other than as ``eager(torch.optim.<Optimizer>)``, or imported by name,
    would load torch's compiler again in its job."""
    direct = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        through_eager = {id(node.args[0]) for node in ast.walk(tree) if isinstance(node, ast.Call)
                         and isinstance(node.func, ast.Name) and node.func.id == "eager" and node.args}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("torch.optim", "optim") \
                    and node.attr[:1].isupper() and node.attr != "Optimizer" and id(node) not in through_eager:
                direct.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.optim") \
                    and any(alias.name[:1].isupper() and alias.name != "Optimizer" for alias in node.names):
                direct.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: from {node.module} import ...")
    assert direct == []
