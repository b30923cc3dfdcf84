"""The one resumable training loop: every training stage (teacher, DPDM, the DP-SAD student, the dp-GAN critic).

A training passes in what differs, its step; the loop owns the rest:

- **resume**: a checkpoint at ``<out_path>.resume`` is taken up only when it was written under the same digest (the
  settings and the content of every input, :func:`dpsad.training.checkpoints.settings_digest`, the DP mechanism's
  code, the package's code as written and the DP plan: its sample rate, steps, clip bound and noise multipliers), else deleted and the training
  starts over, so that no step taken under another mechanism or noise is counted under this one's; every object of ``stateful`` (models, optimisers, schedulers, the EMA,
  the random generators, the secret ones included) is restored from it, with the loss rows;
- **the steps**: a progress bar, the step function, the EMA after each step, the loss rows every ``log_every``
  steps and a resumable checkpoint every ``checkpoint_every`` steps (on the first process only);
- **the end**: the loss CSV, the finished checkpoint with the ledger entries in it, the ledger file (the upstream
  ledgers' entries and these), and the resumable checkpoint removed.

Privacy: the loop draws nothing and reads no record.  A resumed training goes on with the generators' states it
saved, so each Poisson batch and noise draw is made once: a step is counted once however often the job restarts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..errors import DpsadError
from ..files.artifacts import save_torch
from ..models.lora import merged_state_dict
from ..privacy.books.ledger import LedgerEntry, write_ledger
from ..privacy.mechanism.code_digest import mechanism_code_sha256, package_source_sha256
from ..privacy.mechanism.plan import DpPlan
from ..runtime.distributed import SINGLE, DistributedContext
from .checkpoints import LossLog, load_checkpoint, settings_digest
from .schedules import EMA


# The package's code as this job imported it: taken at import, not when the loop is built hours of data loading
# later, so that an update in between is not stamped on steps the imported code takes.
CODE_AT_IMPORT = package_source_sha256()


def save_checkpoint(path, state: dict) -> None:
    save_torch(state, path)


def resume_state(path, digest: str, log, discard: bool = True) -> dict | None:
    """The checkpoint at ``path`` if it was written by a run with the same settings digest (else it is deleted,
    where ``discard``)."""
    path = Path(path)
    if not path.exists():
        return None
    state = load_checkpoint(path)
    if state.get("settings_digest") != digest:
        log.warning("ignoring %s: written under other settings or from inputs whose content has changed since; "
                    "training starts over", path)
        if discard:
            path.unlink(missing_ok=True)
        return None
    log.info("resuming from %s at step %d", path, state["step"])
    return state


# What a step returns: its loss row (logged steps), or None.
StepFunction = Callable[[int, bool], "dict | None"]


class TrainingLoop:
    """One training's loop.  ``kind``: the checkpoint's kind; ``stateful``: {name: object} saved in every checkpoint
    and restored on resume (``state_dict``/``load_state_dict``, or a ``torch.Generator``, whose state only the
    resumable checkpoint keeps); ``describe(final)``: the rest of a checkpoint (configurations, settings);
    ``ema``: (the EMA, the model it averages), whose weights the finished checkpoint holds with adapters merged."""

    def __init__(self, *, kind: str, out_path, digest: str, stateful: dict, describe: Callable[[bool], dict], log,
                 distributed: DistributedContext = SINGLE, ema: tuple[EMA, torch.nn.Module] | None = None,
                 dp_plan: DpPlan | None = None):
        planned = None if dp_plan is None else {
            "sample_rate": dp_plan.sample_rate, "steps": dp_plan.steps, "clip_norm": dp_plan.clip_norm,
            "noise_multipliers": dp_plan.noise_multipliers, "n": dp_plan.n}
        self.kind, self.out_path = kind, Path(out_path)
        self.digest = settings_digest({"run": digest, "mechanism": mechanism_code_sha256(),
                                       "code": CODE_AT_IMPORT, "plan": planned})
        self.stateful, self.describe, self.log, self.distributed, self.ema = stateful, describe, log, distributed, ema
        self.resume_path = Path(str(out_path) + ".resume")
        self.losses = LossLog()
        self.start = 0

    def resume(self) -> dict | None:
        """Restore every stateful object from a resumable checkpoint of this run; its whole state, or None."""
        distributed = self.distributed
        state = resume_state(self.resume_path, self.digest, self.log, discard=not distributed.enabled)
        if state is not None:
            for name, obj in self.stateful.items():
                if isinstance(obj, torch.Generator):
                    obj.set_state(state[name])
                else:
                    obj.load_state_dict(state[name])
            self.losses, self.start = LossLog(state["losses"]), int(state["step"])
        if distributed.enabled:
            # Each process reads the file the first one wrote.  One that saw none, or another (a node's stale view
            # of a shared folder), would take other steps than the first, whose ledger counts its own: stop instead.
            # Only the first deletes a stale file, once every process has read it (the broadcast waits for all).
            # The generators' states too: two files of one step (a stale copy of the same settings) would draw other
            # batches, so that a record could be in two processes' shares, and other noise.  And the run's digest,
            # fresh start included: a process that read another n or data file would draw other batches from the
            # same generators, so that a record could be in two processes' shares.
            mine = [self.start, self.generators_fingerprint(), int(self.digest, 16)]
            first = distributed.broadcast_ints(mine)
            if first[2] != mine[2]:
                raise DpsadError(f"process {distributed.rank} trains under other settings, inputs or code than the "
                                 "first process (another n, data file, configuration or package file, or noise "
                                 "calibrated apart on another kind of CPU), expected the same: run the job again where "
                                 "every process sees the same files (a shared folder's cache may lag) and code")
            if first != mine:
                raise DpsadError(f"process {distributed.rank} resumes {self.resume_path} at step {self.start}, the "
                                 f"first process at step {first[0]}, expected every process at the same step with "
                                 "the same batches and noise: the processes see different files (a shared folder's "
                                 "cache); run the job again")
            if state is None and distributed.is_main and self.resume_path.exists():
                self.resume_path.unlink()
        return state

    def generators_fingerprint(self) -> int:
        """64 bits of a sha256 over the states of the run's generators (its batches and noise from here on)."""
        total = hashlib.sha256()
        for name, obj in sorted(self.stateful.items()):
            if isinstance(obj, torch.Generator):
                total.update(name.encode() + b"\0" + obj.get_state().numpy().tobytes())
        return int.from_bytes(total.digest()[:8], "big")

    def checkpoint(self, step: int, final: bool = False) -> dict:
        state = {"kind": self.kind, "settings_digest": self.digest, "step": step}
        state.update({name: obj.state_dict() for name, obj in self.stateful.items()
                      if not isinstance(obj, torch.Generator)})
        state.update(self.describe(final))
        if final and self.ema is not None:  # the plain weights (adapters folded in); resuming needs the adapters
            ema, model = self.ema
            state["model"] = merged_state_dict(model)
            state["ema"] = ema.state_dict() | {"model": merged_state_dict(ema.model)}
        if not final:
            state.update({name: obj.get_state() for name, obj in self.stateful.items()
                          if isinstance(obj, torch.Generator)})
            state["losses"] = self.losses.rows
        return state

    def run(self, step_function: StepFunction, *, total_steps: int, desc: str, checkpoint_every: int,
            log_every: int = 10, log_first: bool = True, postfix: dict[str, str] | None = None) -> None:
        """Steps ``start`` to ``total_steps``; ``step_function(step, logged)`` returns the step's loss row when
        ``logged`` (every ``log_every`` steps, and the first step when ``log_first``: never the resumed step, so a
        resumed CSV equals an uninterrupted one); ``postfix``: {row key: label} shown on the bar."""
        bar = tqdm(range(self.start, total_steps), desc=desc, initial=self.start, total=total_steps, mininterval=2.0,
                   disable=not self.distributed.is_main)
        for step in bar:
            logged = (step + 1) % log_every == 0 or (log_first and step == 0)
            row = step_function(step, logged)
            if self.ema is not None:
                self.ema[0].update(self.ema[1])
            if logged and row is not None:
                self.losses.add(**row)
                if postfix:
                    bar.set_postfix({label: f"{row[key]:.4f}" for key, label in postfix.items()})
            if (step + 1) % checkpoint_every == 0 and step + 1 < total_steps and self.distributed.is_main:
                save_checkpoint(self.resume_path, self.checkpoint(step + 1))
        bar.close()

    def finish(self, entries: list[LedgerEntry], *, total_steps: int, loss_csv, ledger_path,
               upstream_ledgers=()) -> None:
        """On the first process: the loss CSV, the finished checkpoint with ``entries``, the ledger file (the
        upstream ledgers' entries and ``entries``), then the resumable checkpoint removed."""
        if not self.distributed.is_main:
            return
        self.losses.write_csv(loss_csv)
        save_checkpoint(self.out_path, self.checkpoint(total_steps, final=True) | {"ledger": list(entries)})
        write_ledger(ledger_path, list(entries), upstream=upstream_ledgers)
        self.resume_path.unlink(missing_ok=True)
