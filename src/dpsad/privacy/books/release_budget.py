"""One privacy budget over everything released from a set of private records.

Each run's ``privacy.json`` states the guarantee of that release alone.  A
recipient of several releases of the same private records gets their
composition, so the records have one budget: :func:`compose_releases` composes
the released runs' ledger entries (each use of the private records once, by
``uid``: a DP teacher shared by two runs counts once) with every earlier release
of any of those records (the curator's record, :mod:`dpsad.privacy.books.curator_record`,
whatever dataset name they were released under) at the budget's delta, and
refuses, naming the run, the release that would pass the budget.

Assumptions: add/remove adjacency of one record; runs drew their Poisson batches
and noise independently (their mechanisms compose adaptively); a run without a
guarantee releases nothing derived from the private records and adds nothing
here.  A declared earlier use belongs to the records: the curator's record
keeps it, and every later budget over any of those records composes it, once.
One with a known (epsilon, delta) adds by basic composition (its delta is
taken from the budget's, so the checked total delta never passes it); one
without leaves the records no bounded total: it is stated, no run of its
dataset states a guarantee (:func:`unknown_cost_reasons`), and no run of any of
those records is released with one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

from .image_digests import NOT_DETECTED
from ...errors import DpsadError, PrivacyError
from ...files.atomic import write_json
from .curator_record import (NOT_SEEN, active_test_settings, curator_folder, declaration, now_utc, open_books,
                             refuse_conflicts, remember_heads, shown)
from .image_digests import RecordSets
from ..accounting import cached_accountant, delta_problem
from ..stated import recorded_trainings, rounded_up
from .ledger import components_of, unique_entries

SCOPE_ALONE = ("epsilon covers this release alone; every release of the same private records together is "
               "stated in ../BUDGET.json")


class UnboundedUseError(PrivacyError):
    """A run with a guarantee refused because a use of unknown cost covers its records (their total is unbounded)."""


def declared_epsilon(declared: dict | None) -> tuple[float, float] | None:
    """(epsilon, delta) of a declared earlier use (``data.<name>.earlier_use``), or None when not known."""
    if not declared or declared.get("epsilon") is None:
        return None
    return float(declared["epsilon"]), float(declared["delta"])  # the configuration requires delta with epsilon


def unknown_cost_reasons(declared: dict | None, dataset: str) -> list[str]:
    """The verdict's reason for every run of ``dataset`` when ``data.<dataset>.earlier_use`` declares a use of
    unknown cost, else [].  Such records have no bounded total over their uses, and where the use chose the run's
    settings by a score on them (the demo's), not even one release of them is DP: the verdict is false."""
    if not declared or declared_epsilon(declared) is not None:
        return []
    return [f"data.{dataset}.earlier_use declares a use of these records of unknown cost (declared_earlier_use): "
            "their uses have no bounded total, and where a setting was chosen on them not even one release of them "
            "is DP at its accounted epsilon"]


def declared_cost(declarations: list[dict]) -> tuple[float, float]:
    """(epsilon, delta) of every declared earlier use whose cost is known, added by basic composition."""
    known = [declared_epsilon(d) for d in declarations]
    known = [k for k in known if k is not None]
    return sum(k[0] for k in known), sum(k[1] for k in known)


def budget_as_stated(budget: dict) -> dict:
    """A dataset's ``privacy_budget`` as BUDGET.json states it: ``{epsilon, delta, accountant}`` (pld by default)."""
    return {"epsilon": float(budget["epsilon"]), "delta": float(budget["delta"]),
            "accountant": budget.get("accountant", "pld")}


def compose_releases(dataset: str, released: list[tuple[str, dict]], *, budget: dict,
                     num_private_records: int, already_released: list[dict] = (),
                     shared_with: list[str] = (), declared: list[dict] = ()) -> dict:
    """BUDGET.json of ``dataset``: the composition of ``released`` [(run name, privacy.json dict)], in order.

    ``already_released``: the entries of every release made before from any of
    these records (a re-release after a rerun counts both versions: the first
    was shared); ``shared_with``: the other dataset names those releases were
    made under.  ``declared``: every earlier use declared for any of these
    records (``data.<name>.earlier_use`` of this dataset and of every dataset
    that shares a record with it), each once.  ``budget``: ``{epsilon, delta,
    accountant}``: the pipeline's releases are composed at the budget's delta
    less the declared deltas, so that the total delta is the budget's.  Raises
    PrivacyError (one line, naming the run, the budget and the total) as soon
    as a run would bring the total past ``budget['epsilon']``, or when the
    declared deltas leave no delta for the pipeline.
    """
    capped = budget_as_stated(budget)
    epsilon_cap, delta_cap, accountant = capped["epsilon"], capped["delta"], capped["accountant"]
    if problem := delta_problem(delta_cap, num_private_records):
        raise PrivacyError(f"data.{dataset}.privacy_budget.{problem}, expected a smaller delta")
    declared = list(declared)
    claimed = [name for name, privacy in released if privacy.get("dp_guarantee")]
    if claimed and (unknown := [d for d in declared if declared_epsilon(d) is None]):
        # a privacy.json accounted before this rule, or a use declared under another name for the same records
        by = sorted({name for d in unknown for name in d.get("declared_by", [])}) or [dataset]
        raise UnboundedUseError(f"run '{claimed[0]}' states dp_guarantee true, but an earlier use of unknown cost of "
                                f"{dataset}'s private records is declared (data.{by[0]}.earlier_use"
                                f"{' and under ' + ', '.join(by[1:]) if by[1:] else ''}; the curator's record keeps it "
                                "for good): their uses have no bounded total, expected no listed run with a guarantee: "
                                f"remove it from data.{dataset}.release, or declare that use in data.{dataset}.earlier_use "
                                "and account again (--forcerun account)")
    extra_epsilon, extra_delta = declared_cost(declared)
    delta = delta_cap - extra_delta
    if delta <= 0:
        raise PrivacyError(f"the declared earlier uses of {dataset}'s private records total delta {extra_delta:g}, not "
                           f"below data.{dataset}.privacy_budget delta {delta_cap:g}; nothing can be released, expected "
                           f"the budget's delta raised above {extra_delta:g}")
    whose = f"{dataset}'s private records" + (f" (released before as {', '.join(sorted(shared_with))}: the same records)"
                                              if shared_with else "")
    declared_note = f" with the declared earlier uses' epsilon {extra_epsilon:g}" if extra_epsilon else ""
    entries = unique_entries(already_released)
    total = cached_accountant(accountant).epsilon(components_of(entries), delta)
    rows = [{"run": "(released before)", "released": True, "epsilon_total_after": total}] if entries else []
    # nothing with a guarantee listed: nothing to refuse, and a declared use of unknown cost is kept with the records
    if claimed and total + extra_epsilon > epsilon_cap * (1 + 1e-9):
        raise PrivacyError(f"the releases already made from {whose} total epsilon {total + extra_epsilon:.4g} at delta "
                           f"{delta_cap:g}{declared_note}, over data.{dataset}.privacy_budget epsilon "
                           f"{epsilon_cap:g}; nothing more can be released")
    for name, privacy in released:
        if not privacy.get("dp_guarantee"):
            rows.append({"run": name, "released": False, "epsilon_alone": None,
                         "note": "no DP guarantee: only privacy.json and NOT_RELEASED.txt leave results/"})
            continue
        entries = unique_entries(entries + list(privacy["components"]))
        total = cached_accountant(accountant).epsilon(components_of(entries), delta)
        if total + extra_epsilon > epsilon_cap * (1 + 1e-9):
            raise PrivacyError(f"releasing run '{name}' would bring the total over the releases of {whose} to epsilon "
                               f"{total + extra_epsilon:.4g} at delta {delta_cap:g}{declared_note}, over "
                               f"data.{dataset}.privacy_budget epsilon {epsilon_cap:g}; remove it from "
                               f"data.{dataset}.release or raise the budget")
        rows.append({"run": name, "released": True, "epsilon_alone": privacy.get("epsilon"),
                     "delta_alone": privacy.get("delta"), "epsilon_total_after": total})
    statement = (f"Every release of {dataset}'s private training split together, in this folder and every earlier "
                 f"release of any of the same records{' (as ' + ', '.join(sorted(shared_with)) + ')' if shared_with else ''}, "
                 f"is ({rounded_up(total)}, {rounded_up(delta, 6)})-DP with respect to those records ({accountant} "
                 "accounting over the union "
                 "of their ledgers). Stages run by the curator on the private split but not released (sweeps, audits, "
                 "reruns) are not part of this total: see results/<dataset>/spent.json. " + NOT_DETECTED)
    result = {
        "dataset": dataset,
        "budget": capped,
        "epsilon": total,
        "delta": delta,
        "accountant": accountant,
        "num_private_records": num_private_records,
        "runs": rows,
        "components": entries,
        "released_before_as": sorted(shared_with),
        "records_not_detected": NOT_DETECTED,
        "statement": statement + "".join(declared_sentence(d) for d in declared),
        "declared_earlier_uses": declared,
    }
    if any(declared_epsilon(d) is not None for d in declared):
        result["epsilon_with_declared_earlier_use"] = total + extra_epsilon
        result["delta_with_declared_earlier_use"] = delta + extra_delta
    return result


BUDGET_SCOPE = ("the budget caps the releases that share a record with this private split, which the curator's check "
                "composes (results/<dataset>/release_check.json, never released); the total here counts more, and may "
                "pass it")
PUBLIC_SCOPE = ("every release in the curator's records, of these records and of any others: a bound that does not "
                "depend on which records the releases share, so that it says nothing of which records they share")
DECLARED_ANYWHERE = "records the curator holds (these or others)"  # the stated total's: it must not say which
RELEASE_DECISION = ("Whether a release is made depends on its private records: the checks before it refuse a private "
                    "split whose records' earlier releases and declared uses (dpsad's own use of the MNIST-5k digits it "
                    "bundles among them) would, with this release, pass the budget, "
                    "one holding a record an earlier release used as public data, and one whose number of records n "
                    "leaves delta not below 1/n. So the guarantee compares private splits that both pass them: adding "
                    "to the private split a well-formed record that no earlier release or declared use holds changes "
                    "the decision only through n, which every release states; adding one that an earlier release or "
                    "declared use holds can turn a release into a refusal.")


def public_budget(checked: dict, *, all_released: list[dict], all_declared: list[dict]) -> dict:
    """BUDGET.json as released, from the curator's check ``checked`` (:func:`compose_releases`).

    The check composes the releases that share a record with this private split, and that overlap is a function
    of the private records computed without noise: the released total must not depend on it.  It composes
    ``all_released`` instead, every ledger entry of every release in the curator's records (each use once, by
    uid), at the budget's delta less the declared deltas, and adds ``all_declared`` (every declared use of known cost
    in those records) by basic composition: a true bound on every release of these records together, whatever they
    share.  Where the declared uses, other records' among them, take all the budget's delta, the releases are
    composed at half of it and the total delta stated passes the budget's, which caps the check's total, not this
    one (a total delta not below 1/n is said to protect no one record).  Every declared use is named, and one of
    unknown cost is said not to be bounded by the total.  :data:`RELEASE_DECISION` says which neighbouring splits
    the guarantee compares: the checks' refusals depend on the records."""
    budget = checked["budget"]
    entries = unique_entries(all_released)
    extra_epsilon, extra_delta = declared_cost(all_declared)
    if extra_delta < budget["delta"] * (1 - 1e-6):  # the total delta stated is the budget's (a rounding's remainder
        delta, total_delta = budget["delta"] - extra_delta, budget["delta"]  # of it would compose to epsilon inf)
    else:  # the declared uses took it all, other records' among them (the check refuses on these records' own):
        delta = budget["delta"] / 2  # refusing would stop every dataset, so the stated delta passes the budget's
        total_delta = delta + extra_delta
    weak = delta_problem(total_delta, checked["num_private_records"])
    epsilon = cached_accountant(budget["accountant"]).epsilon(components_of(entries), delta)
    runs = [{key: row[key] for key in ("run", "released", "epsilon_alone", "delta_alone", "curator_sequence", "trainings",
                                       "note")
             if key in row} for row in checked["runs"] if row["run"] != "(released before)"]
    statement = (f"Every release of {checked['dataset']}'s private training split together with every other release "
                 f"the curator has recorded ({PUBLIC_SCOPE}) is ({rounded_up(epsilon + extra_epsilon)}, "
                 f"{rounded_up(total_delta, 6)})-DP with respect to any one record ({budget['accountant']} "
                 "accounting over the union of their ledgers" + (", with the declared earlier uses of known cost added"
                                                                  if extra_epsilon or extra_delta else "") +
                 "). Stages run by the curator on the private split but not released (sweeps, audits, reruns) are not "
                 "part of this total. " + NOT_DETECTED)
    # a reader who stops at the first number must not take it for a bound on every use of records that have none
    unbounded = [d["description"] for d in all_declared if declared_epsilon(d) is None]
    no_bound = (f"No total bounds every use of the records the curator holds (these or others): an earlier use of "
                f"unknown cost is declared ({'; '.join(unbounded)}), and the epsilon below counts only the releases "
                "and the uses of known cost. " if unbounded else "")
    result = {"dataset": checked["dataset"], "budget": budget,
              **({"no_bounded_total": no_bound.strip()} if no_bound else {}), "epsilon": epsilon, "delta": delta,
              "accountant": budget["accountant"], "num_private_records": checked["num_private_records"],
              "scope": PUBLIC_SCOPE, "budget_scope": BUDGET_SCOPE, "runs": runs, "records_not_detected": NOT_DETECTED,
              "statement": no_bound + statement + "".join(declared_sentence(d, DECLARED_ANYWHERE) for d in all_declared)
              + (f" This total protects no one record: its {weak}." if weak else "") + " " + RELEASE_DECISION,
              "declared_earlier_uses": all_declared, "release_decision": RELEASE_DECISION}
    if extra_epsilon or extra_delta:
        result["epsilon_with_declared_earlier_use"] = epsilon + extra_epsilon
        result["delta_with_declared_earlier_use"] = delta + extra_delta
    return result


def stated_total(budget: dict) -> tuple[float, float]:
    """(epsilon, delta) a BUDGET.json states over every use of its records it knows: its releases and the
    declared earlier uses of known cost."""
    if "epsilon_with_declared_earlier_use" in budget:
        return float(budget["epsilon_with_declared_earlier_use"]), float(budget["delta_with_declared_earlier_use"])
    return float(budget["epsilon"]), float(budget["delta"])


def declared_sentence(declared: dict | None, whose: str = "these records") -> str:
    """One sentence on a declared earlier use of ``whose`` (``data.<name>.earlier_use``), or ''."""
    if not declared:
        return ""
    known = declared_epsilon(declared)
    cost = (f"its cost, epsilon {rounded_up(known[0], 6)} at delta {rounded_up(known[1], 6)}, adds to the epsilon "
            "above by basic composition"
            if known else "its cost is not known and is NOT included in the epsilon above: the records it covers have "
            "no bounded total")
    by = declared.get("declared_by")
    who = f" (declared with {', '.join(by)})" if by else ""
    return f" The curator declares an earlier use of {whose} outside this pipeline{who}: {declared['description']}; {cost}."


def uses_the_budget_left_out(counted: list[dict], records: RecordSets, curator_dir=None, workspace=None) -> list[dict]:
    """The declared uses covering ``records`` that the curator's records hold now and ``counted`` (the declared
    uses a budget composed, a snapshot) does not hold, or whose cost is unknown: declared since the budget was
    composed, by this workspace or any other.  Opens the records as a release does (:func:`open_books` refuses one
    that went back)."""
    with contextlib.ExitStack() as stack:
        books = open_books(curator_folder(curator_dir), workspace, stack)
        covering = merged_declarations(book.declared_for(records) for book in books.all)
    counted = [declaration(d) for d in counted]
    return [d for d in covering if declaration(d) not in counted or declared_epsilon(d) is None]


def merged_declarations(groups) -> list[dict]:
    """The declared uses of several records, each use once, with every dataset that declared it."""
    found: dict[str, dict] = {}
    for group in groups:
        for declared in group:
            entry = found.setdefault(json.dumps(declaration(declared), sort_keys=True),
                                     {**declaration(declared), "declared_by": []})
            entry["declared_by"] += [n for n in declared.get("declared_by", []) if n not in entry["declared_by"]]
    return list(found.values())


def refuse_replacing_a_release(release_folder: Path, listed: list[tuple[str, dict]]) -> None:
    """A release folder is never replaced by another training: as root Snakemake's write protection does not hold,
    and what was shared would silently differ from what the workspace keeps.  Refuse before anything is recorded."""
    for run, privacy in listed:
        released = release_folder / run / "privacy.json"
        if not released.is_file():
            continue
        if not privacy.get("dp_guarantee"):
            if (release_folder / run / "synthetic.h5").exists():  # what was shared states a guarantee
                raise PrivacyError(f"{release_folder / run} holds a release with a DP guarantee that run '{run}' no "
                                   f"longer has ({'; '.join(privacy.get('reasons', []))[:300]}), expected a release "
                                   "folder never replaced: move that folder out of release/ (it stays counted in the "
                                   "curator's record; its recipients should know its guarantee no longer holds), then "
                                   "run again")
            continue
        try:
            before = sorted(e.get("uid") or "" for e in json.loads(released.read_text()).get("components", []))
        except (OSError, ValueError) as err:
            raise DpsadError(f"{released}: not readable ({err}), expected the privacy.json of a release") from err
        if before != sorted(e.get("uid") or "" for e in privacy.get("components", [])):
            raise PrivacyError(f"{release_folder / run} holds a release of other trainings than results/ now has for "
                               f"run '{run}', expected a release folder never replaced: move that folder out of "
                               "release/ (it stays counted in the curator's record), then run again")


def refuse_trainings_released_for_other_records(books, records: RecordSets, listed: list[tuple[str, dict]]) -> None:
    """Refuse a listed run with a guarantee that builds on a training the curator's record holds as released for
    another set of private records: it read those (a data.h5 prepared again and the training kept past it, e.g. by
    --touch), so counting it against ``records`` would misstate which records it used.  Needs no preparation id, so
    it holds for trainings run before 0.2.9 too (:mod:`dpsad.privacy.books.preparation` for those since)."""
    for run, privacy in listed:
        mine = {c["uid"] for c in privacy.get("components", []) if c.get("private") and c.get("uid")}
        if not privacy.get("dp_guarantee") or not mine:
            continue
        for book in books:
            for row in book.rows("release"):
                body = row.body
                if body["private_records"] != records.private_fingerprint and mine & {e.get("uid") for e in body["entries"]}:
                    raise PrivacyError(f"run '{run}' builds on a training released before as {body['dataset']}/"
                                       f"{body['run']} for other private records than {records.dataset}'s (data.h5 was "
                                       "prepared again and the training kept), expected trainings on these records: "
                                       "run the stages after prepare_data again (snakemake --forcerun prepare_data)")


def compose_budget(budget_path, *, records: RecordSets, num_private_records: int, listed: list[tuple[str, dict]],
                   budget: dict, curator_dir=None, declared: dict | None = None, workspace=None,
                   check_path=None, also_declared: list[tuple[RecordSets, dict]] = ()) -> dict:
    """Check the runs ``listed`` [(run, privacy.json dict)] against the budget of ``records``, record them in the
    curator's record and write ``BUDGET.json``; returns the curator's check (:func:`compose_releases`), with
    ``created`` set to the record's path when this release created it.

    Inside the transactions of every record :func:`dpsad.privacy.books.curator_record.open_books` holds (which
    refuses a record that went back, forked, is gone, or is new to this user): keep ``declared`` (the dataset's
    earlier use; one of unknown cost in a transaction of its own first, so that no refusal rolls it back) and
    ``also_declared`` (the earlier uses other datasets of the same configuration declare, with their records: this
    budget may run first, and their records may be these under another name); refuse
    records used on the other side of the private/public line; compose every earlier release
    and declared use sharing a record with this private split, whatever its dataset's name, with the listed runs
    and refuse past ``budget``; record each listed run with a guarantee; write ``BUDGET.json``, whose total depends
    on no private record (:func:`public_budget`), and the check (which does) to the curator's ``check_path``.  All
    before any release folder is built: a release that fails afterwards is still counted (the safe side).
    ``BUDGET.json`` is written only once the rows are committed."""
    budget_path = Path(budget_path)
    created = None
    uses = ([(records, declared)] if declared else []) + list(also_declared)
    if unknown := [(use_records, use) for use_records, use in uses if declared_epsilon(use) is None]:
        # kept before the refusals below, which would roll it back: it makes every later release of these records
        # stricter (a split refused for its records, checked first, keeps nothing)
        with contextlib.ExitStack() as stack:
            books = open_books(curator_folder(curator_dir), workspace, stack)
            refuse_conflicts(books, records)  # a split refused for its records keeps nothing, as below
            for use_records, use in unknown:
                books.in_use.declare(use_records, use)
            if books.in_use is not books.home:  # as below: the user's register notes the row (or the record) it adds
                books.home.note_seen(books.in_use.head(), None, books.in_use.released_sets(), books.answered())
            created = str(books.in_use.path) if books.in_use.created else None
            head = dataclasses.replace(books.in_use.head(), fingerprints=tuple(books.in_use.released_sets()))
            answered = books.answered()
        remember_heads([head], answered)  # a restore that drops the row is then seen, as after a release
    refuse_replacing_a_release(budget_path.parent, listed)
    with contextlib.ExitStack() as stack:
        books = open_books(curator_folder(curator_dir), workspace, stack)
        curator = books.in_use
        for use_records, use in uses:
            curator.declare(use_records, use)
        refuse_conflicts(books, records)
        refuse_trainings_released_for_other_records(books.all, records, listed)
        earlier = [row for book in books.all for row in book.releases_sharing_records(records)]
        checked = compose_releases(
            records.dataset, listed, budget=budget, num_private_records=num_private_records,
            already_released=[e for row in earlier for e in row["entries"]],
            shared_with=sorted({row["dataset"] for row in earlier} - {records.dataset}),
            declared=merged_declarations(book.declared_for(records) for book in books.all))
        checked["released_before"] = sorted({f"{row['dataset']}/{row['run']}" for row in earlier})
        checked["private_records"] = records.private_fingerprint  # which records it capped (the release compares)
        checked["public_records"] = records.public_fingerprint  # and which it recorded as public beside them
        sequences = {run: curator.record(records, run, privacy["components"])
                     for run, privacy in listed if privacy.get("dp_guarantee")}
        trainings = {run: recorded_trainings(privacy) for run, privacy in listed}
        for row in checked["runs"]:
            if row["run"] in sequences:
                row["curator_sequence"], row["trainings"] = sequences[row["run"]], trainings[row["run"]]
        checked["curator_record"] = {**curator.head().as_dict(), "location": shown(curator.path)}
        checked["other_curator_records"] = [{"history": book.history, "location": shown(book.path)}
                                            for book in books.all if book is not curator]
        checked["created"] = created or (str(curator.path) if curator.created else None)
        released = public_budget(
            checked, all_released=[e for book in books.all for row in book.rows("release") for e in row.body["entries"]],
            all_declared=merged_declarations([{**row.body["declared"], "declared_by": [row.body["dataset"]]}]
                                             for book in books.all for row in book.rows("declared")))
        released["curator_record"] = checked["curator_record"]
        # what each dataset of the configuration declared when this budget was composed: a release built later
        # checks it against the configuration then (dpsad.release_folder.check_budget_counts_the_configured_uses)
        # (the first use of a name: this dataset's, then the configuration's, then the package's of its bundled records)
        released["composed_with_uses"] = {}
        for use_records, use in uses:
            released["composed_with_uses"].setdefault(use_records.dataset, declaration(use))
        released["records_not_seen"] = NOT_SEEN
        # a snapshot: another dataset's release of some of these records, recorded later in the same run, is in
        # that release's BUDGET.json, not in this one (refusing instead would stop every multi-dataset release)
        released["statement"] += (f" This total is as of row {curator.head().sequence} of the curator's record "
                                  f"{shown(curator.path)} ({now_utc()}), and of every other record it names as they "
                                  "stood then: a release recorded after it states its own total. " + NOT_SEEN)
        if settings := active_test_settings():  # the release checks that it runs under the same ones
            released["statement"] += " " + " ".join(settings)
            released["test_settings"] = settings
        total = stated_total(released)
        answered = books.answered()
        for book in books.all:  # what a later declaration of its loss must at least answer
            if book is not books.home:
                books.home.note_seen(book.head(), total, book.released_sets(), answered)
        heads = [dataclasses.replace(book.head(), total=total, fingerprints=tuple(book.released_sets()))
                 for book in books.all]
    # Written once the rows are committed, so that BUDGET.json never names a row the record lacks (a job killed, or a
    # commit failed, under --keep-incomplete); a failure from here on leaves the release counted (the safe side).
    remember_heads(heads, answered)
    try:
        write_json(budget_path, released)
        if check_path is not None:
            write_json(check_path, {**checked, "scope": "curator only: computed from which records the releases "
                                                         "share, never released"})
    except OSError as err:
        raise DpsadError(f"{budget_path} could not be written ({err}); the release is recorded in the curator's record "
                         "and counts toward every budget of its records, expected room and permission to write there: "
                         "fix it, then run again (it is not recorded twice)") from err
    return checked
