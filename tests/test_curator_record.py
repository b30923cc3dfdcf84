"""The curator's record: one per curator, under the home the user database names, which no environment moves; it
cannot silently go back, fork, be left out or be replaced; every number the curator types is checked.

Each sequence that found a release stating a total it did not have ends here with the later release refused, or
with its statement composing every earlier release: in-process through ``release_budget`` (the rule's function) and
``dpsad.curator`` (the command line), and through Snakemake and the printed commands in real processes (e2e)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import indexed_images
from test_records_budget import dp_run, release_budget, settings
from workflow_helpers import ROOT, SNAKEMAKE, forget_releases, run_snakemake, workdir

from dpsad.curator import main as curator_main
from dpsad.data.datafile import prepare
from dpsad.errors import DpsadError, PrivacyError
from dpsad.privacy.books.curator_record import (TEST_HOME_ENV, CuratorRecord, RecordUnreadable, curator_folder,
                                                heads_files, home_folder)
from dpsad.release_folder import network_file_system

BUDGET = {"epsilon": 10.0, "delta": 1e-5, "accountant": "pld"}
ROOMY = {**BUDGET, "epsilon": 40.0}


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "records.npz"
    np.savez(path, images=indexed_images(400), labels=np.arange(400) % 4)
    return path


def workspace(root: Path, source: dict, dataset: str = "toy") -> Path:
    prepare(source, dataset, root / "results" / dataset / "data.h5")
    return root


def release(ws: Path, *, dataset: str = "toy", runs=None, budget=BUDGET, **options) -> dict:
    """release_budget in ``ws``: the runs ``runs`` [(name, privacy.json)], one new DP run by default."""
    return release_budget(ws / "release" / dataset / "BUDGET.json", dataset=dataset,
                          data_path=ws / "results" / dataset / "data.h5", listed=runs or [("dp", dp_run())],
                          budget=budget, workspace=ws, **options)


def refused(ws: Path, **options) -> str:
    with pytest.raises(PrivacyError) as err:
        release(ws, **options)
    assert "\n" not in str(err.value)
    return str(err.value)


def over_budget(message: str) -> bool:
    return message.startswith(("the releases already made from", "releasing run 'dp' would bring the total"))


def rows(folder=None) -> list:
    with CuratorRecord(folder or home_folder()).transaction(create=False) as record:
        return record.rows()


@pytest.mark.e2e  # starts a Python process
def test_the_record_follows_the_user_database_not_home_or_xdg(tmp_path):
    import pwd

    env = {k: v for k, v in os.environ.items() if k != TEST_HOME_ENV}
    code = "from dpsad.privacy.books.curator_record import home_folder; print(home_folder())"
    for moved in ({"HOME": str(tmp_path)}, {"XDG_DATA_HOME": str(tmp_path / "d"), "XDG_STATE_HOME": str(tmp_path / "s"),
                                            "DPSAD_CURATOR_DIR": str(tmp_path / "team")}):
        out = subprocess.run([sys.executable, "-c", code], env={**env, **moved}, capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == str(Path(pwd.getpwuid(os.geteuid()).pw_dir) / ".local" / "share" / "dpsad")
    with pytest.raises(DpsadError, match="curator_dir 'curator' is a relative path, expected an absolute one"):
        curator_folder("curator")
    assert curator_folder("~/team") == Path(os.environ[TEST_HOME_ENV]) / "team"


def test_a_second_workspace_a_copy_and_a_cleaned_one_all_compose_with_the_first(tmp_path, npz):
    first_ws = workspace(tmp_path / "first", settings(npz))
    first = release(first_ws)
    assert 5.0 < first["epsilon"] <= 10.0 and first["released_before"] == []
    assert first["created"] == str(home_folder() / "curator.sqlite")
    clone = workspace(tmp_path / "clone", settings(npz))  # a fresh clone: the same source prepared again
    assert over_budget(refused(clone))
    roomy = release(clone, budget=ROOMY)
    assert roomy["released_before"] == ["toy/dp"] and roomy["epsilon"] > 1.2 * first["epsilon"] and not roomy["created"]
    copy = tmp_path / "copy"  # `cp -a`, then `git clean -fdX`
    shutil.copytree(first_ws, copy, symlinks=True)
    shutil.copyfile(ROOT / ".gitignore", copy / ".gitignore")
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    subprocess.run(["git", "-C", str(copy), "clean", "-q", "-fdX"], check=True)
    assert over_budget(refused(workspace(copy, settings(npz))))
    assert [row.body["run"] for row in rows() if row.kind == "release"] == ["dp", "dp"]


def test_a_refused_first_release_leaves_the_next_one_to_say_it_created_the_record(tmp_path, npz, capsys):
    """Review: a first release refused (here past its budget) left an empty database file, so the release that
    then wrote the first rows did not say that it created the curator's record (nor to back it up)."""
    ws = workspace(tmp_path / "ws", settings(npz))
    assert over_budget(refused(ws, runs=[("dp", dp_run(sigma=0.3))]))
    assert (home_folder() / "curator.sqlite").stat().st_size == 0  # read as no record, not as a damaged one:
    with pytest.raises(RecordUnreadable, match="no curator's record at"):
        rows()
    assert curator_main(["show"]) == 0 and "no curator's record at" in capsys.readouterr().out
    assert release(ws)["created"] == str(home_folder() / "curator.sqlite") and len(rows()) == 1
    assert not release(ws, budget=ROOMY, runs=[("dp2", dp_run())])["created"]


