"""Teacher and student loops: ledgers, verdict wiring, paper-mode refusal, kill-and-resume."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dpsad.diffusion import DiffusionConfig, GaussianDiffusion
from dpsad.errors import PrivacyError
from dpsad.privacy.books.ledger import read_ledgers, verdict
from dpsad.training.checkpoints import load_checkpoint
from dpsad.training.student import train_student
from dpsad.training.teacher import train_teacher
from dpsad.config import teacher_settings
from helpers import every_other_poisson_draw_empty, tiny_config, tiny_data, tiny_student

CPU = torch.device("cpu")


def teacher(tmp_path, log, name="public", config=None, data=None):
    config = config or tiny_config()
    out = tmp_path / f"{name}.pt"
    train_teacher(data=data or tiny_data(), settings=teacher_settings(config, name), diffusion_settings=config["diffusion"],
                  labels_mode=True, device=CPU, out_path=out, loss_csv=tmp_path / f"{name}.csv",
                  ledger_path=tmp_path / f"{name}.ledger.json", stage_name=f"train_teacher[{name}]", log=log)
    return out, tmp_path / f"{name}.ledger.json"


def student(tmp_path, log, teacher_files, settings, target=10.0, tag="s"):
    out = tmp_path / f"{tag}.pt"
    entries = train_student(data=tiny_data(), teacher_path=teacher_files[0], upstream_ledgers=[teacher_files[1]],
                            settings=tiny_student(settings, target),
                            labels_mode=True, device=CPU, out_path=out,
                            loss_csv=tmp_path / f"{tag}.csv", ledger_path=tmp_path / f"{tag}.ledger.json", log=log)
    return out, entries


def test_student_timesteps_follow_its_noise_distribution():
    from dpsad.training.student import _draw

    diffusion = GaussianDiffusion(DiffusionConfig())
    settings = dataclasses.replace(tiny_student(tiny_config()["student"]), noise_distribution="uniform", lognormal_mean=1.0,
                                   lognormal_std=0.5, label_dropout=0.1)
    t, noise, drop = _draw(4000, 2, (1, 4, 4), diffusion, settings, True, torch.Generator().manual_seed(0))
    assert t.shape == (4000, 2) and noise.shape == (4000, 2, 1, 4, 4) and drop.shape == (4000,)
    assert torch.equal(t, torch.randint(500, (4000, 2), generator=torch.Generator().manual_seed(0)))
    t, _, _ = _draw(4000, 2, (1, 4, 4), diffusion, dataclasses.replace(settings, noise_distribution="lognormal"), True,
                    torch.Generator().manual_seed(0))
    log_sigma = diffusion.sigmas()[t].log()
    assert log_sigma.median().item() == pytest.approx(1.0, abs=0.05)
    assert ((t > 150) & (t < 450)).float().mean() > 0.95  # few near either end (uniform: 0.6 of them inside)


def test_public_teacher_ledger_reads_no_private_record(tmp_path, log):
    _, ledger = teacher(tmp_path, log)
    (entry,) = read_ledgers([ledger])
    assert entry["private"] is False and entry["mechanism"] == "none"
    state = load_checkpoint(tmp_path / "public.pt")
    assert state["step"] == 6 and state["model_config"]["num_classes"] == 3 and "optimizer" in state and "ema" in state


def test_private_teacher_without_noise_gives_no_guarantee(tmp_path, log):
    _, ledger = teacher(tmp_path, log, "private")
    result = verdict(read_ledgers([ledger]), delta=1e-5, accountant="pld", target_epsilon=None, num_private_records=24)
    assert result["dp_guarantee"] is False


def test_sound_student_with_public_teacher_is_dp(tmp_path, log):
    files = teacher(tmp_path, log)
    config = tiny_config()
    _, entries = student(tmp_path, log, files, config["student"])
    assert [e["stage"] for e in entries] == ["distill_student", "discriminator"]
    assert all(e["mechanism"] == "sgm" and e["sound"] and e["noise_multiplier"] > 0 for e in entries)
    assert entries[0]["steps"] == 4  # ceil(1 epoch / q), q = 6/24
    result = verdict(read_ledgers([files[1], tmp_path / "s.ledger.json"]), delta=1e-5, accountant="pld",
                     target_epsilon=10.0, num_private_records=24)
    assert result["dp_guarantee"] is True and result["epsilon"] <= 10.0


def test_conditioning_only_student_moves_only_the_conditioning_parameters(tmp_path, log):
    from dpsad.training.student import CONDITIONING_PARTS

    files = teacher(tmp_path, log)
    config = tiny_config(trainable="conditioning", init_from_teacher=True, lr=1e-2)
    out, entries = student(tmp_path, log, files, config["student"])
    start = load_checkpoint(files[0])["ema"]["model"]
    trained = load_checkpoint(out)["model"]
    moved = {name for name in start if not torch.equal(start[name], trained[name])}
    conditioning = {name for name in start if any(part in name for part in CONDITIONING_PARTS)}
    assert moved and moved <= conditioning and "class_embed.weight" in moved
    assert any(name.endswith("conv1.weight") for name in start) and not any(name.endswith("conv1.weight") for name in moved)
    assert entries[0]["mechanism"] == "sgm" and entries[0]["noise_multiplier"] > 0


def test_public_discriminator_costs_nothing(tmp_path, log):
    files = teacher(tmp_path, log)
    config = tiny_config(discriminator={"privacy": "public", "base_channels": 8})
    _, entries = student(tmp_path, log, files, config["student"])
    assert entries[1]["private"] is False
    assert len([e for e in entries if e["private"]]) == 1


def test_paper_mode_is_refused_without_allow_unsound(tmp_path, log):
    """The stage's own check, behind the config's (which refuses such a config when it is read)."""
    files = teacher(tmp_path, log)
    config = tiny_config(mode="paper", allow_unsound=True)
    with pytest.raises(PrivacyError, match="allow_unsound"):
        student(tmp_path, log, files, {**config["student"], "allow_unsound": False})


def test_paper_mode_with_allow_unsound_reports_the_effective_multiplier(tmp_path, log):
    files = teacher(tmp_path, log, "private")
    config = tiny_config(mode="paper", allow_unsound=True, paper_noise_multiplier=0.6)
    _, entries = student(tmp_path, log, files, config["student"])
    assert entries[0]["noise_multiplier"] == pytest.approx(0.6 / 40)
    result = verdict(read_ledgers([files[1], tmp_path / "s.ledger.json"]), delta=1e-5, accountant="pld",
                     target_epsilon=10.0, num_private_records=24)
    assert result["dp_guarantee"] is False
    assert any("effective noise multiplier 0.015" in r for r in result["reasons"])
    assert any("discriminator" in r for r in result["reasons"]) and any("train_teacher" in r for r in result["reasons"])


def test_dp_teacher_is_composed_into_the_student_budget(tmp_path, log):
    config = tiny_config()
    files = teacher(tmp_path, log, "dp", config)
    (t_entry,) = read_ledgers([files[1]])
    assert t_entry["private"] and t_entry["mechanism"] == "sgm" and t_entry["steps"] == 4
    _, entries = student(tmp_path, log, files, config["student"])
    result = verdict(read_ledgers([files[1], tmp_path / "s.ledger.json"]), delta=1e-5, accountant="pld",
                     target_epsilon=10.0, num_private_records=24)
    assert result["dp_guarantee"] is True and 9.0 < result["epsilon"] <= 10.0


class Killed(Exception):
    pass


def comparable(entries: list[dict]) -> list[dict]:
    """Ledger entries without the identifiers drawn per training run (uid, the shared-batch key's suffix)."""
    return [{**{k: v for k, v in e.items() if k != "uid"}, "batch": (e["batch"] or "").split(":")[0]} for e in entries]


def test_kill_and_resume_gives_the_same_model_and_ledger(tmp_path, log, monkeypatch):
    files = teacher(tmp_path, log)
    # 8 steps, checkpoints every 2; a fixed DP seed so that two runs can be compared (verdict false, see below)
    settings = tiny_config(epochs=2, dp={"noise_seed": 1234})["student"]
    _, uninterrupted = student(tmp_path, log, files, settings, tag="full")
    reference = load_checkpoint(tmp_path / "full.pt")

    import dpsad.training.training_loop as loop_module  # the one loop of every training

    real_save = loop_module.save_checkpoint
    calls = {"n": 0}

    def save_then_die(path, state):
        real_save(path, state)
        calls["n"] += 1
        if calls["n"] == 2:  # after the checkpoint at step 4
            raise Killed()

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        student(tmp_path, log, files, settings, tag="killed")
    assert (tmp_path / "killed.pt.resume").exists() and not (tmp_path / "killed.pt").exists()
    assert not (tmp_path / "killed.csv").exists()  # outputs only at the end: nothing for Snakemake to call incomplete
    monkeypatch.setattr(loop_module, "save_checkpoint", real_save)
    _, resumed = student(tmp_path, log, files, settings, tag="killed")
    full_rows = (tmp_path / "full.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in (tmp_path / "killed.csv").read_text().splitlines()] == [
        row.split(",")[0] for row in full_rows]  # the loss rows before the kill came back from the resume file
    # the same entries but for what identifies one training run (its uid and its shared-batch key)
    assert comparable(resumed) == comparable(uninterrupted)
    assert (comparable(json.loads((tmp_path / "killed.ledger.json").read_text())["entries"])
            == comparable(json.loads((tmp_path / "full.ledger.json").read_text())["entries"]))
    state = load_checkpoint(tmp_path / "killed.pt")
    for name, value in reference["model"].items():
        assert torch.allclose(state["model"][name], value, atol=1e-6), name
    assert not (tmp_path / "killed.pt.resume").exists()
    assert all(e["noise_seed"] == "fixed" for e in resumed)


def test_a_killed_training_resumes_after_a_change_of_how_it_runs_and_starts_over_after_one_of_what_it_computes(
        tmp_path, log, monkeypatch, caplog):
    """After a kill (a CUDA out-of-memory, say), a lower ``microbatch_size``, another per-example engine or another
    checkpoint spacing continue the training from its resume file; another learning rate, or the package's code
    changed in between (an update while the job was down), starts it over."""
    import logging

    import dpsad.training.training_loop as loop_module

    files = teacher(tmp_path, log)
    settings = tiny_config(epochs=2)["student"]
    real_save = loop_module.save_checkpoint

    def save_then_die(path, state):
        real_save(path, state)
        raise Killed()

    how = {"checkpoint_every": 3, "dp": {**settings["dp"], "microbatch_size": 1, "per_example": "vmap"}}
    real_code = loop_module.CODE_AT_IMPORT
    for tag, changed, code, resumes in (("how", how, real_code, True), ("what", {"lr": settings["lr"] * 2}, real_code, False),
                                        ("code", {}, "the digest of an updated package", False)):
        monkeypatch.setattr(loop_module, "save_checkpoint", save_then_die)
        with pytest.raises(Killed):
            student(tmp_path, log, files, settings, tag=tag)
        monkeypatch.setattr(loop_module, "save_checkpoint", real_save)
        monkeypatch.setattr(loop_module, "CODE_AT_IMPORT", code)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=log.name):
            student(tmp_path, log, files, {**settings, **changed}, tag=tag)
        monkeypatch.setattr(loop_module, "CODE_AT_IMPORT", real_code)
        assert ("resuming from" in caplog.text, "training starts over" in caplog.text) == (resumes, not resumes), tag
        assert (tmp_path / f"{tag}.pt").exists() and not (tmp_path / f"{tag}.pt.resume").exists()


