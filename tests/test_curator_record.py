"""The curator's record: one per curator, outside any workspace; it cannot silently go back; a record is recognised
before any setting touches it, and is one row.

Each sequence of the review that found a release stating a total it did not have ends here with the later
release refused, or with its statement composing every earlier release.  The sequences run through the workflow's
own functions: ``prepare`` (prepare_data), ``compose_budget`` (release_budget) and ``dpsad.curator`` (the
curator's command line).  Each test has its own user data and state folders (conftest), so "the user's record"
below is the default location, outside every workspace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import indexed_images
from PIL import Image
from test_records_budget import dp_run, settings
from workflow_helpers import ROOT

from dpsad.data.datafile import prepare, read_attrs, split_digest_kinds, split_identity_digests
from dpsad.errors import DpsadError, PrivacyError
from dpsad.privacy.curator_record import CuratorRecord, curator_folder, user_data_folder
from dpsad.privacy.records import as_set, canonical_digests, record_digests
from dpsad.release import compose_budget

BUDGET = {"epsilon": 10.0, "delta": 1e-5, "accountant": "pld"}
ROOMY = {**BUDGET, "epsilon": 40.0}


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "records.npz"
    np.savez(path, images=indexed_images(400), labels=np.arange(400) % 4)
    return path


def workspace(root: Path, source: dict, dataset: str = "toy") -> Path:
    """A workspace with ``source`` prepared as prepare_data does (results/<dataset>/data.h5)."""
    prepare(source, dataset, root / "results" / dataset / "data.h5")
    return root


def release(ws: Path, *, dataset: str = "toy", runs=None, budget=BUDGET, **options) -> dict:
    """release_budget in the workspace ``ws``: the runs ``runs`` [(name, privacy.json)], one new DP run by default."""
    return compose_budget(ws / "release" / dataset / "BUDGET.json", dataset=dataset,
                          data_path=ws / "results" / dataset / "data.h5", listed=runs or [("dp", dp_run())],
                          budget=budget, workspace=ws, **options)


def refused(ws: Path, **options) -> str:
    with pytest.raises(PrivacyError) as err:
        release(ws, **options)
    print(err.value)
    assert "\n" not in str(err.value)
    return str(err.value)


def over_budget(message: str) -> bool:
    return message.startswith(("the releases already made from", "releasing run 'dp' would bring the total"))


def test_the_record_lives_in_the_users_data_folder_and_a_relative_folder_is_refused(tmp_path, monkeypatch):
    assert curator_folder() == user_data_folder() == Path(os.environ["XDG_DATA_HOME"]) / "dpsad"
    monkeypatch.setenv("DPSAD_CURATOR_DIR", str(tmp_path / "team"))
    assert curator_folder() == tmp_path / "team" and curator_folder("/srv/curator") == Path("/srv/curator")
    monkeypatch.setenv("DPSAD_CURATOR_DIR", "curator")
    with pytest.raises(DpsadError, match="DPSAD_CURATOR_DIR 'curator' is a relative path, expected an absolute one"):
        curator_folder()
    from dpsad.config import load_config_file

    with pytest.raises(DpsadError, match="curator_dir = 'curator', expected an absolute path"):
        load_config_file(ROOT / "config" / "config.yaml", {"curator_dir": "curator"})


def test_a_second_workspace_a_clone_a_copy_and_a_cleaned_one_all_compose_with_the_first(tmp_path, npz):
    """Review sequence 1: a fresh clone, `snakemake -d other`, `cp -a` and `git clean -fdX` each started from zero."""
    first_ws = workspace(tmp_path / "first", settings(npz))
    first = release(first_ws)
    assert 5.0 < first["epsilon"] <= 10.0 and first["released_before"] == []
    assert first["curator_record"]["location"] == str(user_data_folder() / "curator.sqlite")
    # a fresh clone: another folder, the same source prepared again
    clone = workspace(tmp_path / "clone", settings(npz))
    assert over_budget(refused(clone))
    roomy = release(clone, budget=ROOMY)
    assert roomy["released_before"] == ["toy/dp"] and roomy["epsilon"] > 1.2 * first["epsilon"]
    # `snakemake -d other`: another working folder, the first one's data.h5 copied in
    other = tmp_path / "other"
    (other / "results" / "toy").mkdir(parents=True)
    shutil.copyfile(first_ws / "results" / "toy" / "data.h5", other / "results" / "toy" / "data.h5")
    assert over_budget(refused(other))
    # `cp -a` of the first workspace: its marker and release/ come along, and its record is the same one
    copy = tmp_path / "copy"
    shutil.copytree(first_ws, copy, symlinks=True)
    shutil.rmtree(copy / "release")
    assert over_budget(refused(copy))
    # `git clean -fdX` with the project's .gitignore: results/, release/ and .dpsad/ are gone
    shutil.copyfile(ROOT / ".gitignore", first_ws / ".gitignore")
    subprocess.run(["git", "init", "-q", str(first_ws)], check=True)
    subprocess.run(["git", "-C", str(first_ws), "clean", "-q", "-fdX"], check=True)
    assert not (first_ws / "results").exists() and not (first_ws / ".dpsad").exists()
    workspace(first_ws, settings(npz))
    assert over_budget(refused(first_ws))
    with CuratorRecord(curator_folder()).transaction() as record:
        assert [row.body["run"] for row in record.rows("release")] == ["dp", "dp"]  # the first and the clone's


def greyscale_folder(root: Path, images: np.ndarray) -> Path:
    for i, image in enumerate(images):
        (root / str(i % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[..., 0]).save(root / str(i % 3) / f"{i}.png")
    return root


def test_the_same_images_under_another_channels_setting_are_the_same_records(tmp_path):
    """Review sequence 2: greyscale PNGs prepared with channels 3, released; release/ deleted; channels 1."""
    folder = greyscale_folder(tmp_path / "pngs", indexed_images(90))
    source = {"source": "imagefolder", "root": str(folder), "class_names": ["0", "1", "2"], "test_fraction": 0.2,
              "public_fraction": 0.1, "private_fraction": 0.9, "seed": 0}
    ws = workspace(tmp_path / "ws", {**source, "channels": 3})
    first = release(ws)
    shutil.rmtree(ws / "release")
    workspace(ws, {**source, "channels": 1})
    assert read_attrs(ws / "results" / "toy" / "data.h5")["channels"] == 1
    assert over_budget(refused(ws))
    assert release(ws, budget=ROOMY)["epsilon"] > 1.2 * first["epsilon"]


@pytest.mark.parametrize("turn", ["mirrored", "turned", "mirrored and turned"])
def test_a_mirrored_or_turned_copy_under_another_name_is_the_same_records(tmp_path, npz, turn):
    """Review sequence 2, continued: a horizontally flipped copy was a new set of records."""
    images = np.load(npz)["images"]
    changed = {"mirrored": images[:, :, ::-1], "turned": np.rot90(images, 1, axes=(1, 2)),
               "mirrored and turned": np.rot90(images[:, ::-1], 3, axes=(1, 2))}[turn]
    assert not (record_digests(changed) == record_digests(images)).all(axis=1).any()
    copy_npz = tmp_path / "changed.npz"
    np.savez(copy_npz, images=np.ascontiguousarray(changed), labels=np.load(npz)["labels"])
    release(workspace(tmp_path / "a", settings(npz), "original"), dataset="original")
    message = refused(workspace(tmp_path / "b", settings(copy_npz), "copy"), dataset="copy")
    assert over_budget(message.replace("copy's", "")) or "released before as original" in message


def test_canonical_digests_see_through_colour_storage_alpha_flips_and_turns():
    grey = indexed_images(20, size=12)
    base = canonical_digests(grey)
    as_rgb = np.repeat(grey, 3, axis=-1)
    with_alpha = np.concatenate([as_rgb, np.full(grey.shape, 255, np.uint8)], axis=-1)
    for variant in (as_rgb, with_alpha, grey[:, ::-1], grey[:, :, ::-1], np.rot90(grey, 2, axes=(1, 2)),
                    np.transpose(grey, (0, 2, 1, 3))):
        assert (canonical_digests(np.ascontiguousarray(variant)) == base).all()
    other = grey.copy()
    other[:, 5, 5, 0] ^= 1
    assert not (canonical_digests(other) == base).all(axis=1).any()
    translucent = with_alpha.copy()
    translucent[:, 0, 0, 3] = 10  # a real alpha channel is part of the picture
    assert not (canonical_digests(translucent) == base).all(axis=1).any()


def test_an_image_present_twice_is_one_record_and_no_private_image_sits_in_a_public_split(tmp_path):
    """Review sequence 3: every image twice in one npz gave 9 images twice in the private split and 17 in the
    private and the public split at once.  Now each image is one row, in one split."""
    images = indexed_images(200)
    twice = tmp_path / "twice.npz"
    np.savez(twice, images=np.concatenate([images, images[::-1]]), labels=np.concatenate([np.arange(200) % 4] * 2))
    out = tmp_path / "twice.h5"
    splits = prepare(settings(twice, public_fraction=0.3, private_fraction=0.7), "twice", out)
    private = split_digest_kinds(out, "private")
    assert len(splits["train"]) == len(as_set(private[1]))  # one row per distinct image
    assert not as_set(split_identity_digests(out, "private")) & as_set(split_identity_digests(out, "public"))
    assert sum(len(split) for split in splits.values()) == 200
    assert json.loads(read_attrs(out)["duplicates_removed"])["repeated_in_source"] == 200
    # a separate public source holding 40 of the private images: they are public, and leave the private split
    public = tmp_path / "public.npz"
    np.savez(public, images=np.concatenate([images[:40], indexed_images(60, seed=5)]), labels=np.arange(100) % 4)
    own = tmp_path / "own.npz"
    np.savez(own, images=images, labels=np.arange(200) % 4)
    out = tmp_path / "own.h5"
    splits = prepare(settings(own, private_fraction=1.0, public={"source": "npz", "path": str(public)}), "own", out)
    assert not as_set(split_identity_digests(out, "private")) & as_set(split_identity_digests(out, "public"))
    removed = json.loads(read_attrs(out)["duplicates_removed"])["private_in_public_source"]
    shared = as_set(record_digests(images[:40]))
    assert not shared & as_set(record_digests(splits["train"].images))
    assert removed + len(shared & as_set(record_digests(splits["test"].images))) == 40  # the rest drew the test split
    assert len(splits["train"]) + len(splits["test"]) + removed == 200


def test_a_restored_backup_is_refused_until_the_newer_record_is_back_or_the_lost_releases_are_declared(tmp_path, npz):
    """Review sequence 4: release r1, back up the record, release r2, restore the backup: r3 was accepted with a
    total that left r2 out."""
    from dpsad.curator import main as curator_main

    ws = workspace(tmp_path / "ws", settings(npz))
    big = {**BUDGET, "epsilon": 20.0}
    release(ws, runs=[("r1", dp_run(sigma=0.9))], budget=big)
    database = curator_folder() / "curator.sqlite"
    shutil.copyfile(database, tmp_path / "backup.sqlite")
    r2 = release(ws, runs=[("r2", dp_run(sigma=0.9))], budget=big)
    shutil.copyfile(database, tmp_path / "newer.sqlite")
    shutil.copyfile(tmp_path / "backup.sqlite", database)  # the restore
    message = refused(ws, runs=[("r3", dp_run(sigma=0.9))], budget=big)
    assert "ends at release sequence 1, but" in message and "names sequence 2 of the same history" in message
    assert "restored from an older backup" in message and "python -m dpsad.curator declare-lost" in message
    # the machine's witness sees it too, with the workspace's files gone
    shutil.rmtree(ws / "release")
    shutil.rmtree(ws / ".dpsad")
    assert "names sequence 2 of the same history" in refused(ws, runs=[("r3", dp_run(sigma=0.9))], budget=big)
    # recovery 1: the newer database put back
    shutil.copyfile(tmp_path / "newer.sqlite", database)
    r3 = release(ws, runs=[("r3", dp_run(sigma=0.9))], budget=big)
    assert r3["released_before"] == ["toy/r1", "toy/r2"] and r3["epsilon"] > r2["epsilon"]
    # recovery 2: the newer database lost; the lost rows declared with what they spent
    shutil.copyfile(tmp_path / "backup.sqlite", database)
    refused(ws, runs=[("r4", dp_run(sigma=0.9))], budget=big)
    lost = r3["epsilon"]  # rows 2 and 3 (r2, r3): their total is in BUDGET.json
    assert curator_main(["declare-lost", "--data", str(ws / "results" / "toy" / "data.h5"), "--epsilon", str(lost),
                         "--delta", "1e-6", "--description", "r2 and r3, lost with the database", "--workspace",
                         str(ws)]) == 0
    after = release(ws, runs=[("r4", dp_run(sigma=0.9))], budget={**big, "epsilon": 40.0})
    assert after["epsilon_with_declared_earlier_use"] == pytest.approx(after["epsilon"] + lost)
    assert "r2 and r3, lost with the database" in after["statement"]
    with pytest.raises(PrivacyError, match="with the declared earlier uses' epsilon"):  # what they spent counts
        release(ws, runs=[("r5", dp_run(sigma=0.9))],
                budget={**big, "epsilon": after["epsilon_with_declared_earlier_use"] + 0.3})


def test_two_copies_of_one_record_used_apart_and_a_replaced_record_are_refused(tmp_path, npz):
    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, budget=ROOMY)
    shutil.copytree(curator_folder(), tmp_path / "copy")  # a second copy of the same history
    release(ws, budget=ROOMY)
    other = workspace(tmp_path / "other", settings(npz))
    message = refused(other, budget=ROOMY, curator_dir=str(tmp_path / "copy"))
    assert "names sequence 2 of the same history" in message
    # the record at the default location deleted: another history there, which this machine saw before
    os.remove(curator_folder() / "curator.sqlite")
    fresh = workspace(tmp_path / "fresh", settings(npz))
    message = refused(fresh, budget=ROOMY)
    assert "is not the one this machine used there" in message and "deleted or replaced" in message
    started = release(fresh, budget=ROOMY, new_history=True)  # on purpose
    assert started["released_before"] == [] and started["curator_record"]["sequence"] == 1
    assert release(fresh, budget=ROOMY)["released_before"] == ["toy/dp"]  # and from then on, the new one


def old_curator_folder(ws: Path, data: Path, run_entries: list[dict]) -> Path:
    """The curator folder of a workspace made before the record was a database, in its documented layout."""
    import hashlib

    folder = ws / "curator"
    (folder / "record_sets").mkdir(parents=True)
    (folder / "ID").write_text("0123456789abcdef0123456789abcdef\n")
    names = {}
    for split in ("private", "public"):
        digests = split_identity_digests(data, split)
        rows = sorted(bytes(r) for r in digests)
        names[split] = hashlib.sha256(b"".join(rows)).hexdigest()
        np.save(folder / "record_sets" / f"{names[split]}.npy", digests)
    row = {"recorded_utc": "2026-11-01T10:00:00+00:00", "dataset": "toy", "run": "old", "private_records": names["private"],
           "public_records": names["public"], "entries": run_entries}
    (folder / "released.jsonl").write_text(json.dumps(row) + "\n")
    (ws / ".dpsad").mkdir()
    (ws / ".dpsad" / "curator.json").write_text(json.dumps({"curator_id": "0123456789abcdef0123456789abcdef",
                                                            "curator_dir": str(folder.resolve())}))
    return folder


def test_the_curator_folder_of_an_older_workspace_is_imported_once_and_its_releases_count(tmp_path, npz):
    ws = workspace(tmp_path / "ws", settings(npz))
    old = dp_run()
    old_curator_folder(ws, ws / "results" / "toy" / "data.h5", old["components"])
    assert over_budget(refused(ws))  # the old release and a new one do not fit in 10 together
    roomy = release(ws, budget=ROOMY)
    assert roomy["released_before"] == ["toy/old"]
    assert roomy["epsilon"] > 1.2 * old["epsilon"]
    release(ws, runs=[("dp", {"dp_guarantee": True, "components": roomy["components"][-1:]})], budget=ROOMY)
    with CuratorRecord(curator_folder()).transaction() as record:
        imported = [row for row in record.rows() if "imported_from" in row.body]
        assert len(imported) == 1 and imported[0].body["run"] == "old"  # once, however often it is read
        assert [row.body["run"] for row in record.rows("release")] == ["old", "dp"]


RELEASE_AT_ONCE = """
import json, sys, time
from pathlib import Path
from dpsad.errors import PrivacyError
from dpsad.release import compose_budget
ws, curator, start = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
run = json.loads((ws / "run.json").read_text())
(ws / "ready").touch()
while not start.exists():
    time.sleep(0.01)