def test_a_restored_backup_is_refused_until_the_newer_record_is_back_or_what_it_lost_is_declared(tmp_path, npz, capsys):
    ws = workspace(tmp_path / "ws", settings(npz))
    big = {**BUDGET, "epsilon": 20.0}
    release(ws, runs=[("r1", dp_run(sigma=0.9))], budget=big)
    database = home_folder() / "curator.sqlite"
    shutil.copyfile(database, tmp_path / "backup.sqlite")
    r2 = release(ws, runs=[("r2", dp_run(sigma=0.9))], budget=big)
    shutil.copyfile(database, tmp_path / "newer.sqlite")
    shutil.copyfile(tmp_path / "backup.sqlite", database)  # the restore
    message = refused(ws, runs=[("r3", dp_run(sigma=0.9))], budget=big)
    assert "ends at row 1, but" in message and "saw row 2 of it" in message and "declare-lost" in message
    shutil.copyfile(tmp_path / "newer.sqlite", database)  # way back 1: the newer database put back
    r3 = release(ws, runs=[("r3", dp_run(sigma=0.9))], budget=big)
    assert r3["released_before"] == ["toy/r1", "toy/r2"] and r3["epsilon"] > r2["epsilon"]
    shutil.copyfile(tmp_path / "backup.sqlite", database)  # way back 2: it is lost, and declared
    refused(ws, runs=[("r4", dp_run(sigma=0.9))], budget=big)
    stated = json.loads((ws / "release" / "toy" / "BUDGET.json").read_text())["epsilon"]
    data = str(ws / "results" / "toy" / "data.h5")
    declare = ["declare-lost", "--data", data, "--delta", "1e-5", "--description", "r2, r3", "--workspace", str(ws)]
    for bad in ("-5", "nan", "inf"):  # every number the curator types is checked
        assert curator_main([*declare, "--epsilon", bad]) == 1
        assert capsys.readouterr().err.startswith("error: declare-lost: epsilon")
    assert curator_main([*declare, "--epsilon", "0"]) == 1  # less than a witness stated
    assert f"expected at least epsilon {stated:g}" in capsys.readouterr().err
    assert len(rows()) == 1  # no refused command changed the record
    assert curator_main([*declare, "--epsilon", str(stated)]) == 0
    assert "needs a larger delta than 1e-05" in capsys.readouterr().out
    with pytest.raises(PrivacyError, match="expected the budget's delta raised above 1e-05"):
        release(ws, runs=[("r4", dp_run(sigma=0.9))], budget=big)
    shutil.copyfile(database, tmp_path / "declared.sqlite")
    after = release(ws, runs=[("r4", dp_run(sigma=0.9))], budget={**big, "epsilon": 40.0, "delta": 2e-5})
    assert after["epsilon_with_declared_earlier_use"] == pytest.approx(after["epsilon"] + stated)
    budget = json.loads((ws / "release" / "toy" / "BUDGET.json").read_text())
    assert budget["delta_with_declared_earlier_use"] == pytest.approx(2e-5)  # never above the budget's delta
    # third review: the declaration answers the lost heads exactly, not every later row up to their number
    shutil.copyfile(tmp_path / "declared.sqlite", database)  # r4's row lost again
    assert "ends at row 2, but" in refused(ws, runs=[("r5", dp_run(sigma=0.9))], budget={**big, "epsilon": 80.0,
                                                                                        "delta": 2e-5})