def test_the_code_a_resume_is_checked_against_is_every_module_of_the_package_wherever_it_lies(tmp_path, monkeypatch):
    import shutil

    from dpsad.privacy.mechanism import code_digest

    installed = code_digest.package_source_sha256()
    copy = tmp_path / "elsewhere" / "dpsad"
    shutil.copytree(code_digest.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(code_digest, "PACKAGE", copy)
    digests = []
    try:
        (copy / "training" / ".#student.py").symlink_to("root@host.1234")  # an editor's lock: a dangling link
        for edited in (None, "training/student.py", "models/unet.py", "gan/train.py"):
            if edited:
                (copy / edited).write_text((copy / edited).read_text() + "\nEDITED = True\n")
            code_digest.package_source_sha256.cache_clear()
            digests.append(code_digest.package_source_sha256())
    finally:
        code_digest.package_source_sha256.cache_clear()
    assert digests[0] == installed  # the same code in another folder (a clone, a cluster's copy): it resumes
    assert len(set(digests)) == len(digests)  # any module edited: it starts over


def test_teacher_kill_and_resume_finishes_with_the_same_steps(tmp_path, log, monkeypatch):
    import dpsad.training.training_loop as loop_module  # the one loop of every training

    reference_path, _ = teacher(tmp_path / "a" if (tmp_path / "a").mkdir() is None else None, log)
    real_save = loop_module.save_checkpoint

    def die_on_first_resume_checkpoint(path, state):
        real_save(path, state)
        if str(path).endswith(".resume"):
            raise Killed()

    (tmp_path / "b").mkdir()
    monkeypatch.setattr(loop_module, "save_checkpoint", die_on_first_resume_checkpoint)
    with pytest.raises(Killed):
        teacher(tmp_path / "b", log)
    monkeypatch.setattr(loop_module, "save_checkpoint", real_save)
    out, _ = teacher(tmp_path / "b", log)
    a, b = load_checkpoint(reference_path), load_checkpoint(out)
    assert a["step"] == b["step"] == 6
    for name, value in a["model"].items():
        assert torch.allclose(b["model"][name], value, atol=1e-6), name


def test_nan_loss_stops_with_a_clear_message(tmp_path, log):
    config = tiny_config()
    config["teachers"]["public"]["lr"] = 1e30
    config["teachers"]["public"]["grad_clip"] = 1e30
    config["teachers"]["public"]["steps"] = 50
    with pytest.raises(FloatingPointError, match="last good checkpoint"):
        teacher(tmp_path, log, config=config)


# Privacy truth: shared batches, secret randomness, nothing unnoised in finished artifacts ----------------------

def test_student_and_dp_discriminator_are_accounted_as_one_mechanism(tmp_path, log):
    from test_accounting import independent_pld

    from dpsad.privacy.accounting import SGMComponent, Accountant, shared_batch_sigma

    files = teacher(tmp_path, log)
    _, entries = student(tmp_path, log, files, tiny_config(epochs=3)["student"], target=4.0)
    assert entries[0]["batch"] == entries[1]["batch"] and entries[0]["batch"].startswith("distill_student:")
    q, steps = entries[0]["sample_rate"], entries[0]["steps"]
    sigma_eff = shared_batch_sigma([e["noise_multiplier"] for e in entries])
    assert entries[0]["noise_multiplier"] == pytest.approx(sigma_eff / 0.8 ** 0.5)  # budget split 0.8 / 0.2
    result = verdict(read_ledgers([files[1], tmp_path / "s.ledger.json"]), delta=1e-5, accountant="pld",
                     target_epsilon=4.0, num_private_records=24)
    assert result["dp_guarantee"] is True
    truth = independent_pld(sigma_eff, q, steps, 1e-5)
    assert result["epsilon"] == pytest.approx(truth, rel=0.02) and truth <= 4.0
    # The old accounting (two independent components at rate q) states less than the truth.
    independent = Accountant().epsilon([SGMComponent(e["noise_multiplier"], q, steps) for e in entries], 1e-5)
    assert independent < 0.9 * truth


def test_default_runs_draw_secret_noise(tmp_path, log):
    files = teacher(tmp_path, log)
    settings = tiny_config()["student"]
    student(tmp_path, log, files, settings, tag="one")
    _, entries = student(tmp_path, log, files, settings, tag="two")
    assert all(e["noise_seed"] == "secret" for e in entries)
    one, two = load_checkpoint(tmp_path / "one.pt")["model"], load_checkpoint(tmp_path / "two.pt")["model"]
    assert any(not torch.equal(one[name], two[name]) for name in one)  # same config seed, different noise


def test_a_fixed_dp_seed_reproduces_but_gives_no_guarantee(tmp_path, log):
    files = teacher(tmp_path, log)
    settings = tiny_config(dp={"noise_seed": 7})["student"]
    student(tmp_path, log, files, settings, tag="one")
    _, entries = student(tmp_path, log, files, settings, tag="two")
    one, two = load_checkpoint(tmp_path / "one.pt")["model"], load_checkpoint(tmp_path / "two.pt")["model"]
    assert all(torch.equal(one[name], two[name]) for name in one)
    result = verdict(read_ledgers([files[1], tmp_path / "two.ledger.json"]), delta=1e-5, accountant="pld",
                     target_epsilon=10.0, num_private_records=24)
    assert result["dp_guarantee"] is False
    assert any("noise seed fixed in the configuration" in r for r in result["reasons"])


def test_finished_checkpoints_hold_no_generator_state_or_loss_rows(tmp_path, log):
    files = teacher(tmp_path, log, "dp")
    student(tmp_path, log, files, tiny_config()["student"])
    for path in (files[0], tmp_path / "s.pt"):
        state = load_checkpoint(path)
        assert not {"data_gen", "noise_gen", "public_gen", "losses"} & set(state), path
        assert not any(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1 for v in state.values())


def test_dp_teacher_draws_secret_noise(tmp_path, log):
    _, ledger = teacher(tmp_path, log, "dp")
    (entry,) = read_ledgers([ledger])
    assert entry["noise_seed"] == "secret" and entry.get("batch") is None


def test_empty_poisson_batches_are_noise_only_steps_for_the_student_and_a_dp_teacher(tmp_path, log, monkeypatch):
    """Poisson sampling draws an empty batch now and then (secret seeds: on no fixed step); such a step adds
    noise only and training goes on.  Here every other draw is empty."""
    files = teacher(tmp_path, log)
    draws = every_other_poisson_draw_empty(monkeypatch)
    _, entries = student(tmp_path, log, files, tiny_config()["student"])
    assert entries[0]["steps"] == 4 and len(draws) >= 4
    assert all(torch.isfinite(p).all() for p in load_checkpoint(tmp_path / "s.pt")["model"].values())
    draws.clear()
    _, ledger = teacher(tmp_path, log, "dp")
    assert read_ledgers([ledger])[0]["steps"] >= 2 and len(draws) >= 2


def test_the_ema_of_a_warm_started_model_forgets_its_start():
    """The sampled (EMA) weights of a short warm-started run must be the trained weights, not the public start's."""
    from dpsad.training.schedules import EMA

    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(model.weight)  # the warm start
    ema = EMA(model, decay=0.99)
    with torch.no_grad():
        model.weight.fill_(1.0)  # training moved the weights; 47 steps, as one demo student takes
    for _ in range(47):
        ema.update(model)
    # a constant decay of 0.99 would leave 0.99^47 = 62% of the start: weight 0.38
    assert float(ema.model.weight.min()) > 0.999


def test_an_ema_warm_up_of_two_keeps_the_plain_average_of_the_start_and_every_update():
    """ema_warmup 2: decay_k = (1 + k) / (2 + k), the running mean; the default 10 weighs the last updates more."""
    from dpsad.training.schedules import EMA

    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)  # the start
    averaged, default = EMA(model, decay=0.999, warmup=2), EMA(model, decay=0.999)
    values = [float(v) for v in range(1, 9)]
    with torch.no_grad():
        for value in values:
            model.weight.fill_(value)
            averaged.update(model)
            default.update(model)
    assert float(averaged.model.weight) == pytest.approx(sum(values) / (len(values) + 1))
    assert float(default.model.weight) > float(averaged.model.weight) + 1.0