try:
    compose_budget(ws / "release" / "toy" / "BUDGET.json", dataset="toy", data_path=ws / "results" / "toy" / "data.h5",
                   listed=[("dp", run)], budget={"epsilon": 10.0, "delta": 1e-5, "accountant": "pld"},
                   curator_dir=curator, workspace=ws)
except PrivacyError as err:
    print("refused:", err)
    sys.exit(3)
print("released")
"""


def test_two_workspaces_sharing_one_record_release_at_the_same_moment_and_exactly_one_is_refused(tmp_path, npz):
    shared, start = tmp_path / "team-record", tmp_path / "start"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = []
    for name in ("a", "b"):
        ws = workspace(tmp_path / name, settings(npz))
        (ws / "run.json").write_text(json.dumps(dp_run()))  # each fits the budget of 10 alone, not both together
        procs.append(subprocess.Popen([sys.executable, "-c", RELEASE_AT_ONCE, str(ws), str(shared), str(start)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 120
    while not all((tmp_path / name / "ready").exists() for name in ("a", "b")):  # both imported and waiting
        assert time.monotonic() < deadline and all(proc.poll() is None for proc in procs)
        time.sleep(0.05)
    start.touch()
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    print(outputs)
    assert sorted(proc.returncode for proc in procs) == [0, 3], outputs
    assert sum("over data.toy.privacy_budget epsilon 10" in out for out in outputs) == 1
    with CuratorRecord(shared).transaction() as record:
        assert len(record.rows("release")) == 1 and record.head().sequence == 1


def test_central_images_clip_to_within_the_bound_after_rounding():
    """Review point 5: 100,242 of 200,000 clipped vectors were above C in float64, by up to 1.6e-7 relative."""
    import torch

    from dpsad.privacy.group_means import noisy_group_sums

    x = torch.rand(20_000, 1, 8, 8) * 3.0
    members = [np.array([i]) for i in range(len(x))]
    sums = noisy_group_sums(x, members, clip_norm=0.7, noise_multiplier=0.0, generator=torch.Generator().manual_seed(0))
    norms = sums.reshape(len(x), -1).double().norm(dim=1)
    assert float(norms.max()) <= 0.7 and float(norms.min()) > 0.7 * (1 - 1e-4)


def test_a_record_on_a_network_file_system_is_named_by_its_type(tmp_path):
    from dpsad.privacy.curator_record import network_file_system

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\nserver:/home /home nfs4 rw 0 0\nfs:/scratch /scratch lustre rw 0 0\n")
    assert network_file_system("/home/alice/.local/share/dpsad", mounts) == "nfs4"
    assert network_file_system("/scratch/team/record", mounts) == "lustre"
    assert network_file_system("/var/lib/dpsad", mounts) is None and network_file_system("/homework", mounts) is None
