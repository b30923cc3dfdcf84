"""dp.subspace: the noisy gradient projected onto public directions, post-processing of the DP step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import tiny_config, tiny_data

import dpsad.training.public_subspace as subspace_module
from dpsad.privacy.mechanism.dpsgd import DPSGD
from dpsad.config import dpdm_settings, dpgan_settings, student_settings, teacher_settings
from dpsad.errors import DpsadError
from dpsad.privacy.books.ledger import verdict
from dpsad.runtime.eager_optimizers import eager
from dpsad.training.public_subspace import SubspacePlan, project_gradients_, public_basis, subspace_plan
from dpsad.training.student import train_student
from dpsad.training.teacher import train_teacher

CPU = torch.device("cpu")


def train(tmp_path, log, tag, *, subspace, data=None, lr=1e-3):
    config = tiny_config()
    config["dpdm"].update(epochs=2, batch_size=6, lr=lr, checkpoint_every=50, model=config["teachers"]["public"]["model"])
    config["dpdm"]["dp"]["noise_seed"] = 3  # the same batches and noise in both runs (a test's fixed seed)
    if subspace:
        config["dpdm"]["dp"]["subspace"] = True
    settings = dpdm_settings(config, {"target_epsilon": 5.0, "delta": 1e-5, "dpdm": {}})
    train_teacher(data=data or tiny_data(), settings=settings, diffusion_settings=config["diffusion"], labels_mode=True,
                  device=CPU, out_path=tmp_path / f"{tag}.pt", loss_csv=tmp_path / f"{tag}.csv",
                  ledger_path=tmp_path / f"{tag}.json", stage_name="train_dpdm", log=log)
    return json.loads((tmp_path / f"{tag}.json").read_text()), torch.load(tmp_path / f"{tag}.pt", weights_only=False)


def without_uid(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "uid"}


def test_the_projection_takes_the_noisy_gradient_and_leaves_the_ledger_as_without_it(tmp_path, log, monkeypatch):
    projected = []

    def recording(model, basis):  # the .grad the mechanism wrote (noise included), then its projection
        before = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters() if p.requires_grad])
        project_gradients_(model, basis)
        after = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
        projected.append((before, after, basis))

    monkeypatch.setattr(subspace_module, "project_gradients_", recording)
    plain_ledger, plain = train(tmp_path, log, "plain", subspace=False)
    assert not projected
    subspace_ledger, sub = train(tmp_path, log, "subspace", subspace=True)
    # the same mechanism, the same composition: every field of the ledger but each entry's unique id
    assert [without_uid(e) for e in plain_ledger["entries"]] == [without_uid(e) for e in subspace_ledger["entries"]]
    plain_verdict, subspace_verdict = (verdict(ledger["entries"], delta=1e-5, accountant="pld", target_epsilon=5.0,
                                               num_private_records=24) for ledger in (plain_ledger, subspace_ledger))
    key = "epsilon_noisy_components_only"  # the verdict itself is false: a fixed seed
    assert subspace_verdict[key] == plain_verdict[key] and subspace_verdict["reasons"] == plain_verdict["reasons"]
    assert len(projected) == subspace_ledger["entries"][-1]["steps"]
    for before, after, basis in projected:
        assert basis.shape[0] >= 1 and torch.allclose(basis @ basis.T, torch.eye(basis.shape[0], dtype=basis.dtype),
                                                      atol=1e-4)
        assert torch.allclose(after, basis.T @ (basis @ before), atol=1e-6)
        assert float((before - after).norm()) > 0.5 * float(before.norm())  # most of the noise left
    assert any(not torch.equal(plain["model"][k], sub["model"][k]) for k in plain["model"])


def test_the_basis_is_the_same_when_every_private_record_changes(tmp_path, log, monkeypatch):
    bases = []

    def recording(*args, **kwargs):
        bases.append(public_basis(*args, **kwargs))
        return bases[-1]

    monkeypatch.setattr(subspace_module, "public_basis", recording)
    data, other = tiny_data(seed=0), tiny_data(seed=1)
    other.splits["public"] = data.splits["public"]
    assert (data.splits["train"].images != other.splits["train"].images).reshape(24, -1).any(axis=1).all()
    train(tmp_path, log, "a", subspace=True, data=data, lr=0.0)
    first = list(bases)
    bases.clear()
    train(tmp_path, log, "b", subspace=True, data=other, lr=0.0)
    assert len(first) == len(bases) >= 1
    for a, b in zip(first, bases):
        assert torch.equal(a, b)


def test_k_and_the_refresh_follow_from_the_plan_and_the_public_split_alone():
    # the projected noise sigma * C * sqrt(k) / B stays at most half of C, within the public examples' directions
    assert subspace_plan(expected_batch=266, noise_multiplier=3.0, steps=61, public_records=1000) == \
        SubspacePlan(k=128, public_examples=128, refresh_every=4)
    tight = subspace_plan(expected_batch=64, noise_multiplier=4.0, steps=200, public_records=1000)
    assert tight.k == 64 and 4.0 * np.sqrt(tight.k) / 64 <= 0.5 < 4.0 * np.sqrt(tight.k + 1) / 64
    assert subspace_plan(expected_batch=64, noise_multiplier=4.0, steps=200, public_records=20).k == 20
    assert subspace_plan(expected_batch=8, noise_multiplier=50.0, steps=5, public_records=100) == \
        SubspacePlan(k=1, public_examples=100, refresh_every=1)


def test_the_basis_spans_the_public_gradients_it_was_built_from():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1, bias=False)
    public = (torch.randn(5, 6),)

    def loss(call, x):
        return call(x[None]).squeeze() ** 2

    from dpsad.privacy.mechanism.dpsgd import per_example_gradients

    grads = per_example_gradients(model, loss, public)["weight"].reshape(5, -1)
    basis = public_basis(model, loss, public, k=5)
    assert basis.shape == (5, 6)
    assert torch.allclose(grads @ basis.T @ basis, grads, atol=1e-5)  # every public gradient kept whole
    model.weight.grad = torch.randn(1, 6)
    project_gradients_(model, basis[:2])
    assert torch.allclose(model.weight.grad.reshape(-1), basis[:2].T @ (basis[:2] @ model.weight.grad.reshape(-1)))


def test_the_subspace_is_refused_where_it_is_not_built():
    config = tiny_config()
    config["dpgan"]["dp"]["subspace"] = True
    with pytest.raises(DpsadError, match="dpgan.dp.subspace: true, expected it left out"):
        dpgan_settings(config, {"target_epsilon": 5.0, "delta": 1e-5})
    config = tiny_config(mode="paper", allow_unsound=True)
    config["student"]["dp"]["subspace"] = True
    with pytest.raises(DpsadError, match="student.dp.subspace: true with mode 'paper', expected mode 'sound'"):
        student_settings(config, {"target_epsilon": 5.0, "delta": 1e-5})
    config = tiny_config()
    for name in ("public", "dp"):
        config["teachers"][name]["dp"]["subspace"] = True
    with pytest.raises(DpsadError, match="teachers.public.dp.subspace: true, expected it left out"):
        teacher_settings(config, "public")  # a teacher trained without noise has no noise to project
    assert teacher_settings(config, "dp").dp.subspace is True


def _public_teacher(tmp_path, log):
    config = tiny_config()
    out, ledger = tmp_path / "teacher.pt", tmp_path / "teacher.json"
    train_teacher(data=tiny_data(), settings=teacher_settings(config, "public"), diffusion_settings=config["diffusion"],
                  labels_mode=True, device=CPU, out_path=out, loss_csv=tmp_path / "teacher.csv", ledger_path=ledger,
                  stage_name="train_teacher[public]", log=log)
    return out, ledger


def _train_student(tmp_path, log, teacher_files, config, tag, data=None):
    settings = student_settings(config, {"target_epsilon": 5.0, "delta": 1e-5})
    train_student(data=data or tiny_data(), teacher_path=teacher_files[0], upstream_ledgers=[teacher_files[1]],
                  settings=settings, labels_mode=True, device=CPU, out_path=tmp_path / f"{tag}.pt",
                  loss_csv=tmp_path / f"{tag}.csv", ledger_path=tmp_path / f"{tag}.json", log=log)
    return json.loads((tmp_path / f"{tag}.json").read_text()), torch.load(tmp_path / f"{tag}.pt", weights_only=False)


def _student_config(subspace: bool, noise_seed: int = 3, **student):
    config = tiny_config(epochs=2, checkpoint_every=50, **student)
    config["student"]["dp"]["noise_seed"] = noise_seed  # the same batches and noise in runs that share it
    config["student"]["dp"]["accountant"] = "rdp"  # the ledgers are compared, not calibrated: RDP is quick
    if subspace:
        config["student"]["dp"]["subspace"] = True
    return config


def test_the_students_and_discriminators_projections_take_their_noisy_sums_and_leave_the_ledger_as_without_them(
        tmp_path, log, monkeypatch):
    projected = []

    def recording(model, basis):  # the .grad the mechanism wrote (noise included), then its projection
        before = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters() if p.requires_grad])
        project_gradients_(model, basis)
        after = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
        projected.append((type(model).__name__, before, after, basis))

    noisy_sums = []  # each update's .grad as the mechanism left it: the subspace code draws no secret randomness,
    real_step = DPSGD.step_gradients  # so the first step's noisy sums are those of the run without it

    def noisy_sum(engine, batch):
        stats = real_step(engine, batch)
        noisy_sums.append(torch.cat([p.grad.reshape(-1).clone() for p in engine.model.parameters() if p.requires_grad]))
        return stats

    monkeypatch.setattr(subspace_module, "project_gradients_", recording)
    monkeypatch.setattr(DPSGD, "step_gradients", noisy_sum)
    teacher_files = _public_teacher(tmp_path, log)
    plain_ledger, plain = _train_student(tmp_path, log, teacher_files, _student_config(False), "plain")
    assert not projected
    plain_sums = list(noisy_sums)
    noisy_sums.clear()
    subspace_ledger, sub = _train_student(tmp_path, log, teacher_files, _student_config(True), "subspace")
    assert torch.equal(plain_sums[0], noisy_sums[0]) and torch.equal(plain_sums[0], projected[0][1])
    # the same joint mechanism, the same composition: every field of both entries but their unique ids (the
    # entries of one run share their batch's)
    def fields(ledger):
        return [{k: v for k, v in without_uid(e).items() if k != "batch"} for e in ledger["entries"]]

    assert fields(plain_ledger) == fields(subspace_ledger)
    joint = [e for e in subspace_ledger["entries"] if e["stage"] in ("distill_student", "discriminator")]
    assert len(joint) == 2 and joint[0]["batch"] == joint[1]["batch"] is not None
    steps = subspace_ledger["entries"][-1]["steps"]
    assert [name for name, *_ in projected] == ["UNet", "Discriminator"] * steps  # each step: both updates
    for _, before, after, basis in projected:
        assert basis.shape[0] >= 1 and torch.allclose(basis @ basis.T, torch.eye(basis.shape[0], dtype=basis.dtype),
                                                      atol=1e-4)
        assert torch.allclose(after, basis.T @ (basis @ before), atol=1e-6)
        assert float((before - after).norm()) > 0.5 * float(before.norm())  # most of the noise left
    assert any(not torch.equal(plain["model"][k], sub["model"][k]) for k in plain["model"])


def test_the_students_and_discriminators_bases_are_the_same_when_every_private_record_changes(tmp_path, log,
                                                                                                 monkeypatch):
    bases = []

    def recording(model, *args, **kwargs):
        bases.append((type(model).__name__, public_basis(model, *args, **kwargs)))
        return bases[-1][1]

    monkeypatch.setattr(subspace_module, "public_basis", recording)
    data, other = tiny_data(seed=0), tiny_data(seed=1)
    other.splits["public"] = data.splits["public"]
    teacher_files = _public_teacher(tmp_path, log)
    monkeypatch.setattr(eager(torch.optim.Adam), "step", lambda self, closure=None: None)  # weights that stay: a basis
    _train_student(tmp_path, log, teacher_files, _student_config(True, noise_seed=3), "a", data=data)  # may then
    first = list(bases)  # differ only by what it reads: other records, other secret batches and noise
    bases.clear()
    _train_student(tmp_path, log, teacher_files, _student_config(True, noise_seed=4), "b", data=other)
    assert {name for name, _ in first} == {"UNet", "Discriminator"} and len(first) == len(bases)
    for (name_a, a), (name_b, b) in zip(first, bases):
        assert name_a == name_b and torch.equal(a, b)