@pytest.mark.parametrize("team", [False, True])
def test_a_record_restored_again_after_a_declared_loss_is_refused(tmp_path, npz, team):
    """Review: the heads file (the user's own record) and the register (a team's) kept the furthest row seen, so
    after a loss was declared they went on naming the answered row: a second restore, which dropped a release
    made after the declaration, went unseen and the next release stated a total without it."""
    folder = tmp_path / "team" if team else home_folder()
    where = {"curator_dir": str(folder)} if team else {}
    database = folder / "curator.sqlite"
    roomy = {**ROOMY, "delta": 2e-5}
    stated = release(workspace(tmp_path / "a", settings(npz)), runs=[("r1", dp_run(sigma=3.0))], budget=roomy, **where)
    shutil.copyfile(database, tmp_path / "first-backup.sqlite")
    for name in ("b", "c", "c2"):  # more rows lost than are written after the declaration
        stated = release(workspace(tmp_path / name, settings(npz)), runs=[(name, dp_run(sigma=3.0))], budget=roomy,
                         **where)
    shutil.copyfile(tmp_path / "first-backup.sqlite", database)  # restored: rows 2 to 4 lost, and declared
    declarer = workspace(tmp_path / "d", settings(npz))
    assert curator_main(["declare-lost", "--data", str(declarer / "results" / "toy" / "data.h5"), "--epsilon",
                         str(stated["epsilon"]), "--delta", str(stated["delta"]), "--description", "b, c, c2", "--workspace",
                         str(declarer), *(["--curator-dir", str(folder)] if team else [])]) == 0
    shutil.copyfile(database, tmp_path / "nightly.sqlite")
    roomier = {**roomy, "delta": 2 * stated["delta"]}  # the declaration takes the stated delta
    release(workspace(tmp_path / "e", settings(npz)), runs=[("e", dp_run(sigma=3.0))], budget=roomier, **where)
    shutil.copyfile(tmp_path / "nightly.sqlite", database)  # restored again: e's row lost
    if team:  # the register alone witnesses a team's record
        heads_files()[0].unlink()
    message = refused(workspace(tmp_path / "f", settings(npz)), runs=[("f", dp_run(sigma=3.0))], budget=roomier,
                      **where)
    assert "ends at row 2, but" in message and "saw row 3 of it" in message


def test_a_copy_used_apart_a_deleted_record_and_a_moved_team_record_are_refused(tmp_path, npz):
    ws = workspace(tmp_path / "ws", settings(npz))
    team = tmp_path / "team"
    release(ws, curator_dir=str(team), budget=ROOMY)
    shutil.copytree(team, tmp_path / "copy")
    release(ws, curator_dir=str(team), budget=ROOMY)
    # the copy, used from its own folder, then the register: the copy forked from the team record
    assert "saw row 2 of it" in refused(ws, curator_dir=str(tmp_path / "copy"), budget=ROOMY)
    shutil.move(team, tmp_path / "moved")  # gone from where it was seen: the user's own record still knows it
    assert "cannot be read there" in refused(ws, budget=ROOMY)
    shutil.move(tmp_path / "moved", team)
    assert release(ws, budget=ROOMY)["released_before"] == ["toy/dp"]  # composed though not in use
    scratch = tmp_path / "scratch"  # a record that never held a row can go
    release(ws, runs=[("nothing", {"dp_guarantee": False})], curator_dir=str(scratch), budget={**ROOMY, "epsilon": 60.0})
    shutil.rmtree(scratch)
    release(ws, budget={**ROOMY, "epsilon": 60.0})