def test_the_ema_warm_up_set_for_a_teacher_or_a_student_reaches_its_average(tmp_path, log):
    config = tiny_config()
    config["teachers"]["public"]["ema_warmup"] = 3
    files = teacher(tmp_path, log, config=config)
    assert load_checkpoint(files[0])["ema"]["warmup"] == 3
    student(tmp_path, log, files, dict(tiny_config()["student"], ema_warmup=2))
    assert load_checkpoint(tmp_path / "s.pt")["ema"]["warmup"] == 2
    student(tmp_path, log, files, tiny_config()["student"], tag="default")
    assert load_checkpoint(tmp_path / "default.pt")["ema"]["warmup"] == 10


def test_student_with_a_constant_schedule_ends_at_its_full_rate(tmp_path, log):
    files = teacher(tmp_path, log)
    settings = dict(tiny_config()["student"], lr_schedule="constant")
    student(tmp_path, log, files, settings)
    state = load_checkpoint(tmp_path / "s.pt")
    assert state["total_steps"] > 1
    # cosine annealing would end at 0: the checkpoint's optimiser holds the rate of the last step
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == [settings["lr"]]


def test_student_learning_rate_follows_its_schedule():
    import math

    from dpsad.training.student import student_lr_factor

    cosine = student_lr_factor("cosine", 100, 50.0)
    assert cosine(0) == pytest.approx(1.0) and cosine(50) == pytest.approx(0.5) and cosine(100) == pytest.approx(0.0)
    constant = student_lr_factor("constant", 100, 50.0)
    assert [constant(s) for s in (0, 50, 100)] == [1.0, 1.0, 1.0]
    logarithmic = student_lr_factor("logarithmic", 100, 50.0)
    assert logarithmic(0) == pytest.approx(1.0)
    assert logarithmic(50) == pytest.approx(1.0 / (1.0 + math.log(2.0)))  # the second epoch, as DPDM's decay
    assert logarithmic(100) == pytest.approx(1.0 / (1.0 + math.log(3.0)))


