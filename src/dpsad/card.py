"""The dataset card of a release folder: ``README.md`` (and ``samples.png``) for a recipient who has nothing else.

Written by :func:`dpsad.release_folder.build_release` from the facts the folder already states, so the card
cannot disagree with them: ``privacy.json`` (this release's guarantee), ``BUDGET.json`` (the total over
every release of the same records the curator knows of, and the declared earlier uses) and
``synthetic.h5`` (image shape, class names, counts per class: post-processing of the release, no
privacy cost).  Nothing here reads a private record.  In the manner of dataset cards and "Datasheets
for Datasets": what the data are, the guarantee and its scope, what it does not cover, how to read it.
"""

from __future__ import annotations

import numpy as np

from .data.near_copies import HASH_SIZE, THRESHOLD as NEAR_THRESHOLD
from .privacy.accounting import delta_problem
from .privacy.books.curator_record import NOT_SEEN, active_test_settings
from .privacy.books.image_digests import NOT_DETECTED
from .privacy.books.release_budget import RELEASE_DECISION, declared_epsilon, stated_total
from .privacy.stated import rounded_up
from .synthetic import GUARANTEE_ASSUMPTIONS, SyntheticData

CARD = "README.md"
SIM_PE_STAGE = "sim_pe"  # the ledger stage of Sim-PE's votes (dpsad.pe.simulator_evolution)
PE_STAGES = ("private_evolution", SIM_PE_STAGE)  # the ledger stages of PE's votes (dpsad.pe)
SAMPLES = "samples.png"
METHOD_NAMES = {
    "dpsad": "DP-SAD: a diffusion student distilled from a teacher with an adversarial discriminator, trained with DP-SGD",
    "dpdm": "DPDM: a diffusion model trained with DP-SGD",
    "dpgan": "dp-GAN: a generator trained against a DP-SGD critic",
    "pe": ("Private Evolution: images of a teacher generator, chosen and varied by Gaussian-noised histograms of "
           "the private records' nearest-image votes (no model is trained on the private records)"),
    "pe on a DP generator": ("Private Evolution on a DP generator: images of a diffusion model trained on the private "
                             "records with DP-SGD (part of the budget), chosen and varied by Gaussian-noised histograms "
                             "of the private records' nearest-image votes (the rest)"),
    "pe on the public renderer": ("Private Evolution on the public font renderer (Sim-PE): glyphs drawn by the public "
                                  "renderer, their parameters chosen and varied by Gaussian-noised histograms of the "
                                  "private records' nearest-image votes"),
    "dpsad from a pe population": ("DP-SAD from Private Evolution's population: a diffusion student distilled with "
                                   "DP-SGD (the rest of the budget) from a teacher fitted, without noise, to the "
                                   "images a Private Evolution run chose by noisy votes (part of the budget)"),
    "public": "a diffusion model trained on the public data only (no private record read)",
    "public from a private start": ("a diffusion model trained on the public data, from weights that read the private "
                                    "records under DP (the components of privacy.json)"),
    "nonprivate": "a diffusion model trained on the private records without noise",
}
READING = '''```python
import h5py, json
with h5py.File("synthetic.h5") as f:
    images = f["images"][()]                              # uint8, N x H x W x C
    labels = f["labels"][()] if "labels" in f else None   # int64, N (absent for unconditional runs)
    classes = json.loads(f.attrs["class_names"])
    print(f.attrs["epsilon"], f.attrs["delta"], f.attrs["guarantee_notes"])
```'''


def card_facts(privacy: dict, budget: dict | None, synthetic: SyntheticData | None) -> dict:
    """The figures the card states, each taken from the file that states it (``None`` where absent)."""
    facts = {"dp_guarantee": bool(privacy["dp_guarantee"]), "epsilon": privacy.get("epsilon"),
             "delta": privacy.get("delta"), "accountant": privacy.get("accountant"),
             "num_private_records": privacy.get("num_private_records")}
    if budget is not None:
        facts["total_epsilon"], facts["total_delta"] = stated_total(budget)
        facts["total_accountant"] = budget.get("accountant")
        facts["declared_earlier_uses"] = list(budget.get("declared_earlier_uses") or [])
    if synthetic is not None:
        attrs = synthetic.attrs
        facts.update(dataset=attrs["dataset"], run=attrs["run"], method=attrs["method"],
                     images=int(len(synthetic.images)), image_shape=tuple(int(v) for v in synthetic.images.shape[1:]),
                     class_names=synthetic.class_names)
        if synthetic.labels is not None:
            counts = np.bincount(synthetic.labels, minlength=len(synthetic.class_names))
            facts["per_class"] = {name: int(c) for name, c in zip(synthetic.class_names, counts)}
    return facts


def method_kind(method: str, privacy: dict) -> str:
    """The key of :data:`METHOD_NAMES` for a run: PE whose generator spent part of the budget on DP-SGD (an ``sgm``
    component of the private records in its privacy.json) trained a model on them, unlike PE on a public teacher;
    PE whose votes are Sim-PE's (a ``sim_pe`` component) evolved the public renderer.  A public run warm-started
    from a teacher that read private records (``init:`` a ``split: central`` teacher) did read them.  DP-SAD with
    a PE run's votes among its components distils a teacher on that run's population (``split: population``)."""
    components = privacy.get("components", [])
    if method == "dpsad" and any(c.get("stage") in PE_STAGES for c in components):
        return "dpsad from a pe population"
    if method == "public" and any(c.get("private") for c in components):
        return "public from a private start"
    if method == "pe" and any(c.get("stage") == SIM_PE_STAGE for c in components):
        return "pe on the public renderer"
    trained = any(c.get("private") and c.get("mechanism") == "sgm" for c in components)
    return "pe on a DP generator" if method == "pe" and trained else method


