"""The release of a run: the only files meant to leave the curator's ``results/``.

``release/{dataset}/{run}/`` holds, when the run's verdict is
``dp_guarantee: true``:

* ``synthetic.h5``: the synthetic dataset (images, labels, the stated guarantee);
* ``privacy.json``: the verdict of the account stage (components, epsilon, reasons);
* ``generator.pt`` (optional): the generator's weights (EMA for diffusion
  models) and its model configuration, nothing else: no optimiser, no
  discriminator or critic, no generator states, no loss rows;
* ``README.md`` and ``samples.png``: the dataset card (:mod:`dpsad.card`),
  written from the same facts as ``privacy.json`` and ``BUDGET.json``.

When the verdict is false nothing derived from the private records is
released: the folder holds ``privacy.json`` (which says why), ``README.md``
and ``NOT_RELEASED.txt``.  The folder is written beside its destination and
renamed into place, so it is complete or absent.

Before any folder is built, :func:`dpsad.privacy.books.release_budget.compose_budget`
writes ``BUDGET.json`` and records each listed run in the curator's record
(:mod:`dpsad.privacy.books.curator_record`), keyed by the private records: that history
lives outside the workspace and stays when ``release/`` is deleted.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

from .files.artifacts import read_json, save_torch
from .files.atomic import readable_per_umask, write_json
from .data.bundled_uses import bundled_among, bundled_uses_of
from .data.datafile import read_attrs, split_digest_kinds
from .errors import DpsadError, PrivacyError
from .card import CARD, SAMPLES, dataset_card
from .plots import sample_grid
from .synthetic import load_synthetic
from .privacy.books.image_digests import NOT_DETECTED, RecordSets, as_set, identity_digests
from .privacy.books.release_budget import (SCOPE_ALONE, UnboundedUseError, budget_as_stated, compose_budget,
                                           declared_epsilon, stated_total, uses_the_budget_left_out)
from .privacy.stated import recorded_public_trainings, recorded_trainings
from .privacy.books.curator_record import (TEST_SETTINGS, active_test_settings, declaration,
                                           refuse_other_test_settings)
from .privacy.books.integrity import check_checkpoint_entries, check_components_match_ledger, check_stated_epsilon
from .privacy.books.ledger import read_ledgers
from .privacy.books.preparation import records_problem
from .privacy.books.public_preparation import public_records_problem

RELEASED_DIFFUSION = "released_diffusion_model"
RELEASED_GAN = "released_gan_generator"


def export_generator(checkpoint: dict, out_path) -> None:
    """Write ``generator.pt`` from a training checkpoint: weights and model configuration only."""
    kind = checkpoint.get("kind")
    common = {"class_names": checkpoint.get("class_names", []), "conditional": bool(checkpoint.get("conditional"))}
    if kind == "dpgan":
        state = {"kind": RELEASED_GAN, "gan_config": checkpoint["gan_config"], "weights": checkpoint["generator"], **common}
    elif kind in ("dpsad_student", "diffusion_model"):
        weights = checkpoint["ema"]["model"] if "ema" in checkpoint else checkpoint["model"]
        state = {"kind": RELEASED_DIFFUSION, "model_config": checkpoint["model_config"],
                 "diffusion_config": checkpoint["diffusion_config"], "weights": weights, **common}
    else:
        raise DpsadError(f"checkpoint kind {kind!r}, expected dpgan, dpsad_student or diffusion_model")
    save_torch(state, out_path)


def build_release(out_dir, *, synthetic_path, privacy_path, checkpoint: dict, checkpoint_path, ledger_path,
                  include_generator: bool, budget_path, configured_budget: dict, configured_use: dict | None,
                  configured_uses: dict[str, dict], dataset: str, data_path, curator_dir, workspace,
                  check_path) -> list[str]:
    """Write the release folder ``out_dir`` atomically; returns the names of the files in it.

    ``checkpoint`` (read from ``checkpoint_path``) and its ledger ``ledger_path`` are cross-checked with
    ``privacy_path`` first (:mod:`dpsad.privacy.books.integrity`); ``include_generator`` ships its weights.
    ``budget_path``: the dataset's BUDGET.json (beside ``out_dir``), which must have recorded this run's trainings
    and which the released privacy.json points to as the total over every release, composed under
    ``configured_budget`` (the dataset's ``privacy_budget`` as configured now).  ``configured_use``: the
    dataset's ``earlier_use`` as configured now (:func:`check_no_guarantee_beside_a_use_of_unknown_cost`);
    ``configured_uses``: every dataset's of the configuration, by name, which BUDGET.json must count
    (:func:`check_budget_counts_the_configured_uses`).  ``data_path``: ``dataset``'s data.h5, whose preparation
    every training of a run with a guarantee must have read (:func:`check_runs_read_these_records`, as the budget
    checks it: a budget and trainings kept by --touch past two preparations, the last with the splits the budget
    checked, are not), and whose records (with ``curator_dir`` and ``workspace`` as release_budget has them, and
    ``check_path``, the curator's check written with the budget) refuse a release while the curator's record holds
    a use of them the budget left out (:func:`check_budget_counts_the_records_uses`).  Each is required: no caller
    skips a check.
    """
    privacy = read_json(privacy_path, "privacy verdict")
    entries = read_ledgers([ledger_path])
    check_checkpoint_entries(checkpoint, checkpoint_path, entries, ledger_path)
    check_components_match_ledger(privacy, privacy_path, entries, ledger_path)
    check_stated_epsilon(privacy, privacy_path)
    check_no_guarantee_beside_a_use_of_unknown_cost(privacy, privacy_path, configured_use)
    # A Private Evolution population is the synthetic set itself: there is no generator to ship.
    generator_checkpoint = checkpoint if include_generator and checkpoint.get("kind") != "pe_population" else None
    synthetic = load_synthetic(synthetic_path)
    check_same_guarantee(synthetic.attrs, synthetic_path, privacy, privacy_path)
    out_dir = Path(out_dir)
    if (stated := (synthetic.attrs.get("dataset"), synthetic.attrs.get("run"))) != (dataset, out_dir.name):
        # the card is titled from these: a results folder moved to another name would go out under the old one
        raise DpsadError(f"{synthetic_path} states dataset and run {stated}, expected {(dataset, out_dir.name)}: "
                         f"draw them again (snakemake --forcerun {synthetic_path} release)")
    check_runs_read_these_records([(out_dir.name, privacy)], read_attrs(data_path), data_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():  # what was shared is never replaced (release_budget refuses another training first)
        raise DpsadError(f"{out_dir} exists, expected no release folder there: a release is never replaced; move it "
                         "out of release/ (it stays counted in the curator's record), then run again")
    budget = read_json(budget_path, "release budget")
    check_same_test_settings(privacy, privacy_path, budget, budget_path, synthetic.attrs, synthetic_path)
    if budget.get("budget") != budget_as_stated(configured_budget):
        # BUDGET.json is an ancient input: kept under --rerun-triggers mtime after the cap was lowered, its check
        # would let through a total the configuration no longer allows
        raise PrivacyError(f"{budget_path} was composed under the budget {budget.get('budget')}, but "
                           f"data.{dataset}.privacy_budget is {budget_as_stated(configured_budget)} now, expected the "
                           f"same: run the same snakemake command again with --forcerun {budget_path}")
    check_budget_counts_the_configured_uses(budget, budget_path, configured_uses)
    check_budget_counts_the_records_uses(budget, budget_path, privacy, record_sets(dataset, data_path), curator_dir,
                                         workspace, check_path)
    total_epsilon, total_delta = stated_total(budget)
    released_privacy = {**privacy, "epsilon_scope": SCOPE_ALONE, "dataset_total_at_release": {
        **({"no_bounded_total": no_bound} if (no_bound := no_bounded_total(budget)) else {}),
        "file": "../BUDGET.json", "epsilon": total_epsilon, "delta": total_delta, "accountant": budget["accountant"],
        "records_not_detected": NOT_DETECTED, "curator_record": release_row(budget, out_dir.name, privacy, budget_path),
        **({"test_settings": settings} if (settings := active_test_settings()) else {})}}
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        readable_per_umask(tmp)
        write_json(tmp / "privacy.json", released_privacy)
        readable_per_umask(tmp / "privacy.json")
        if privacy["dp_guarantee"]:
            shutil.copyfile(synthetic_path, tmp / "synthetic.h5")
            if generator_checkpoint is not None:
                export_generator(generator_checkpoint, tmp / "generator.pt")
            sample_grid(synthetic.images, synthetic.labels, tmp / SAMPLES, per_row=8)
            readable_per_umask(tmp / SAMPLES)
        (tmp / CARD).write_text(dataset_card(released_privacy, budget, synthetic if privacy["dp_guarantee"] else None,
                                             dataset=synthetic.attrs["dataset"], run=synthetic.attrs["run"],
                                             samples=bool(privacy["dp_guarantee"])))
        if not privacy["dp_guarantee"]:
            reasons = "\n".join(f"- {r}" for r in privacy.get("reasons", []) + active_test_settings())
            (tmp / "NOT_RELEASED.txt").write_text(
                "This run has no differential privacy guarantee, so nothing derived from the private records is "
                f"released here. Reasons (also in privacy.json):\n{reasons}\n")
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(p.name for p in out_dir.iterdir())


NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "fuse.sshfs",
                        "9p", "afs", "glusterfs", "fuse.glusterfs")


def network_file_system(path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """The type of the network file system ``path`` lies on (by the longest mount point above it), or None: the
    curator's record relies on SQLite's locks, which such file systems do not always keep."""
    try:
        table = [line.split() for line in mounts.read_text().splitlines()]
    except OSError:
        return None
    path, best = Path(path).resolve(), ("", None)
    for fields in table:
        if len(fields) >= 3 and (path == Path(fields[1]) or Path(fields[1]) in path.parents):
            if len(fields[1]) > len(best[0]):
                best = (fields[1], fields[2])
    return best[1] if best[1] in NETWORK_FILE_SYSTEMS else None


def record_sets(dataset: str, data_path) -> RecordSets:
    """The private and public records of ``data.h5`` as the curator's record knows them."""
    private, public = split_digest_kinds(data_path, "private"), split_digest_kinds(data_path, "public")
    return RecordSets(dataset, identity_digests(*private), identity_digests(*public), private, public)


def _stated_list(attrs, key: str, absent):
    """The JSON list a synthetic.h5 states under ``key``, ``absent`` without it, or a text naming what is unreadable."""
    if key not in attrs:
        return absent
    try:
        return json.loads(attrs[key])
    except (TypeError, ValueError):
        return f"unreadable ({attrs[key]!r})"


def check_same_guarantee(attrs, synthetic_path, privacy: dict, privacy_path) -> None:
    """Refuse a synthetic.h5 whose stated guarantee is not the privacy.json released beside it (one stamped from an
    earlier verdict, e.g. after ``--touch``): a reader of the file alone would be told another epsilon.  With a
    guarantee, also one drawn from other trainings (a run trained again at the same epsilon, its samples kept by
    ``--touch``): the curator's record would count the new training, and the old one would go out uncounted; or
    from other trainings on the public split (:func:`dpsad.privacy.stated.recorded_public_trainings`)."""
    stated = {key: attrs.get(key) for key in ("dp_guarantee", "epsilon", "delta", "accountant")}
    if bool(stated["dp_guarantee"]) != bool(privacy["dp_guarantee"]) or privacy["dp_guarantee"] and not (
            str(stated["accountant"]) == str(privacy["accountant"])
            and all(isinstance(stated[k], (int, float)) and math.isclose(float(stated[k]), float(privacy[k]), rel_tol=1e-9)
                    for k in ("epsilon", "delta"))):
        raise DpsadError(f"{synthetic_path} states {stated} but {privacy_path} says dp_guarantee = "
                         f"{privacy['dp_guarantee']}, epsilon {privacy.get('epsilon')}, delta {privacy.get('delta')}, "
                         f"accountant {privacy.get('accountant')}, expected the same guarantee (rerun sample)")
    earlier = "not stated (an earlier version wrote it)"
    expected = recorded_trainings(privacy), recorded_public_trainings(privacy)
    # public_trainings is written from 0.3.2: an earlier file of a run with a public training is drawn again
    stated = _stated_list(attrs, "trainings", earlier), _stated_list(attrs, "public_trainings", expected[1] and earlier)
    if privacy["dp_guarantee"] and stated != expected:
        raise DpsadError(f"{synthetic_path} was drawn from trainings {stated[0]} and public trainings {stated[1]}, but "
                         f"{privacy_path} composes {expected[0]} and {expected[1]}, expected the samples of this "
                         f"training: draw them again (snakemake --forcerun {synthetic_path} release)")


def check_same_test_settings(privacy: dict, privacy_path, budget: dict, budget_path, attrs, synthetic_path) -> None:
    """The verdict, the samples and BUDGET.json were made under the test settings in effect now
    (:func:`.privacy.books.curator_record.refuse_other_test_settings`)."""
    notes = str(attrs.get("guarantee_notes", ""))
    refuse_other_test_settings(privacy.get("test_settings", []), privacy_path)
    refuse_other_test_settings(budget.get("test_settings", []), budget_path)
    refuse_other_test_settings([s for s in TEST_SETTINGS if s in notes], synthetic_path)


def check_no_guarantee_beside_a_use_of_unknown_cost(privacy: dict, privacy_path, configured: dict | None = None) \
        -> None:
    """Refuse a privacy.json that states a guarantee beside a declared use of unknown cost, its own or the one
    ``configured`` now: a verdict of an older version, or one from before the use was declared, kept by
    ``--rerun-triggers mtime`` or ``--touch`` together with a BUDGET.json that recorded it."""
    declared = [d for d in (privacy.get("declared_earlier_use"), configured) if d]
    if privacy["dp_guarantee"] and any(declared_epsilon(d) is None for d in declared):
        raise PrivacyError(f"{privacy_path} states dp_guarantee true beside a declared earlier use of unknown cost, "
                           "expected no guarantee (a verdict from before that use was declared, or of an older "
                           "version of dpsad): account it again, snakemake --forcerun account release")


def check_budget_counts_the_configured_uses(budget: dict, budget_path, uses: dict[str, dict]) -> None:
    """Refuse a BUDGET.json composed before an earlier use the configuration declares now (``uses``: dataset name ->
    its ``earlier_use``, this dataset's and the others', whose records may be these under another name) was declared
    as it is now, by that dataset: its total, and whether it may state a guarantee at all, would leave that use out.
    Another dataset's declaration is read from the configuration (no param reruns this dataset's budget when it
    changes), and ``--rerun-triggers mtime`` keeps any budget.  Compared with what the budget was composed with for
    each dataset (``composed_with_uses``), not with the uses it lists: those are every record's, any dataset's."""
    composed = budget.get("composed_with_uses", {})
    if missing := [name for name, use in uses.items() if use and composed.get(name) != declaration(use)]:
        raise PrivacyError(f"{budget_path} was composed before the earlier use now declared in "
                           f"{', '.join(f'data.{name}.earlier_use' for name in missing)}, expected a budget that counts "
                           f"it: compose it again (snakemake --forcerun {budget_path}), then run again")


def no_bounded_total(budget: dict) -> str | None:
    """BUDGET.json's sentence that no total bounds every use of the records, where a use of unknown cost is declared
    (one for a budget of an earlier version, which lists such a use without the sentence): a release folder says so
    beside the number it copies, not only BUDGET.json."""
    if "no_bounded_total" in budget:
        return budget["no_bounded_total"]
    if any(declared_epsilon(d) is None for d in budget.get("declared_earlier_uses", [])):
        return ("No total bounds every use of the records the curator holds: a use of unknown cost is declared "
                "(../BUDGET.json names it), and the epsilon below counts only the releases and the uses of known cost.")
    return None


def check_budget_counts_the_records_uses(budget: dict, budget_path, privacy: dict, records: RecordSets,
                                         curator_dir=None, workspace=None, check_path=None) -> None:
    """Refuse a release while the curator's record holds a use of ``records`` that the budget (a snapshot) did not
    count (declared since, under another name or in another workspace) or, for a run with a guarantee, one of
    unknown cost (:func:`uses_the_budget_left_out`).  A run with a guarantee is compared with the uses of its own
    records that the budget's check capped them with (``check_path``: the curator's ``release_check.json``, written
    with BUDGET.json): the same declaration for other records, which ``budget``'s total counts, did not enter that
    cap, and only for the records it capped (which a check of 0.2.7 on names) beside the public split it checked
    them against (0.3.2 on).  A run without one copies ``budget``'s
    total, which a use it lists already qualifies.  The package's use of its bundled digits is held wherever
    ``records`` include them (:func:`dpsad.data.bundled_uses.bundled_uses_of`)."""
    if privacy["dp_guarantee"]:
        check = read_json(check_path, "curator's release check")
        if (check.get("dataset"), check.get("curator_record")) != (budget.get("dataset"), budget.get("curator_record")):
            raise PrivacyError(f"{check_path} is not the check {budget_path} was composed with (another dataset or "
                               f"curator's record row), expected the two written together: compose them again "
                               f"(snakemake --forcerun {budget_path}), then run again")
        for split, fingerprint in (("private", records.private_fingerprint), ("public", records.public_fingerprint)):
            # data.h5 prepared again from other records while the budget and the trainings were kept (--touch): the
            # check found no conflict with the curator's record for these splits, and recorded the others' as this
            # release's (a new public split may hold records private before); a check of an earlier version does
            # not name them (public: before 0.3.2), and is composed again the same way
            if check.get(f"{split}_records") != fingerprint:
                raise PrivacyError(f"{check_path} does not name the {split} records of the data.h5 this release is "
                                   "checked for as those its budget was composed for (other records, or none: a "
                                   "check written before 0.2.7, or 0.3.2 for the public split), expected the same "
                                   "records: compose it "
                                   f"again (snakemake --forcerun {budget_path}), then run again")
        counted = check["declared_earlier_uses"]
    else:
        counted = budget.get("declared_earlier_uses", [])
    left_out = uses_the_budget_left_out(counted, records, curator_dir, workspace)
    # the package's use of its bundled digits, which no curator's record holds where no budget declared it (one
    # composed by an earlier version): of unknown cost, so a run with a guarantee is refused beside it
    left_out += [{**use, "declared_by": [bundled.dataset]} for bundled, use in bundled_uses_of(records, counted)
                 if declaration(use) not in [declaration(d) for d in left_out]]
    counted_uses = [declaration(c) for c in counted]
    if not privacy["dp_guarantee"]:  # a use of unknown cost the budget lists already says it bounds no total
        left_out = [d for d in left_out if declaration(d) not in counted_uses]
    if left_out:
        raise PrivacyError(f"{budget_path} was composed before the curator's record held the earlier use "
                           f"{'; '.join(repr(d['description'][:80]) for d in left_out)} of these records (declared by "
                           f"{', '.join(sorted({n for d in left_out for n in d['declared_by']}))}), or that use has "
                           f"no known cost, expected a budget that counts it: compose it again (snakemake --forcerun "
                           f"{budget_path}, which refuses a guarantee beside a use of unknown cost), then run again")


def release_row(budget: dict, run: str, privacy: dict, budget_path) -> dict:
    """Where the curator's record stood when ``run``'s release was checked: BUDGET.json's head, and the run's own row.

    A run with a guarantee is released only where BUDGET.json recorded it with exactly the trainings its
    privacy.json composes.  Without that check an older BUDGET.json (one kept by ``--rerun-triggers mtime``, by
    ``--touch``, or written before the run was listed or trained again) let a release out that no budget checked,
    that the curator's record never held, and whose stated total left it out."""
    row = next((row for row in budget.get("runs", []) if row.get("run") == run), {})
    if privacy["dp_guarantee"] and (row.get("curator_sequence") is None or
                                    row.get("trainings") != recorded_trainings(privacy)):
        raise PrivacyError(f"{budget_path} does not record run '{run}' with the trainings its privacy.json composes, "
                           "expected a budget checked by this version after the run's last training: run the same "
                           f"snakemake command again with --forcerun {budget_path}")
    return {**(budget.get("curator_record") or {}), "release_sequence": row.get("curator_sequence")}


def release_budget(budget_path, *, dataset: str, data_path, other_declarations=(), **options) -> dict:
    """:func:`dpsad.privacy.books.release_budget.compose_budget` for the records of ``data_path`` (a ``data.h5``),
    once it holds one row per record (:func:`check_one_row_per_record`), with ``other_declarations`` [(dataset,
    its data.h5, its earlier_use)] of the other datasets of the configuration; ``options`` pass through."""
    check_one_row_per_record(data_path)
    check_runs_read_these_records(options.get("listed", ()), read_attrs(data_path), data_path)
    records = record_sets(dataset, data_path)
    others = [(record_sets(name, path), use) for name, path, use in other_declarations]
    bundled = bundled_uses_of(records, [options.get("declared")])
    try:
        return compose_budget(budget_path, records=records, num_private_records=int(read_attrs(data_path)["n_train"]),
                              also_declared=others + bundled, **options)
    except UnboundedUseError as err:
        own = options.get("declared")
        if not bundled or own and declared_epsilon(own) is None:  # the key would leave the dataset's own use in
            raise
        # the refusal names the use by the dataset it is declared under (mnist5k), which this configuration may lack
        if bundled_among(records.private_rows).all():
            raise PrivacyError(f"{err}; that use is dpsad's own, of the MNIST-5k digits it bundles, which every private "
                               f"record of {dataset} is: no run of them states a guarantee") from err
        raise PrivacyError(f"{err}; that use is dpsad's own, of the MNIST-5k digits it bundles, which {dataset}'s "
                           f"private records hold: data.{dataset}.without_bundled_digits: true leaves them out") from err


def check_runs_read_these_records(listed: list[tuple[str, dict]], attrs, data_path) -> None:
    """Refuse a run with a guarantee whose trainings read another preparation of the private records than
    ``data_path``'s (kept by --touch after it was prepared again): the budget and the curator's record would count
    their use against records they did not read, and miss the records they did.  Likewise a training on another
    preparation's public split (:mod:`dpsad.privacy.books.public_preparation`): it may have read, without noise,
    records now private."""
    for run, privacy in listed:
        components = privacy.get("components", [])
        if privacy.get("dp_guarantee") and (problem := records_problem(components, attrs, str(data_path))
                                            or public_records_problem(components, attrs, str(data_path))):
            raise PrivacyError(f"run '{run}': {problem}")


def check_one_row_per_record(data_path) -> None:
    """Refuse a ``data.h5`` whose private split holds a record twice (two rows with an equal digest of any kind it
    stores), or one its own public split holds (one prepared by an older version, which kept copies): DP-SGD clips
    each row alone, so such a record would be used twice, or without noise."""
    private, public = split_digest_kinds(data_path, "private"), split_digest_kinds(data_path, "public")
    # each stored kind (canonical, as read, perceptual hash): equal digests of any kind are one record
    twice = max(len(kind) - len(as_set(kind)) for kind in private[1:])
    shared = len(as_set(identity_digests(*private)) & as_set(identity_digests(*public)))
    if twice or shared:
        raise PrivacyError(f"{data_path}: {twice} image(s) more than once in the private split and {shared} digest(s) "
                           "shared with the public split, expected one row per record in one split (a file prepared by "
                           "an older version of dpsad?): delete it and run prepare_data again, then every stage after it")
