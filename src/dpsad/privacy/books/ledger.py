"""The privacy ledger: one entry per use of private records, composed into a verdict.

An entry (a dict, stored as JSON) has the keys ``stage``, ``private`` (bool:
it read private records), ``mechanism`` (``sgm`` Poisson-subsampled Gaussian,
``gaussian`` a single Gaussian release, or ``none`` for noise-free use),
``sample_rate``, ``noise_multiplier``, ``steps``, ``clip_norm``, and
optionally ``sound`` (False when the mechanism as implemented does not meet
the SGM assumptions, e.g. the paper's output-space clipping) with ``notes``,
``batch`` and ``noise_seed``.

``batch``: entries that carry the same non-empty ``batch`` key read the
same Poisson batches (e.g. the DP-SAD student and its DP discriminator).
They are one mechanism: :func:`components_of` merges them into one sampled
Gaussian with sigma_eff = (sum sigma_i^-2)^-1/2.  Entries without a key
(or with distinct keys) drew their batches independently.

``noise_seed``: ``secret`` (drawn from the operating system's entropy) or
``fixed`` (from the configuration, for tests and reproduction).  With a
known seed the batches and the noise are known: no guarantee.

``uid``: drawn when the entry is made, so one use of the private records is
one entry wherever it travels.  A ledger file is cumulative: the entries of
every artifact the stage was built from (its ``upstream`` ledgers, which the
workflow derives from the rule's own inputs) followed by the stage's own.
Reading several ledgers that share an ancestor counts that ancestor once.

A ledger file also stores ``entries_sha256``, the digest of its entries: a
reader refuses a ledger whose entries no longer match it (edited or damaged
since its stage wrote it) or that has none (every version of the stages that
wrote ledgers still read here wrote it), and every entry's fields are checked
for type and range before anything is composed.

The verdict is ``dp_guarantee: true`` only when every private entry is a
sound noisy mechanism with secret randomness and the composed epsilon is at
most the target.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from pathlib import Path
from typing import TypedDict

from ...files.atomic import write_json
from ...errors import DpsadError, PrivacyError
from ..accounting import (
    delta_problem,
    PLD_SEARCH_DISCRETIZATION,
    AccountantError,
    SGMComponent,
    cached_accountant,
    shared_batch_sigma,
)

MECHANISMS = ("sgm", "gaussian", "none")
NOISE_SEEDS = ("secret", "fixed")
LEDGER_FORMAT_VERSION = 2  # 2: entries_sha256 required (1, unversioned, allowed a ledger without it)


class _EntryKeys(TypedDict):
    stage: str
    private: bool
    mechanism: str
    sample_rate: float | None
    noise_multiplier: float | None
    steps: int
    clip_norm: float | None


class LedgerEntry(_EntryKeys, total=False):
    """One use of records, as a ledger file holds it (JSON object; :func:`field_problem` checks the values).

    ``mechanism``: sgm (Poisson rate ``sample_rate``, ``steps`` noisy sums of sensitivity ``clip_norm`` with
    noise ``noise_multiplier`` x ``clip_norm``), gaussian (one or ``steps`` releases at rate 1) or none (no
    noise: no guarantee where ``private``).  ``sound``: false where the run knows its claim is not a guarantee.
    ``batch``: the name of the Poisson batch shared by updates that are one mechanism.  ``uid``: the use's
    identity, so that an entry inherited through two inputs counts once."""

    sound: bool
    notes: str
    batch: str | None
    noise_seed: str | None
    uid: str


ENTRY_KEYS = tuple(_EntryKeys.__annotations__)  # every ledger entry has these


def make_entry(*, stage: str, private: bool, mechanism: str, sample_rate: float | None = None,
               noise_multiplier: float | None = None, steps: int = 0, clip_norm: float | None = None,
               sound: bool = True, notes: str = "", batch: str | None = None,
               noise_seed: str | None = None) -> LedgerEntry:
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism '{mechanism}', expected one of {MECHANISMS}")
    if noise_seed is not None and noise_seed not in NOISE_SEEDS:
        raise ValueError(f"noise_seed '{noise_seed}', expected one of {NOISE_SEEDS}")
    if mechanism != "none" and noise_seed is None:
        raise ValueError(f"ledger entry for '{stage}' ({mechanism}) lacks noise_seed, expected 'secret' or 'fixed'")
    return LedgerEntry(**{
        "stage": stage, "private": bool(private), "mechanism": mechanism,
        "sample_rate": sample_rate, "noise_multiplier": noise_multiplier, "steps": int(steps),
        "clip_norm": clip_norm, "sound": bool(sound), "notes": notes, "batch": batch, "noise_seed": noise_seed,
        "uid": uuid.uuid4().hex,
    })


def write_ledger(path, entries: list[LedgerEntry], upstream=()) -> list[LedgerEntry]:
    """Write the cumulative ledger of an artifact: every entry of the ``upstream`` ledger files, then ``entries``.

    ``upstream``: the ledgers of everything the artifact was built from
    (init weights, label sources, features, teachers).  Returns what was written.
    """
    for entry in entries:
        missing = [k for k in ENTRY_KEYS if k not in entry]
        if missing:
            raise ValueError(f"ledger entry for '{entry.get('stage')}' lacks {missing}")
    composed = unique_entries(read_ledgers(upstream) + list(entries))
    write_json(path, {"format_version": LEDGER_FORMAT_VERSION, "entries": composed,
                      "entries_sha256": entries_digest(composed)})
    return composed


def entries_digest(entries: list[LedgerEntry]) -> str:
    """sha256 of the entries' canonical JSON (what ``entries_sha256`` of a ledger file states)."""
    return hashlib.sha256(json.dumps(entries, sort_keys=True, default=str).encode()).hexdigest()


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def field_problem(entry: LedgerEntry) -> str | None:
    """What is wrong with one entry's fields (``key = value, expected ...``), or None."""
    if not isinstance(entry.get("stage"), str):
        return f"stage = {entry.get('stage')!r}, expected a stage name"
    if not isinstance(entry["private"], bool):
        return f"private = {entry['private']!r}, expected true or false"
    if entry["mechanism"] not in MECHANISMS:
        return f"mechanism = {entry['mechanism']!r}, expected one of {list(MECHANISMS)}"
    steps = entry["steps"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        return f"steps = {steps!r}, expected a whole number of steps >= 0"
    noisy = entry["mechanism"] != "none"
    rate, sigma, clip = entry["sample_rate"], entry["noise_multiplier"], entry["clip_norm"]
    if (noisy or rate is not None) and not (_is_number(rate) and 0 < rate <= 1):
        return f"sample_rate = {rate!r}, expected a number in (0, 1]"
    if (noisy or sigma is not None) and not (_is_number(sigma) and sigma >= 0):
        return f"noise_multiplier = {sigma!r}, expected a number >= 0"
    if clip is not None and not (_is_number(clip) and clip > 0):
        return f"clip_norm = {clip!r}, expected a number > 0 or null"
    return None


def _identity(entry: LedgerEntry) -> str:
    # An entry without a uid (written by hand or by an older version) is never merged: over-counting is safe.
    return entry.get("uid") or f"no-uid:{id(entry)}"


# What an entry states about its use: two entries of one uid must agree on all of it but the notes (words);
# "records" names the preparation of the records the use read.
_USE_FIELDS = (*ENTRY_KEYS, "sound", "batch", "noise_seed", "records", "public_records")


def unique_entries(entries) -> list[LedgerEntry]:
    """``entries`` in order, each use of private records once (by ``uid``).

    Raises :class:`DpsadError` where two entries of one uid state different uses: keeping the first would count
    whichever came first, perhaps the cheaper (a uid reused by an edited or foreign ledger)."""
    kept: dict[str, LedgerEntry] = {}
    for entry in entries:
        key = _identity(entry)
        first = kept.setdefault(key, entry)
        differing = [name for name in _USE_FIELDS if first.get(name) != entry.get(name)]
        if differing:
            raise DpsadError(f"two ledger entries of use {key} ('{first.get('stage')}', '{entry.get('stage')}') "
                             f"differ in {differing}, expected one use recorded one way: rebuild the stage that "
                             "wrote the later one (snakemake --forcerun <rule>)")
    return list(kept.values())


def read_ledgers(paths) -> list[LedgerEntry]:
    """The entries of every ledger file in ``paths``, each use of private records once."""
    entries = []
    for path in paths:
        try:
            content = json.loads(Path(path).read_text())
            loaded = content["entries"]
            if not isinstance(loaded, list) or not all(isinstance(e, dict) for e in loaded):
                raise TypeError("'entries' is not a list of objects")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DpsadError(f"{path}: not a readable dpsad ledger ({err}), expected JSON with 'entries'") from err
        for entry in loaded:
            missing = [k for k in ENTRY_KEYS if k not in entry]
            if missing:
                raise DpsadError(f"{path}: ledger entry for '{entry.get('stage')}' lacks {missing}, "
                                 f"expected every key of {list(ENTRY_KEYS)}")
            problem = field_problem(entry)
            if problem:
                raise DpsadError(f"{path}: ledger entry for '{entry.get('stage')}' has {problem}")
        stated = content.get("entries_sha256")
        if stated is None:
            # Every ledger a stage writes carries its digest; without it, entries could have been removed unseen.
            raise DpsadError(f"{path}: has no entries_sha256, expected the digest every dpsad stage writes with "
                             "its entries: rerun that stage (snakemake --forcerun <rule>) to rebuild it")
        if stated != entries_digest(loaded):
            raise DpsadError(f"{path}: its entries no longer match the entries_sha256 written with them (edited or "
                             "damaged since), expected the ledger as its stage wrote it: rerun that stage "
                             "(snakemake --forcerun <rule>) to rebuild it")
        entries.extend(loaded)
    return unique_entries(entries)


def _noisy_private(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    return [e for e in entries if e["private"] and e["mechanism"] in ("sgm", "gaussian")]


def components_of(entries: list[LedgerEntry], fraction: float = 1.0) -> list[SGMComponent]:
    """The independent sampled-Gaussian components of the private noisy entries (after ``fraction`` of their steps).

    Entries sharing a ``batch`` key become one component with sigma_eff; they
    must agree on sample rate and steps (they are updates of the same steps).
    """
    groups: dict[str, list[LedgerEntry]] = {}
    components = []
    for entry in _noisy_private(entries):
        key = entry.get("batch")
        if key:
            groups.setdefault(key, []).append(entry)
        else:
            components.append(_component([entry], fraction))
    for key, members in groups.items():
        rates = {(1.0 if e["mechanism"] == "gaussian" else float(e["sample_rate"]), int(e["steps"])) for e in members}
        if len(rates) != 1:
            raise PrivacyError(f"ledger entries with batch '{key}' disagree on (sample rate, steps): {sorted(rates)}, "
                               "expected updates of the same Poisson batches")
        components.append(_component(members, fraction))
    return components


def _component(members: list[LedgerEntry], fraction: float) -> SGMComponent:
    first = members[0]
    q = 1.0 if first["mechanism"] == "gaussian" else float(first["sample_rate"])
    sigma = shared_batch_sigma(float(e["noise_multiplier"]) for e in members)
    return SGMComponent(sigma, q, int(round(first["steps"] * fraction)))


def label_set_reasons(data_attrs: dict, dataset: str) -> list[str]:
    """Reasons against a guarantee found in ``data.h5``: a label set derived from the private labels.

    The label set (number and names of classes) is part of the public schema.  Derived from the records
    it reveals, without noise, e.g. that some class occurs at all, and it reaches every release whatever
    the run's ``labels`` setting: the number of the warm-up's central images, the classes of a conditional
    model, the class names written into ``synthetic.h5``.  So every run of such a dataset loses its guarantee.
    A label set fixed by the configuration, the source, or a separate public source is public.
    """
    if bool(data_attrs.get("labelled", True)) and bool(data_attrs.get("label_set_from_data", False)):
        return [f"data.{dataset}.class_names is not configured: the label set was derived from the private labels "
                "without noise and shapes every release (number of classes and central images, class names), "
                "expected class_names or num_classes in the configuration, or a separate public source that fixes them"]
    return []


def verdict(entries: list[LedgerEntry], *, delta: float, accountant: str, target_epsilon: float | None,
            num_private_records: int, extra_reasons: list[str] | None = None) -> dict:
    """Compose the private entries and decide the guarantee.  See the module docstring.

    ``extra_reasons``: reasons found outside the ledger (e.g. a label set
    derived from private labels); any reason makes the verdict false.
    Raises PrivacyError when the guarantee holds in form but the composed
    epsilon exceeds ``target_epsilon``: such a run must fail, not release.
    """
    reasons = list(extra_reasons or [])
    private = [e for e in entries if e["private"]]
    for entry in private:
        if entry["mechanism"] == "none":
            reasons.append(f"{entry['stage']}: trained on private records without noise")
            continue
        if not entry.get("sound", True):
            reasons.append(f"{entry['stage']}: {entry.get('notes') or 'mechanism does not meet the DP-SGD assumptions'}")
        if entry.get("noise_seed") != "secret":
            reasons.append(f"{entry['stage']}: noise seed fixed in the configuration (batches and noise are "
                           "reproducible from it), expected a secret seed (dp.noise_seed: null)")
    if problem := delta_problem(delta, num_private_records):
        reasons.append(problem)
    guarantee = not reasons
    if guarantee:
        noisy_epsilon = cached_accountant(accountant).epsilon(components_of(entries), delta)  # failures fail the run
    else:
        # Information only (no guarantee): RDP, which stays fast for the tiny multipliers of unsound runs.
        try:
            noisy_epsilon = cached_accountant("rdp").epsilon(components_of(entries), delta)
        except AccountantError:
            noisy_epsilon = math.nan
    result = {
        "dp_guarantee": guarantee,
        "epsilon": (noisy_epsilon if guarantee else None),
        "delta": delta,
        "accountant": accountant,
        "target_epsilon": target_epsilon,
        "reasons": reasons,
        "num_private_records": num_private_records,
        "components": entries,
    }
    if not guarantee:
        result["epsilon_noisy_components_only"] = (
            noisy_epsilon if math.isfinite(noisy_epsilon) else ("inf" if math.isinf(noisy_epsilon) else "not computed"))
        result["epsilon_noisy_components_only_accountant"] = "rdp"
        result["note"] = "No differential privacy guarantee: see reasons. The epsilon above covers only the noisy components and is not a guarantee."
    if guarantee and target_epsilon is not None and noisy_epsilon > target_epsilon * (1 + 1e-9):
        raise PrivacyError(
            f"composed epsilon {noisy_epsilon:.4f} exceeds the target {target_epsilon:g} at delta {delta:g}; "
            "refusing to certify this run (lower epochs or raise the noise)"
        )
    return result


def epsilon_curve(entries: list[LedgerEntry], *, delta: float, accountant: str,
                  points: int = 10) -> list[tuple[float, float]]:
    """Composed epsilon after a fraction f of every private noisy component's steps, f in (0, 1].

    For the plot only: PLD points use the search grid (10x faster, still a
    pessimistic upper bound); the stated epsilon is computed on the fine grid.
    """
    curve = []
    for k in range(1, points + 1):
        fraction = k / points
        curve.append((fraction, cached_accountant(accountant, PLD_SEARCH_DISCRETIZATION).epsilon(
            components_of(entries, fraction), delta)))
    return curve