def _number(value) -> str:
    """An epsilon or a delta as the card states it: rounded up."""
    return "not stated" if value is None else rounded_up(value, 6)


def dataset_card(privacy: dict, budget: dict | None, synthetic: SyntheticData | None, *, dataset: str, run: str,
                 samples: bool) -> str:
    """The text of ``README.md``.  ``synthetic`` is None when the run has no guarantee (nothing is released)."""
    facts = card_facts(privacy, budget, synthetic)
    if not facts["dp_guarantee"]:
        reasons = "".join(f"\n- {r}" for r in privacy.get("reasons", []) + active_test_settings())
        return "\n".join([
            f"# {dataset} / {run}: not released (no DP guarantee)", "",
            "This run has **no differential privacy guarantee**, so nothing derived from the private records is in "
            "this folder: only `privacy.json`, which states why, and `NOT_RELEASED.txt`.", "",
            f"Reasons:{reasons}", ""])
    height, width, channels = facts["image_shape"]
    lines = [f"# {dataset} / {run}: a differentially private synthetic dataset", ""]
    lines += [
        "Synthetic images made from a private image dataset under differential privacy (the method is below), "
        "shared in place of the private images. No private image is in this folder.", "",
        "## What the data are", "",
        f"- `synthetic.h5`: **{facts['images']}** images of {height} x {width} pixels, {channels} channel(s), "
        f"uint8.",
        f"- Method: {METHOD_NAMES.get(method_kind(facts['method'], privacy), facts['method'])} (`{facts['method']}`).",
    ]
    if "per_class" in facts:
        lines += [f"- Labels: {len(facts['class_names'])} classes, drawn by the generator (not private labels).", "",
                  "| class | synthetic images |", "|---|---|"]
        lines += [f"| {name} | {count} |" for name, count in facts["per_class"].items()]
    else:
        lines += ["- Labels: none (an unconditional generator)."]
    lines += [""]
    if samples:
        lines += [f"![Samples: the first images of each class]({SAMPLES})", ""]
    lines += [
        "## The privacy guarantee", "",
        f"This release (`synthetic.h5`, `privacy.json` and the generator weights, when present) is "
        f"**({_number(facts['epsilon'])}, {_number(facts['delta'])})-differentially private** with respect to the "
        f"{facts['num_private_records']} records of the private training split ({facts['accountant']} accounting): "
        "for any one record, a distinct image with its label (identical copies, also mirrored or turned ones, were "
        "removed before training, and so were the near-copies a perceptual-hash detector finds: pHash of the centred "
        f"picture within {NEAR_THRESHOLD} of {HASH_SIZE * HASH_SIZE} bits and the same brightness; "
        "on digit and letter images it finds nearly every copy shifted by a pixel, re-encoded or with a pixel "
        "changed, on photographs few), adding it to or removing it from that split changes the "
        f"probability of anything derived from this release by at most a factor e^{_number(facts['epsilon'])}, "
        f"except with probability {_number(facts['delta'])}.", ""]
    if "total_epsilon" in facts:  # declared uses of other records can take the total delta past 1/n
        weak = delta_problem(facts["total_delta"], int(facts["num_private_records"] or 0))
        lines += [
            f"Together with every other release the curator has recorded, of these records or of any others, and "
            f"the declared earlier uses of known cost, the total when this release was checked against the budget is "
            f"**({_number(facts['total_epsilon'])}, {_number(facts['total_delta'])})-DP** with respect to any one "
            f"record ({facts['total_accountant']} accounting; `BUDGET.json` beside this folder, where you have it; "
            "releases recorded after that check are in the later `BUDGET.json` files). It counts every recorded "
            "release, not only those that share records with this one, so that the figure says nothing of which "
            "records they share." + (f" It protects no one record: its {weak}." if weak else ""), ""]
    record = (privacy.get("dataset_total_at_release") or {}).get("curator_record") or {}
    if record.get("history"):
        lines += [
            f"That total was composed by the curator's record at `{record.get('location')}` (history "
            f"`{record['history'][:12]}`; this release is its row {record.get('release_sequence')}, the record stood at "
            f"row {record.get('sequence')}, head `{str(record.get('head'))[:12]}`). It is the curator's one record of "
            "what was released from these records, shared by every workspace that uses it.", ""]
    lines += ["## What the guarantee does not cover", "", f"- {NOT_DETECTED}", f"- {NOT_SEEN}"]
    if budget is not None:  # a BUDGET.json written before it stated this: the same checks refused then
        lines.append(f"- {budget.get('release_decision') or RELEASE_DECISION}")
    lines += [f"- {sentence}" for sentence in active_test_settings()]
    for declared in facts.get("declared_earlier_uses", []):
        cost = declared_epsilon(declared)
        by = ", ".join(declared.get("declared_by") or []) or "the curator"
        lines.append(f"- An earlier use of records the curator holds (of these or others; declared with {by}), outside "
                     f"this pipeline: {declared['description']}. " + (f"Its cost (epsilon {_number(cost[0])}, delta {_number(cost[1])}) "
                                                       "is included in the total above." if cost else
                                                       "Its cost is **not known and not included** in any figure here."))
    lines += ["- Figures the curator computed on the private records without noise (training logs, evaluation "
              "accuracies, cluster reports) are not part of this release and are not covered."]
    lines += [f"- {assumption}" for assumption in GUARANTEE_ASSUMPTIONS]
    lines += ["", "## How to read the files", "", "Nothing but h5py is needed:", "", READING, ""]
    return "\n".join(lines)