def test_the_users_own_record_deleted_restored_alone_or_copied_elsewhere_is_refused(tmp_path, npz):
    """Review: the register lived only inside the record, so a fresh workspace after the record was deleted or
    restored alone started from zero; a copy of it adopted as a team record forked without a word."""
    release(workspace(tmp_path / "a", settings(npz)), budget=ROOMY)
    database = home_folder() / "curator.sqlite"
    shutil.copyfile(database, tmp_path / "backup.sqlite")
    release(workspace(tmp_path / "b", settings(npz)), budget=ROOMY)
    shutil.copyfile(database, tmp_path / "newer.sqlite")
    shutil.copyfile(tmp_path / "backup.sqlite", database)  # restored alone
    assert "ends at row 1, but" in refused(workspace(tmp_path / "c", settings(npz)), budget=ROOMY)
    shutil.copyfile(tmp_path / "newer.sqlite", database)
    (tmp_path / "team").mkdir()  # a copy of it as a team's record
    shutil.copyfile(tmp_path / "newer.sqlite", tmp_path / "team" / "curator.sqlite")
    assert curator_main(["adopt", "--curator-dir", str(tmp_path / "team")]) == 1
    assert "is a copy of this user's own record" in refused(workspace(tmp_path / "e", settings(npz)),
                                                           curator_dir=str(tmp_path / "team"), budget=ROOMY)
    database.unlink()  # deleted
    assert "cannot be read there" in refused(workspace(tmp_path / "d", settings(npz)), budget=ROOMY)


def test_a_lost_record_is_declared_at_least_at_what_was_stated_and_adopt_never_overrules_a_witness(tmp_path, npz,
                                                                                                     monkeypatch, capsys):
    """Second review: the user's own record deleted could be declared lost at epsilon 0 on unrelated data; adopt
    overwrote the heads file's evidence that a team record forked."""
    ws = workspace(tmp_path / "ws", settings(npz))
    stated = release(ws, runs=[("r1", dp_run(sigma=0.7))], budget=ROOMY)["epsilon"]
    (home_folder() / "curator.sqlite").unlink()
    fresh = workspace(tmp_path / "fresh", settings(npz))
    other = tmp_path / "other.npz"
    np.savez(other, images=indexed_images(400, seed=9), labels=np.arange(400) % 4)
    unrelated = workspace(tmp_path / "other", settings(other), "other") / "results" / "other" / "data.h5"
    declare = ["declare-lost", "--delta", "1e-5", "--description", "r1, lost", "--workspace", str(fresh)]
    assert curator_main([*declare, "--data", str(unrelated), "--epsilon", str(stated)]) == 1
    assert "record set(s) that no --data holds" in capsys.readouterr().err
    data = str(fresh / "results" / "toy" / "data.h5")
    assert curator_main([*declare, "--data", data, "--epsilon", "0"]) == 1
    assert f"expected at least epsilon {stated:g}" in capsys.readouterr().err
    assert curator_main([*declare, "--data", data, "--epsilon", str(stated)]) == 0
    after = release(fresh, runs=[("r2", dp_run(sigma=0.7))], budget={**ROOMY, "delta": 2e-5})
    assert after["epsilon_with_declared_earlier_use"] >= after["epsilon"] + stated - 1e-9
    # a team record restored and written by another user; this user's own record gone: adopt still refuses it
    team = tmp_path / "team"
    release(ws, runs=[("t1", dp_run(sigma=3.0))], curator_dir=str(team), budget={**ROOMY, "delta": 2e-5})
    shutil.copyfile(team / "curator.sqlite", tmp_path / "team-backup.sqlite")
    release(ws, runs=[("t2", dp_run(sigma=0.7))], curator_dir=str(team), budget={**ROOMY, "epsilon": 80.0, "delta": 2e-5})
    shutil.copyfile(tmp_path / "team-backup.sqlite", team / "curator.sqlite")
    own = os.environ[TEST_HOME_ENV]
    for variable in (TEST_HOME_ENV, "HOME"):  # another user
        monkeypatch.setenv(variable, str(tmp_path / "user2"))
    assert curator_main(["adopt", "--curator-dir", str(team)]) == 0
    release(workspace(tmp_path / "b", settings(npz), "b"), dataset="b", runs=[("t3", dp_run(sigma=3.0))],
            curator_dir=str(team), budget={**ROOMY, "epsilon": 80.0})
    for variable in (TEST_HOME_ENV, "HOME"):
        monkeypatch.setenv(variable, own)
    (home_folder() / "curator.sqlite").unlink()
    capsys.readouterr()
    assert curator_main(["adopt", "--curator-dir", str(team)]) == 1
    assert "adopt: row 2 of the curator's record" in capsys.readouterr().err