def test_a_resume_checkpoint_of_another_dp_plan_is_never_resumed(tmp_path, log):
    """The loop resumes only the same run under the same mechanism and plan: steps taken with another noise
    multiplier (an accounting change between the kill and the rerun, say) would be counted under this one's."""
    from dpsad.privacy.mechanism.plan import DpPlan
    from dpsad.training.training_loop import TrainingLoop

    generator = torch.Generator().manual_seed(0)

    def loop(sigma: float) -> TrainingLoop:
        plan = DpPlan(stage="distill_student", settings={}, n=100, target_epsilon=1.0, delta=1e-5, sample_rate=0.1,
                      steps=4, clip_norm=0.1, accountant="pld", noise_multipliers={"student": sigma}, upstream=())
        return TrainingLoop(kind="test", out_path=tmp_path / "model.pt", digest="the same settings and inputs",
                            stateful={"data_gen": generator}, describe=lambda final: {}, log=log, dp_plan=plan)

    loop(1.0).run(lambda step, logged: {"step": step + 1}, total_steps=4, desc="test", checkpoint_every=2)
    resume = tmp_path / "model.pt.resume"
    assert loop(1.0).resume()["step"] == 2
    assert loop(0.99).resume() is None and not resume.exists()


def test_processes_that_would_resume_at_different_steps_or_generators_stop_and_only_the_first_deletes_a_stale_file(
        tmp_path, log):
    """Several processes each read the resumable checkpoint the first one wrote.  One that saw no file (or another:
    a node's stale view of a shared folder, also one of the same step with other generator states, which would draw
    other batches and noise) stops with one line instead of training other steps than the first's, and so does one
    under other settings or inputs, from a fresh start too; a stale file is left for the first process to delete,
    after every process has read it."""
    from dpsad.errors import DpsadError
    from dpsad.runtime.distributed import DistributedContext
    from dpsad.training.training_loop import TrainingLoop

    @dataclasses.dataclass(frozen=True)
    class Told(DistributedContext):  # the broadcast's answer: the first process's step, generators and digest
        first: int = 0
        same_generators: bool = True
        first_digest: int | None = None  # None: this process's own

        def broadcast_ints(self, values):
            step, generators, digest = values
            return [self.first, generators if self.same_generators else generators ^ 1,
                    digest if self.first_digest is None else self.first_digest]

    def loop(distributed, digest="the same settings and inputs"):
        return TrainingLoop(kind="test", out_path=tmp_path / "model.pt", digest=digest,
                            stateful={"data_gen": torch.Generator().manual_seed(0)}, describe=lambda final: {}, log=log,
                            distributed=distributed)

    # a fresh start too: a process whose settings or inputs (say n) differ from the first's would draw other batches
    first_is = {run: int(loop(DistributedContext(), digest=run).digest, 16) for run in ("other settings",
                                                                                      "the same settings and inputs")}
    with pytest.raises(DpsadError, match=r"^process 1 trains under other settings, inputs or code than the first "):
        loop(Told(rank=1, world_size=2, first_digest=first_is["other settings"])).resume()
    assert loop(Told(rank=1, world_size=2, first_digest=first_is["the same settings and inputs"])).resume() is None
    loop(DistributedContext()).run(lambda step, logged: None, total_steps=4, desc="test", checkpoint_every=2)
    resume = tmp_path / "model.pt.resume"
    assert loop(Told(rank=1, world_size=2, first=2)).resume()["step"] == 2
    with pytest.raises(DpsadError, match=r"^process 1 resumes .*model.pt.resume at step 2, the first process at step "
                                         r"0, expected every process at the same step"):
        loop(Told(rank=1, world_size=2, first=0)).resume()
    with pytest.raises(DpsadError, match=r"^process 1 resumes .* at step 2, the first process at step 2, expected every "
                                         r"process at the same step with the same batches and noise"):
        loop(Told(rank=1, world_size=2, first=2, same_generators=False)).resume()
    assert loop(Told(rank=1, world_size=2, first=0), digest="other settings").resume() is None and resume.exists()
    assert loop(Told(rank=0, world_size=2, first=0), digest="other settings").resume() is None
    assert not resume.exists()
