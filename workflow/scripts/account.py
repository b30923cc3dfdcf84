"""account: compose every ledger entry upstream of a run into privacy.json and an epsilon plot."""
import dpsad.jobs.paused_collector  # noqa: F401  first: the collector waits while the job's libraries load
from functools import partial

from dpsad.files.atomic import write_json
from dpsad.data.bundled_uses import BUNDLED_REASON, bundled_digits_held
from dpsad.data.datafile import public_data_sentence, read_attrs, split_digest_kinds
from dpsad.plots import epsilon_curve
from dpsad.privacy.books.release_budget import declared_sentence, unknown_cost_reasons
from dpsad.privacy.books.curator_record import active_test_settings
from dpsad.privacy.books.preparation import records_problem
from dpsad.privacy.books.public_preparation import public_records_problem
from dpsad.privacy.books.ledger import epsilon_curve as curve_points, label_set_reasons, read_ledgers, verdict
from dpsad.jobs.stage import run_stage


def main(snakemake, log):
    p = snakemake.params
    entries = read_ledgers([snakemake.input.ledger])
    attrs = read_attrs(snakemake.input.data)
    decide = partial(verdict, entries, delta=p.delta, accountant=p.accountant, target_epsilon=p.target_epsilon,
                     num_private_records=int(attrs["n_train"]))
    reasons = label_set_reasons(attrs, snakemake.wildcards.dataset)
    if stale := records_problem(entries, attrs, snakemake.input.data):  # a training kept past a new data.h5
        reasons.append(stale)
    if stale := public_records_problem(entries, attrs, snakemake.input.data):  # its public split's, alike
        reasons.append(stale)
    result = decide(extra_reasons=reasons)  # the run's own accounting first: past its target it fails, in any case
    unknown = unknown_cost_reasons(p.earlier_use, snakemake.wildcards.dataset)
    # read, not a param: reruns no verdict
    if bundled_digits_held(split_digest_kinds(snakemake.input.data, "private"), p.earlier_use):
        unknown.append(BUNDLED_REASON)
    if unknown:
        result = decide(extra_reasons=reasons + unknown)
    result["scope"] = ("The guarantee covers the release folder (synthetic.h5, privacy.json, generator.pt) with respect "
                       "to the private training split. Everything else under results/ and logs/ (loss curves, "
                       "evaluation metrics, cluster reports) is computed on private records without noise and is "
                       "for the curator only.")
    result["public_data"] = public_data_sentence(attrs)
    if settings := active_test_settings():  # read, not a param: a user's privacy.json is as before
        result["test_settings"] = settings
    if p.earlier_use:
        result["declared_earlier_use"] = {**p.earlier_use, "note": declared_sentence(p.earlier_use).strip()}
    points = curve_points(entries, delta=p.delta, accountant=p.accountant) if result["dp_guarantee"] else []
    steps = max([e["steps"] for e in entries if e["private"]] or [0])
    result["epsilon_curve"] = [{"fraction_of_steps": f, "epsilon": e} for f, e in points]
    write_json(snakemake.output.privacy, result)
    title = f"{snakemake.wildcards.run}: " + ("dp_guarantee true" if result["dp_guarantee"] else "NO DP guarantee")
    epsilon_curve(points, steps, p.target_epsilon, snakemake.output.plot, title)
    log.info("verdict: dp_guarantee=%s epsilon=%s reasons=%s", result["dp_guarantee"], result["epsilon"], result["reasons"])


run_stage(snakemake, main)  # noqa: F821