def test_an_earlier_versions_register_names_records_that_still_count(tmp_path, npz, monkeypatch):
    """Review: after an upgrade, the records an earlier version used (its $XDG_STATE_HOME register) were left out."""
    old = tmp_path / "old-record"
    release(workspace(tmp_path / "a", settings(npz)), curator_dir=str(old), budget=ROOMY)
    with CuratorRecord(old).transaction() as record:
        head = record.head()
    register = tmp_path / "state" / "dpsad" / "curator-heads.json"
    register.parent.mkdir(parents=True)
    register.write_text(json.dumps({head.history: {"sequence": head.sequence, "head": head.digest,
                                                   "location": head.location, "rows": []}}))
    monkeypatch.setenv(TEST_HOME_ENV, str(tmp_path / "new-home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert release(workspace(tmp_path / "b", settings(npz)), budget=ROOMY)["released_before"] == ["toy/dp"]
    # the same register where the earlier version put it by $HOME, read whatever the variables now say
    monkeypatch.setenv(TEST_HOME_ENV, str(tmp_path / "third-home"))
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "earlier-home"))
    shutil.copytree(tmp_path / "state", tmp_path / "earlier-home" / ".local" / "state")
    assert release(workspace(tmp_path / "c", settings(npz)), budget=ROOMY)["released_before"] == ["toy/dp"]


@pytest.mark.e2e  # starts a Python process
def test_a_record_new_to_this_user_is_adopted_by_the_printed_command_and_adopt_drops_nothing(tmp_path, npz,
                                                                                            monkeypatch):
    team, own = tmp_path / "team", os.environ[TEST_HOME_ENV]
    ws1, ws2 = (workspace(tmp_path / name, settings(npz), name) for name in ("a", "b"))
    release(ws1, dataset="a", budget=ROOMY)  # user 1: one release in their own record, one in the team's
    release(ws1, dataset="a", curator_dir=str(team), budget=ROOMY)
    for variable in (TEST_HOME_ENV, "HOME"):  # another user
        monkeypatch.setenv(variable, str(tmp_path / "user2"))
    message = refused(ws2, dataset="b", curator_dir=str(team), budget=ROOMY)
    command = message.split("say so: ")[1]
    assert command == f"python -m dpsad.curator adopt --curator-dir {team}"
    done = subprocess.run([sys.executable, *command.split()[1:]], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True)
    assert done.returncode == 0 and f"now knows {team / 'curator.sqlite'} at row 1" in done.stdout, done.stderr
    assert release(ws2, dataset="b", curator_dir=str(team), budget=ROOMY)["released_before"] == ["a/dp"]
    for variable in (TEST_HOME_ENV, "HOME"):  # user 1, in a fresh clone, curator_dir unset
        monkeypatch.setenv(variable, own)
    fresh = workspace(tmp_path / "fresh", settings(npz), "c")
    assert release(fresh, dataset="c", budget={**ROOMY, "epsilon": 80.0})["released_before"] == ["a/dp", "b/dp"]
    # a team record restored from a backup: adopt refuses it, as the release does
    shutil.copyfile(team / "curator.sqlite", tmp_path / "team-backup.sqlite")
    release(ws1, dataset="a", curator_dir=str(team), budget={**ROOMY, "epsilon": 80.0})
    shutil.copyfile(tmp_path / "team-backup.sqlite", team / "curator.sqlite")
    assert curator_main(["adopt", "--curator-dir", str(team)]) == 1


def test_the_commands_answer_in_one_line_and_show_reads_a_read_only_record(tmp_path, npz, capsys):
    assert curator_main(["show"]) == 0 and "no curator's record at" in capsys.readouterr().out
    release(workspace(tmp_path / "ws", settings(npz)))
    odd = tmp_path / "a#b?c"
    release(tmp_path / "ws", curator_dir=str(odd), budget=ROOMY)
    assert curator_main(["show", "--curator-dir", str(odd)]) == 0 and "release of toy/dp" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("a")) == ["a#b?c"]
    database = home_folder() / "curator.sqlite"
    database.chmod(0o444)
    home_folder().chmod(0o555)
    try:
        assert curator_main(["show"]) == 0 and "release of toy/dp" in capsys.readouterr().out
    finally:
        home_folder().chmod(0o755)
        database.chmod(0o644)
    (tmp_path / "file").write_text("")
    for argv in (["show", "--curator-dir", str(tmp_path / "file")], ["adopt"], ["adopt", "--curator-dir", "rel"],
                 ["declare-lost", "--data", str(tmp_path / "ws" / "results" / "toy" / "data.h5"), "--epsilon", "1",
                  "--delta", "1e-5", "--description", "x", "--workspace", str(tmp_path / "ws")]):
        assert curator_main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, argv


def test_a_full_disk_is_one_line_and_never_leaves_a_release_uncounted(tmp_path, npz, monkeypatch):
    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, budget=ROOMY)

    def full(*args):
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as patch:
        patch.setattr(CuratorRecord, "append", full)
        with pytest.raises(DpsadError, match="database or disk is full; nothing was recorded") as err:
            release(ws, budget=ROOMY)
    assert "\n" not in str(err.value) and len(rows()) == 1

    def no_space(*args):
        raise OSError(28, "No space left on device")

    before = (ws / "release" / "toy" / "BUDGET.json").read_text()
    monkeypatch.setattr("dpsad.privacy.books.release_budget.write_json", no_space)
    with pytest.raises(DpsadError, match="could not be written .*the release is recorded") as err:
        release(ws, budget=ROOMY)
    assert "\n" not in str(err.value) and len(rows()) == 2  # counted: BUDGET.json comes after the commit
    assert (ws / "release" / "toy" / "BUDGET.json").read_text() == before  # the last one stands, a witness of row 1


def test_budget_json_is_written_only_once_its_rows_are_committed(tmp_path, npz, monkeypatch):
    """Review: BUDGET.json was written inside the transaction, so a job killed before the commit (or a failed
    commit) under --keep-incomplete left a BUDGET.json naming rows the record never kept."""
    import dpsad.privacy.books.release_budget as module

    ws = workspace(tmp_path / "ws", settings(npz))
    budget = ws / "release" / "toy" / "BUDGET.json"
    real_write, committed = module.write_json, []

    def committed_rows() -> int:  # as another process reads the record
        with sqlite3.connect((home_folder() / "curator.sqlite").as_uri() + "?mode=ro", uri=True) as db:
            return db.execute("SELECT COUNT(*) FROM rows").fetchone()[0]

    def write_json(path, data):
        if Path(path) == budget:
            committed.append(committed_rows())
            if len(committed) == 1:
                raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(module, "write_json", write_json)
    run = dp_run()
    with pytest.raises(DpsadError, match="could not be written .*the release is recorded in the curator's record"):
        release(ws, runs=[("dp", run)], budget=ROOMY)
    assert committed == [1] and len(rows()) == 1 and not budget.exists()  # counted (the safe side), no BUDGET.json
    release(ws, runs=[("dp", run)], budget=ROOMY)  # the retry
    assert committed == [1, 1] and len(rows()) == 1  # not recorded twice
    assert json.loads(budget.read_text())["epsilon"] == pytest.approx(run["epsilon"], rel=1e-6)  # nor counted twice
    assert "This total is as of row 1 of the curator's record ~/" in json.loads(budget.read_text())["statement"]


@pytest.mark.e2e
def test_an_unusable_record_folder_is_one_line_before_any_job_a_dry_run_too(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "ws").mkdir()
    cwd = workdir(tmp_path / "ws")
    env = {**os.environ, TEST_HOME_ENV: str(tmp_path / "home")}
    for value, expected in ((tmp_path / "file" / "record", f"{tmp_path / 'file'} is a file, expected a folder"),
                            ("record", "curator_dir = 'record', expected an absolute path")):
        done = run_snakemake(cwd, ["-n", "all", "--config", f"curator_dir={value}"], env)
        assert done.returncode == 1 and expected in done.stderr, done.stderr[-2000:]
        assert not list(cwd.glob("results/*/*.h5")) and not (tmp_path / "home" / ".local").exists()


def test_a_retrained_run_never_replaces_its_released_folder(tmp_path, npz):
    ws = workspace(tmp_path / "ws", settings(npz))
    listed = [("kept", dp_run())]
    release(ws, runs=listed, budget=ROOMY)
    folder = ws / "release" / "toy" / "kept"
    folder.mkdir()
    (folder / "privacy.json").write_text(json.dumps(listed[0][1]))
    release(ws, runs=listed, budget=ROOMY)  # the same training: nothing to replace
    message = refused(ws, runs=[("kept", dp_run())], budget=ROOMY)
    assert "holds a release of other trainings" in message and len(rows()) == 1


RELEASE_AT_ONCE = """
import json, sys, time
from pathlib import Path
from dpsad.errors import PrivacyError
from dpsad.data.datafile import read_attrs
from dpsad.privacy.books.preparation import stamped
from dpsad.release_folder import release_budget
ws, curator, start = Path(sys.argv[1]), sys.argv[2] or None, Path(sys.argv[3])
(ws / "ready").touch()
while not start.exists():
    time.sleep(0.01)
try:
    run = json.loads((ws / "run.json").read_text())
    stamped(run["components"], read_attrs(ws / "results" / "toy" / "data.h5"))  # trained on this preparation
    release_budget(ws / "release" / "toy" / "BUDGET.json", dataset="toy", data_path=ws / "results" / "toy" / "data.h5",
                   listed=[("dp", run)],
                   budget={"epsilon": 10.0, "delta": 1e-5, "accountant": "pld"}, curator_dir=curator, workspace=ws)
except PrivacyError as err:
    print("refused:", err)
    sys.exit(3)
print("released")
"""


@pytest.mark.e2e  # starts a Python process
def test_two_workspaces_releasing_at_the_same_moment_compose_one_after_the_other(tmp_path, npz):
    """Each fits the budget alone, not both together: exactly one is refused, one row is kept."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs, start = [], tmp_path / "start"
    for name in ("a", "b"):
        ws = workspace(tmp_path / name, settings(npz))
        (ws / "run.json").write_text(json.dumps(dp_run()))
        procs.append((ws, subprocess.Popen([sys.executable, "-c", RELEASE_AT_ONCE, str(ws), str(tmp_path / "team"),
                                            str(start)], env=env, stdout=subprocess.PIPE, text=True)))
    deadline = time.monotonic() + 120
    while not all((ws / "ready").exists() for ws, _ in procs):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    start.touch()
    outputs = [proc.communicate(timeout=300)[0] for _, proc in procs]
    assert sorted(proc.returncode for _, proc in procs) == [0, 3], outputs
    assert len(rows(tmp_path / "team")) == 1


def test_released_heads_say_nothing_of_the_records_and_entries_without_a_uid_are_new(tmp_path, npz, monkeypatch):
    monkeypatch.setattr("dpsad.privacy.books.curator_record.now_utc", lambda: "2026-11-28T00:00:00+00:00")
    ws = workspace(tmp_path / "ws", settings(npz))
    run = dp_run()
    heads = [release(ws, runs=[("dp", run)], curator_dir=str(tmp_path / name))["curator_record"]["head"]
             for name in ("a", "b")]
    assert heads[0] != heads[1]  # the same release of the same records at the same second: a secret nonce each
    del run["components"][0]["uid"]
    for _ in range(2):
        release(ws, runs=[("dp", run)], budget=ROOMY, curator_dir=str(tmp_path / "c"))
    assert len(rows(tmp_path / "c")) == 2


def test_a_record_on_a_network_file_system_is_named_by_its_type(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("server:/home /home nfs4 rw 0 0\n/dev/sda1 / ext4 rw 0 0\nfs /scratch lustre rw 0 0\n")
    assert network_file_system("/home/alice/.local/share/dpsad", mounts) == "nfs4"
    assert network_file_system("/scratch/team/record", mounts) == "lustre"
    assert network_file_system("/var/lib/dpsad", mounts) is None and network_file_system("/homework", mounts) is None


# --- through Snakemake and the printed commands, in real processes ------------------------------------------------


def release_in(cwd: Path, env: dict, *options: str) -> subprocess.CompletedProcess:
    shutil.rmtree(cwd / "release", ignore_errors=True)
    return run_snakemake(cwd, ["release/mnist5k/BUDGET.json", "--cores", "1", *options, "--configfile",
                               "config/config.yaml", "tests/data/tiny.yaml"], env)


def clean_copy(tiny_run, tmp_path: Path, name: str) -> Path:
    cwd = tmp_path / name
    shutil.copytree(tiny_run, cwd, symlinks=True)
    subprocess.run(["chmod", "-R", "u+w", str(cwd / "release")], check=True)
    forget_releases(cwd)
    return cwd


@pytest.mark.e2e
def test_another_home_or_state_folder_or_a_curator_variable_in_one_shell_starts_no_new_history(tiny_run, tmp_path):
    """Review: with another HOME, or DPSAD_CURATOR_DIR in one shell and another XDG_STATE_HOME in the other, a
    second release of the same records stated the first one's total alone."""
    user = {**os.environ, "OMP_NUM_THREADS": "1", TEST_HOME_ENV: str(tmp_path / "user")}
    shells = [{"HOME": str(tmp_path / "h1"), "DPSAD_CURATOR_DIR": str(tmp_path / "var"),
               "XDG_STATE_HOME": str(tmp_path / "s1")},
              {"HOME": str(tmp_path / "h2"), "XDG_DATA_HOME": str(tmp_path / "d2"), "XDG_STATE_HOME": str(tmp_path / "s2")}]
    budgets = []
    for i, shell in enumerate(shells):
        cwd = clean_copy(tiny_run, tmp_path, f"clone{i}")
        done = release_in(cwd, {**user, **shell})
        assert done.returncode == 0, done.stderr[-3000:]
        budgets.append(json.loads((cwd / "results" / "mnist5k" / "release_check.json").read_text()))
    assert budgets[1]["curator_record"]["history"] == budgets[0]["curator_record"]["history"]
    assert budgets[0]["released_before"] == [] and "mnist5k/dpsad_eps1" in budgets[1]["released_before"]
    assert not (tmp_path / "var").exists()
    statement = json.loads((tmp_path / "clone1" / "release" / "mnist5k" / "BUDGET.json").read_text())["statement"]
    assert "made on another machine or by another user" in statement and "restored from a backup" in statement


@pytest.mark.e2e
def test_a_team_record_new_to_a_user_is_refused_adopted_as_printed_and_composed_with_their_own(tiny_run, tmp_path):
    team = tmp_path / "team"
    base = {**os.environ, "OMP_NUM_THREADS": "1"}
    user1, user2 = ({**base, TEST_HOME_ENV: str(tmp_path / name)} for name in ("u1", "u2"))
    first = clean_copy(tiny_run, tmp_path, "first")
    assert release_in(first, user1, "--config", f"curator_dir={team}").returncode == 0
    second = clean_copy(tiny_run, tmp_path, "second")
    refused_run = release_in(second, user2, "--config", f"curator_dir={team}")
    assert refused_run.returncode != 0
    line = next(line for line in refused_run.stderr.splitlines() if "python -m dpsad.curator adopt" in line)
    command = line.split("say so: ")[1].strip()
    adopted = subprocess.run([str(Path(SNAKEMAKE).with_name("python")), *command.split()[1:]], env=user2,
                             capture_output=True, text=True, cwd=second)
    assert adopted.returncode == 0, adopted.stderr
    assert release_in(second, user2, "--config", f"curator_dir={team}").returncode == 0
    check = json.loads((second / "results" / "mnist5k" / "release_check.json").read_text())
    assert "mnist5k/dpsad_eps1" in check["released_before"]
    # user 1 without curator_dir: their own record's register names the team record, which counts
    third = clean_copy(tiny_run, tmp_path, "third")
    assert release_in(third, user1).returncode == 0
    check = json.loads((third / "results" / "mnist5k" / "release_check.json").read_text())
    assert str(team / "curator.sqlite") in [other["location"] for other in check["other_curator_records"]]
