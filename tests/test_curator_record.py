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
from dpsad.privacy.books.curator_record import CuratorRecord, curator_folder, user_data_folder
from dpsad.privacy.books.records import as_set, canonical_digests, record_digests
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


def test_canonical_digests_see_through_colour_alpha_bit_depth_flips_and_turns():
    grey = indexed_images(20, size=12)
    base = canonical_digests(grey)
    as_rgb = np.repeat(grey, 3, axis=-1)
    with_alpha = np.concatenate([as_rgb, np.full(grey.shape, 255, np.uint8)], axis=-1)
    translucent = with_alpha.copy()
    translucent[:, 0, 0, 3] = 10  # converting to L or RGB drops it: the same record
    sixteen = grey.astype(np.uint16) * 257
    for variant in (as_rgb, with_alpha, translucent, sixteen, grey[:, ::-1], grey[:, :, ::-1],
                    np.rot90(grey, 2, axes=(1, 2)), np.transpose(grey, (0, 2, 1, 3))):
        assert (canonical_digests(np.ascontiguousarray(variant)) == base).all()
    other = grey.copy()
    other[:, 5, 5, 0] ^= 1
    assert not (canonical_digests(other) == base).all(axis=1).any()
    # a colour picture and the greyscale Pillow makes of it (channels: 1) are one record
    colour = np.random.default_rng(3).integers(0, 256, (5, 12, 12, 3), dtype=np.uint8)
    made_grey = np.stack([np.asarray(Image.fromarray(c).convert("L"))[..., None] for c in colour])
    assert (canonical_digests(colour) == canonical_digests(made_grey)).all()


def test_a_picture_and_its_variants_in_one_folder_are_one_row_in_one_split(tmp_path):
    """Review: colour and greyscale, 8- and 16-bit, and RGB and RGBA copies of one picture in an image folder
    stayed as two rows, some in the private and the public split at once."""
    rng = np.random.default_rng(0)
    pictures = rng.integers(0, 256, (60, 16, 16, 3), dtype=np.uint8)
    root = tmp_path / "pictures"
    for i, picture in enumerate(pictures):
        folder = root / str(i % 3)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(picture).save(folder / f"{i}.png")
        variant = [Image.fromarray(picture).convert("L"),
                   Image.fromarray(np.dstack([picture, rng.integers(0, 256, (16, 16), dtype=np.uint8)]), "RGBA"),
                   Image.fromarray(picture).convert("L")][i % 3]
        variant.save(folder / f"{i}-variant.png")
    for channels in (1, 3):
        out = tmp_path / f"folder{channels}.h5"
        splits = prepare({"source": "imagefolder", "root": str(root), "channels": channels, "class_names": ["0", "1", "2"],
                          "test_fraction": 0.2, "public_fraction": 0.3, "private_fraction": 0.7, "seed": 0},
                         "folder", out)
        assert sum(len(split) for split in splits.values()) == 60
        assert json.loads(read_attrs(out)["duplicates_removed"])["repeated_in_source"] == 60
        assert not as_set(split_identity_digests(out, "private")) & as_set(split_identity_digests(out, "public"))


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
    # recovery 2: the newer database lost; the lost rows declared with what the witnesses say they spent
    shutil.copyfile(tmp_path / "backup.sqlite", database)
    refused(ws, runs=[("r4", dp_run(sigma=0.9))], budget=big)
    lost = r3["epsilon"]  # rows 2 and 3 (r2, r3): the total BUDGET.json stated after them
    data = str(ws / "results" / "toy" / "data.h5")
    assert curator_main(["declare-lost", "--data", data, "--epsilon", "0", "--delta", "0", "--description",
                         "r2 and r3, lost with the database", "--workspace", str(ws)]) == 0  # 0 is not what they spent
    # what the lost rows spent adds by basic composition, their delta (the budget's own) too
    with pytest.raises(PrivacyError, match="total delta 1e-05, not below data.toy.privacy_budget delta 1e-05"):
        release(ws, runs=[("r4", dp_run(sigma=0.9))], budget=big)
    big = {**big, "delta": 2e-5}
    after = release(ws, runs=[("r4", dp_run(sigma=0.9))], budget={**big, "epsilon": 40.0})
    assert after["epsilon_with_declared_earlier_use"] == pytest.approx(after["epsilon"] + lost)
    assert "r2 and r3, lost with the database" in after["statement"]
    with pytest.raises(PrivacyError, match="with the declared earlier uses' epsilon"):  # what they spent counts
        release(ws, runs=[("r5", dp_run(sigma=0.9))],
                budget={**big, "epsilon": after["epsilon_with_declared_earlier_use"] + 0.3})


def test_two_copies_of_one_record_used_apart_are_refused_and_no_new_record_starts_from_zero(tmp_path, npz):
    """A copy of the record used from another folder; a fresh record in a new folder; the default one deleted."""
    ws = workspace(tmp_path / "ws", settings(npz))
    first = release(ws, budget=ROOMY)
    shutil.copytree(curator_folder(), tmp_path / "copy")  # a second copy of the same history
    second = release(ws, budget=ROOMY)
    other = workspace(tmp_path / "other", settings(npz))
    assert "names sequence 2 of the same history" in refused(other, budget=ROOMY, curator_dir=str(tmp_path / "copy"))
    # a new, empty record elsewhere (a team folder, a variable set in one shell only) counts the others' releases
    fresh = workspace(tmp_path / "fresh", settings(npz))
    assert over_budget(refused(fresh, curator_dir=str(tmp_path / "team")))
    with_team = release(fresh, budget=ROOMY, curator_dir=str(tmp_path / "team"))
    assert with_team["released_before"] == ["toy/dp"] and with_team["epsilon"] > second["epsilon"] > first["epsilon"]
    assert with_team["other_curator_records"] == [{"history": second["curator_record"]["history"],
                                                   "location": second["curator_record"]["location"]}]
    # the default record deleted: the releases made through it cannot be counted, so nothing is released
    os.remove(curator_folder() / "curator.sqlite")
    newest = workspace(tmp_path / "newest", settings(npz))
    message = refused(newest, budget=ROOMY)
    assert "cannot be read there" in message and "declare what it held" in message


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


def test_a_release_log_of_an_older_version_beside_the_budget_stops_every_release_of_the_workspace(tmp_path, npz):
    """release/<dataset>/released.jsonl beside BUDGET.json, which older versions kept and no budget reads now: its
    releases would go uncounted, so nothing is released (and nothing recorded) until they are declared and the log
    is gone."""
    ws = workspace(tmp_path / "ws", settings(npz))
    log = ws / "release" / "other" / "released.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(json.dumps({"entry": dp_run()["components"][0]}) + "\n")
    message = refused(ws)
    assert message.startswith(f"{log}: a release log of an older version") and "declare-lost" in message
    assert not (ws / "release" / "toy" / "BUDGET.json").exists()
    log.unlink()
    checked = release(ws)
    assert checked["released_before"] == [] and [row["run"] for row in checked["runs"]] == ["dp"]


RELEASE_AT_ONCE = """
import json, sys, time
from pathlib import Path
from dpsad.errors import PrivacyError
from dpsad.release import compose_budget
ws, curator, start = Path(sys.argv[1]), sys.argv[2] or None, Path(sys.argv[3])
cap = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
run = json.loads((ws / "run.json").read_text())
(ws / "ready").touch()
while not start.exists():
    time.sleep(0.01)
try:
    compose_budget(ws / "release" / "toy" / "BUDGET.json", dataset="toy", data_path=ws / "results" / "toy" / "data.h5",
                   listed=[("dp", run)], budget={"epsilon": cap, "delta": 1e-5, "accountant": "pld"},
                   curator_dir=curator, workspace=ws)
except PrivacyError as err:
    print("refused:", err)
    sys.exit(3)
print("released")
"""


def released_at_once(start: Path, releases: list[tuple[Path, str]], *, cap: float):
    """One process a (workspace, curator_dir or "") releasing one new DP run, all let go at the same moment once
    each is ready; their processes (ended) and outputs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = []
    for ws, folder in releases:
        (ws / "run.json").write_text(json.dumps(dp_run()))
        procs.append(subprocess.Popen([sys.executable, "-c", RELEASE_AT_ONCE, str(ws), folder, str(start), str(cap)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 120
    while not all((ws / "ready").exists() for ws, _ in releases):  # every one imported and waiting
        assert time.monotonic() < deadline and all(proc.poll() is None for proc in procs)
        time.sleep(0.05)
    start.touch()
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    print(outputs)
    return procs, outputs


def test_two_workspaces_sharing_one_record_release_at_the_same_moment_and_exactly_one_is_refused(tmp_path, npz):
    shared = tmp_path / "team-record"
    # each fits the budget of 10 alone, not both together
    procs, outputs = released_at_once(tmp_path / "start", [(workspace(tmp_path / name, settings(npz)), str(shared))
                                                           for name in ("a", "b")], cap=10.0)
    assert sorted(proc.returncode for proc in procs) == [0, 3], outputs
    assert sum("over data.toy.privacy_budget epsilon 10" in out for out in outputs) == 1
    with CuratorRecord(shared).transaction() as record:
        assert len(record.rows("release")) == 1 and record.head().sequence == 1


def test_central_images_clip_to_within_the_bound_after_rounding():
    """Review point 5: 100,242 of 200,000 clipped vectors were above C in float64, by up to 1.6e-7 relative."""
    import torch

    from dpsad.privacy.mechanism.group_means import noisy_group_sums

    x = torch.rand(20_000, 1, 8, 8) * 3.0
    members = [np.array([i]) for i in range(len(x))]
    sums = noisy_group_sums(x, members, clip_norm=0.7, noise_multiplier=0.0, generator=torch.Generator().manual_seed(0))
    norms = sums.reshape(len(x), -1).double().norm(dim=1)
    assert float(norms.max()) <= 0.7 and float(norms.min()) > 0.7 * (1 - 1e-4)


def test_a_record_on_a_network_file_system_is_named_by_its_type(tmp_path):
    from dpsad.privacy.books.curator_record import network_file_system

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\nserver:/home /home nfs4 rw 0 0\nfs:/scratch /scratch lustre rw 0 0\n")
    assert network_file_system("/home/alice/.local/share/dpsad", mounts) == "nfs4"
    assert network_file_system("/scratch/team/record", mounts) == "lustre"
    assert network_file_system("/var/lib/dpsad", mounts) is None and network_file_system("/homework", mounts) is None


def test_the_curator_lists_the_record_and_declaring_nothing_lost_is_refused(tmp_path, npz, capsys):
    from dpsad.curator import main as curator_main

    assert curator_main(["show"]) == 0
    assert capsys.readouterr().out.startswith("no curator's record at ")
    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, runs=[("public", {"dp_guarantee": True, "epsilon": 0.0, "delta": 1e-5, "components": []}),
                      ("dp", dp_run())], declared={"description": "tuned on these records", "epsilon": None,
                                                    "delta": None})
    assert curator_main(["show"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "3 row(s)" in lines[0] and "declared use of toy's records: tuned on these records" in lines[1]
    assert "release of toy/public (0 private ledger entries)" in lines[2] and "release of toy/dp (1" in lines[3]
    data = str(ws / "results" / "toy" / "data.h5")
    assert curator_main(["declare-lost", "--data", data, "--epsilon", "1", "--delta", "0", "--description", "x",
                         "--workspace", str(ws)]) == 1
    assert capsys.readouterr().err.startswith("error: no witness in ")


def test_released_heads_say_nothing_of_the_records(tmp_path, npz, monkeypatch):
    """Review: a head was sha256 of public fields, a timestamp and the private set's fingerprint, so a recipient
    who knew all records but one could tell the two neighbouring data sets apart.  Every row has a secret nonce."""
    import dpsad.privacy.books.curator_record as record_module

    monkeypatch.setattr(record_module, "now_utc", lambda: "2026-11-28T00:00:00+00:00")
    ws = workspace(tmp_path / "ws", settings(npz))
    run = dp_run()
    heads = [release(ws, runs=[("dp", run)], curator_dir=str(tmp_path / name))["curator_record"]["head"]
             for name in ("a", "b")]
    assert heads[0] != heads[1]  # the same release of the same records, at the same second
    with CuratorRecord(tmp_path / "a").transaction() as record:
        assert all(len(row.body["nonce"]) == 32 for row in record.rows())


def test_a_data_file_with_a_record_in_two_rows_is_never_released(tmp_path, npz):
    """Review: a data.h5 prepared by an older version kept copies, and was released with the card saying each
    image was one row."""
    import h5py

    ws = workspace(tmp_path / "ws", settings(npz))
    data = ws / "results" / "toy" / "data.h5"
    with h5py.File(data, "r+") as handle:  # as an older version wrote it: a copy kept, no canonical digests
        group = handle["train"]
        for name in ("images", "labels", "record_digests", "source_digests"):
            values = group[name][()]
            del group[name]
            group.create_dataset(name, data=np.concatenate([values, values[:1]]))
        del group["canonical_digests"]
    message = refused(ws)
    assert "1 image(s) more than once in the private split" in message and "run prepare_data again" in message


def test_declaring_lost_rows_needs_the_records_of_each_and_what_the_witnesses_say_they_spent(tmp_path, npz, capsys):
    """Review: a lost release of dataset B was declared against A's records, and B then started from zero."""
    from dpsad.curator import main as curator_main

    other = tmp_path / "other.npz"
    np.savez(other, images=indexed_images(400, seed=9), labels=np.arange(400) % 4)
    ws = workspace(tmp_path / "ws", settings(npz), "a")
    workspace(ws, settings(other), "b")
    release(ws, dataset="a")
    database = curator_folder() / "curator.sqlite"
    shutil.copyfile(database, tmp_path / "backup.sqlite")
    lost = release(ws, dataset="b")
    stated = json.loads((ws / "release" / "b" / "BUDGET.json").read_text())["epsilon"]  # every release: a's too
    assert stated > lost["epsilon"]
    shutil.copyfile(tmp_path / "backup.sqlite", database)
    assert "names sequence 2 of the same history" in refused(ws, dataset="a")
    a_data, b_data = (str(ws / "results" / name / "data.h5") for name in ("a", "b"))
    assert curator_main(["declare-lost", "--data", a_data, "--description", "lost", "--workspace", str(ws)]) == 1
    assert "the lost row 2 (b) released records that no --data holds" in capsys.readouterr().err
    assert curator_main(["declare-lost", "--data", a_data, "--data", b_data, "--description", "b's release, lost",
                         "--workspace", str(ws)]) == 1
    assert "holds none of the records the lost rows released" in capsys.readouterr().err
    assert curator_main(["declare-lost", "--data", b_data, "--description", "b's release, lost",
                         "--workspace", str(ws)]) == 0
    fresh = workspace(tmp_path / "fresh", settings(other), "b")
    with CuratorRecord(curator_folder()).transaction() as record:
        (declared,) = [row.body["declared"] for row in record.rows("declared") if row.body["dataset"] == "b"]
    assert declared["epsilon"] == pytest.approx(stated)  # the largest total a witness stated: never less
    message = refused(fresh, dataset="b", budget={**BUDGET, "delta": 3e-5})
    assert "with the declared earlier uses' epsilon" in message


def test_entries_without_a_uid_are_recorded_every_time(tmp_path, npz):
    """Review: two trainings whose entries had no uid were one row."""
    ws = workspace(tmp_path / "ws", settings(npz))
    runs = [dp_run(), dp_run()]
    for run in runs:
        del run["components"][0]["uid"]
        shutil.rmtree(ws / "release", ignore_errors=True)
        release(ws, runs=[("dp", run)], budget=ROOMY)
    with CuratorRecord(curator_folder()).transaction() as record:
        assert len(record.rows("release")) == 2


def test_an_old_shared_curator_folder_is_imported_when_the_record_is_made_in_it(tmp_path, npz):
    """Review: with an absolute curator_dir shared by old workspaces, the database was made beside the old
    released.jsonl, which no budget then read."""
    shared = tmp_path / "shared"
    old_ws = workspace(tmp_path / "old", settings(npz))
    folder = old_curator_folder(old_ws, old_ws / "results" / "toy" / "data.h5", dp_run()["components"])
    shutil.move(folder, shared)
    fresh = workspace(tmp_path / "fresh", settings(npz))
    assert over_budget(refused(fresh, curator_dir=str(shared)))
    assert release(fresh, budget=ROOMY, curator_dir=str(shared))["released_before"] == ["toy/old"]


def test_a_record_locked_too_long_says_so_and_not_that_it_is_damaged(tmp_path, monkeypatch):
    import sqlite3

    import dpsad.privacy.books.curator_record as record_module

    with CuratorRecord(tmp_path / "r").transaction():
        pass
    holder = sqlite3.connect(tmp_path / "r" / "curator.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(record_module, "BUSY_SECONDS", 0.2)
    with pytest.raises(DpsadError, match="stayed locked by another release"):
        with CuratorRecord(tmp_path / "r").transaction():
            pass
    holder.execute("ROLLBACK")


def composed(k: int, entry: dict) -> float:
    """epsilon of k trainings like ``entry`` (each its own uid)."""
    from dpsad.privacy.accounting import Accountant
    from dpsad.privacy.books.ledger import components_of

    return Accountant("pld").epsilon(components_of([{**entry, "uid": f"u{i}"} for i in range(k)]), 1e-5)


def test_two_releases_through_two_records_at_the_same_moment_compose_one_after_the_other(tmp_path, npz):
    """Second review: a release read another record before that record's own release was in, and both passed."""
    run = dp_run()
    cap = (composed(3, run["components"][0]) + composed(4, run["components"][0])) / 2  # one more fits, not two
    team = tmp_path / "team"
    ws_a = workspace(tmp_path / "a", settings(npz))
    ws_b = workspace(tmp_path / "b", settings(npz))
    release(ws_a, budget=ROOMY)
    release(ws_b, budget=ROOMY, curator_dir=str(team))
    procs, outputs = released_at_once(tmp_path / "start", [(ws_a, ""), (ws_b, str(team))], cap=cap)
    assert sorted(proc.returncode for proc in procs) == [0, 3], outputs


def test_a_record_this_machine_does_not_know_is_refused_until_the_curator_adopts_it(tmp_path, npz, monkeypatch):
    """Second review: the record restored and the state folder lost, a second checkout started from the restored
    total.  A record that holds rows and that this machine's register does not list is refused."""
    from dpsad.curator import main as curator_main

    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, budget=ROOMY)
    database = curator_folder() / "curator.sqlite"
    shutil.copyfile(database, tmp_path / "backup.sqlite")
    release(ws, budget=ROOMY)
    shutil.copyfile(tmp_path / "backup.sqlite", database)
    shutil.rmtree(os.environ["XDG_STATE_HOME"])
    second = workspace(tmp_path / "second", settings(npz))
    message = refused(second, budget=ROOMY)
    assert "this machine's register" in message and "python -m dpsad.curator adopt" in message
    assert curator_main(["adopt"]) == 0  # the curator's word: it holds every release (here it does not)
    assert release(second, budget=ROOMY)["released_before"] == ["toy/dp"]
    assert "row 2 of the curator's record" in refused(ws, budget=ROOMY)  # the first checkout still sees the loss


def test_a_shared_record_lost_is_declared_by_each_user_for_the_rows_they_knew(tmp_path, npz, monkeypatch):
    """Second review: one user's declaration of a lost team record answered another user's lost release."""
    from dpsad.curator import main as curator_main

    other = tmp_path / "other.npz"
    np.savez(other, images=indexed_images(400, seed=9), labels=np.arange(400) % 4)
    team, team2 = str(tmp_path / "team"), str(tmp_path / "team2")
    user1, user2 = (str(tmp_path / name / "state") for name in ("user1", "user2"))
    ws1, ws2 = workspace(tmp_path / "ws1", settings(npz), "a"), workspace(tmp_path / "ws2", settings(other), "b")
    monkeypatch.setenv("XDG_STATE_HOME", user1)
    release(ws1, dataset="a", curator_dir=team)
    monkeypatch.setenv("XDG_STATE_HOME", user2)
    assert "python -m dpsad.curator adopt" in refused(ws2, dataset="b", curator_dir=team)  # a team record, new here
    assert curator_main(["--curator-dir", team, "adopt"]) == 0
    release(ws2, dataset="b", curator_dir=team)
    monkeypatch.setenv("XDG_STATE_HOME", user1)  # user 1 releases nothing more, and sees the head at row 2
    release(ws1, dataset="a", curator_dir=team, runs=[("nothing", {"dp_guarantee": False})])
    shutil.rmtree(team)
    assert "cannot be read there" in refused(ws1, dataset="a", curator_dir=team2)
    assert curator_main(["--curator-dir", team2, "declare-lost", "--data", str(ws1 / "results" / "a" / "data.h5"),
                         "--description", "the team's record, lost", "--workspace", str(ws1)]) == 0
    release(ws1, dataset="a", curator_dir=team2, budget={**ROOMY, "delta": 3e-5})  # the declared delta adds
    monkeypatch.setenv("XDG_STATE_HOME", user2)
    assert curator_main(["--curator-dir", team2, "adopt"]) == 0
    message = refused(ws2, dataset="b", curator_dir=team2, budget={**ROOMY, "delta": 3e-5})  # not user 1's to answer
    assert "cannot be read there" in message


def test_records_of_a_declared_use_never_become_public_data(tmp_path, npz):
    """Second review: only release rows were checked against a later public split, not declared uses."""
    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, runs=[("public", {"dp_guarantee": True, "epsilon": 0.0, "delta": 1e-5, "components": []})],
            declared={"description": "trained on them elsewhere", "epsilon": 2.0, "delta": 1e-6})
    private = prepare(settings(npz), "toy", tmp_path / "again.h5")["train"].images
    fresh, exposed = tmp_path / "fresh.npz", tmp_path / "exposed.npz"
    np.savez(fresh, images=indexed_images(100, seed=7), labels=np.arange(100) % 4)
    np.savez(exposed, images=private[:30], labels=np.arange(30) % 4)
    other = workspace(tmp_path / "other", settings(fresh, public={"source": "npz", "path": str(exposed)}), "other")
    message = refused(other, dataset="other")
    assert "30 public record(s) of other were private records of an earlier use declared by toy" in message


def test_a_record_that_never_held_a_row_can_go_without_a_declaration(tmp_path, npz):
    """Second review: a scratch record that released nothing blocked every later release once deleted."""
    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, runs=[("nothing", {"dp_guarantee": False})], curator_dir=str(tmp_path / "scratch"))
    shutil.rmtree(tmp_path / "scratch")
    assert release(ws)["released_before"] == []


def test_a_workspace_copied_to_another_machine_declares_what_its_marker_kept(tmp_path, npz, monkeypatch):
    """Second review: on another machine the marker gave no rows, and the wrong records could be declared."""
    from dpsad.curator import main as curator_main

    ws = workspace(tmp_path / "ws", settings(npz))
    first = release(ws)
    stated = json.loads((ws / "release" / "toy" / "BUDGET.json").read_text())["epsilon"]
    os.remove(curator_folder() / "curator.sqlite")  # machine 1's record, out of reach from machine 2
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "machine2" / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "machine2" / "state"))
    moved = tmp_path / "machine2" / "ws"
    shutil.copytree(ws, moved)
    assert "cannot be read there" in refused(moved)
    np.savez(tmp_path / "x.npz", images=indexed_images(400, seed=11), labels=np.arange(400) % 4)
    unrelated = workspace(tmp_path / "unrelated", settings(tmp_path / "x.npz"), "toy")
    assert curator_main(["declare-lost", "--data", str(unrelated / "results" / "toy" / "data.h5"), "--description",
                         "machine 1's record", "--workspace", str(moved)]) == 1  # not the records the marker kept
    assert curator_main(["declare-lost", "--data", str(moved / "results" / "toy" / "data.h5"), "--description",
                         "machine 1's record", "--workspace", str(moved)]) == 0
    roomy = {**ROOMY, "delta": 3e-5}  # the declared delta adds
    after = release(moved, budget=roomy)
    assert after["epsilon_with_declared_earlier_use"] == pytest.approx(after["epsilon"] + stated)
    assert stated >= first["epsilon"]
    # the declaration is read from this record whatever record a later release uses
    assert release(moved, budget=roomy, curator_dir=str(tmp_path / "machine2" / "team"))


def test_the_released_budget_says_nothing_of_which_records_the_releases_share(tmp_path, npz, monkeypatch):
    """Second review: BUDGET.json composed only the releases that shared a record with this one, so adding one
    record of an earlier release to the private split changed the released file for certain."""
    images = np.load(npz)["images"]
    other = tmp_path / "other.npz"
    np.savez(other, images=indexed_images(300, seed=4), labels=np.arange(300) % 4)
    a_private = prepare(settings(npz), "a", tmp_path / "a.h5")["train"].images
    with_x = tmp_path / "with_x.npz"  # the same records and one private record of a's release
    np.savez(with_x, images=np.concatenate([indexed_images(300, seed=4), a_private[:1]]), labels=np.arange(301) % 4)
    run_a, run_b = dp_run(), dp_run()
    released = {}
    for world, source in (("without", other), ("with", with_x)):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / world / "data"))
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / world / "state"))
        ws_a = workspace(tmp_path / world / "a", settings(npz), "a")
        release(ws_a, dataset="a", runs=[("dp", run_a)], budget=ROOMY)
        ws_b = workspace(tmp_path / world / "b", settings(source, public_fraction=0.0, private_fraction=1.0), "b")
        checked = release(ws_b, dataset="b", runs=[("dp", run_b)], budget=ROOMY)
        released[world] = json.loads((ws_b / "release" / "b" / "BUDGET.json").read_text())
        assert checked["released_before"] == ([] if world == "without" else ["a/dp"])  # the curator's check sees it
    assert len(images) == 400
    for key in ("epsilon", "delta", "statement", "runs"):
        if key == "statement":
            assert released["with"][key].replace("301", "300") == released["without"][key].replace("301", "300")
        elif key == "runs":
            assert [r["epsilon_alone"] for r in released["with"][key]] == [r["epsilon_alone"] for r in released["without"][key]]
        else:
            assert released["with"][key] == released["without"][key], key
    assert "released_before" not in released["with"] and "released_before_as" not in released["with"]


def test_a_release_declared_lost_keeps_its_public_records_public(tmp_path, npz):
    """Third review: declare-lost kept the lost release's private records only, so its public split could come back
    as private records with a DP claim."""
    from dpsad.curator import main as curator_main

    ws = workspace(tmp_path / "ws", settings(npz))
    database = curator_folder() / "curator.sqlite"
    release(ws, runs=[("nothing", {"dp_guarantee": False})])  # the record made, empty
    shutil.copyfile(database, tmp_path / "backup.sqlite")
    release(ws, runs=[("public", {"dp_guarantee": True, "epsilon": 0.0, "delta": 1e-5, "components": []})])
    shutil.copyfile(tmp_path / "backup.sqlite", database)
    assert curator_main(["declare-lost", "--data", str(ws / "results" / "toy" / "data.h5"), "--description",
                         "the public row's release, lost", "--workspace", str(ws)]) == 0
    workspace(ws, settings(npz, public_fraction=0.0, private_fraction=0.8))  # the public split drawn as private
    message = refused(ws, budget={**BUDGET, "delta": 3e-5})
    assert "were released without noise as public data of a release declared lost of toy" in message


def test_a_declared_use_of_unknown_cost_is_named_in_every_later_budget_of_the_records(tmp_path, npz):
    """Third review: a sharing dataset's BUDGET.json stated a finite total without the unknown earlier use."""
    ws = workspace(tmp_path / "ws", settings(npz), "a")
    release(ws, dataset="a", declared={"description": "tuned on these records elsewhere", "epsilon": None,
                                       "delta": None}, budget=ROOMY)
    workspace(ws, settings(npz), "copy")
    release(ws, dataset="copy", budget=ROOMY)
    budget = json.loads((ws / "release" / "copy" / "BUDGET.json").read_text())
    assert [d["description"] for d in budget["declared_earlier_uses"]] == ["tuned on these records elsewhere"]
    assert "is NOT included in the epsilon above: the records it covers have no bounded total" in budget["statement"]
    assert "budget caps the releases that share a record" in budget["budget_scope"]


def test_a_record_held_by_another_release_is_waited_for_not_declared_lost(tmp_path, npz, monkeypatch):
    """Third review: a record locked past the wait was taken for a lost one, and declare-lost then charged it."""
    import sqlite3

    import dpsad.privacy.books.curator_record as record_module

    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, budget=ROOMY)  # the default record
    holder = sqlite3.connect(curator_folder() / "curator.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(record_module, "BUSY_SECONDS", 0.2)
    try:
        with pytest.raises(DpsadError, match="stayed locked by another release") as err:
            release(ws, budget=ROOMY, curator_dir=str(tmp_path / "team"))
        assert "cannot be read there" not in str(err.value)
    finally:
        holder.execute("ROLLBACK")


def test_a_second_workspace_passes_once_its_rows_are_declared_by_the_first(tmp_path, npz):
    """Third review: a declaration in one workspace covered another's rows, and that workspace was refused anyway."""
    from dpsad.curator import main as curator_main

    other = tmp_path / "other.npz"
    np.savez(other, images=indexed_images(400, seed=9), labels=np.arange(400) % 4)
    ws1, ws2 = workspace(tmp_path / "ws1", settings(npz), "a"), workspace(tmp_path / "ws2", settings(other), "b")
    release(ws1, dataset="a")
    database = curator_folder() / "curator.sqlite"
    shutil.copyfile(database, tmp_path / "backup.sqlite")
    release(ws2, dataset="b")
    release(ws1, dataset="a", budget=ROOMY)
    shutil.copyfile(tmp_path / "backup.sqlite", database)
    assert curator_main(["declare-lost", "--data", str(ws1 / "results" / "a" / "data.h5"), "--data",
                         str(ws2 / "results" / "b" / "data.h5"), "--description", "rows 2 and 3, lost",
                         "--workspace", str(ws1)]) == 0
    roomy = {**ROOMY, "delta": 3e-5}
    assert release(ws2, dataset="b", budget=roomy)["epsilon_with_declared_earlier_use"] > 0


def test_the_users_default_record_counts_whatever_record_is_in_use(tmp_path, npz):
    """Third review: after a switch to a team record and a lost state folder, an adopted team record left out the
    releases of the default one."""
    from dpsad.curator import main as curator_main

    ws = workspace(tmp_path / "ws", settings(npz))
    release(ws, budget=ROOMY)
    team = str(tmp_path / "team")
    release(ws, budget=ROOMY, curator_dir=team)
    shutil.rmtree(os.environ["XDG_STATE_HOME"])
    assert "python -m dpsad.curator adopt" in refused(ws, budget=ROOMY, curator_dir=team)
    assert curator_main(["--curator-dir", team, "adopt"]) == 0
    assert release(ws, budget=ROOMY, curator_dir=team)["released_before"] == ["toy/dp"]
    with CuratorRecord(curator_folder()).transaction() as default, CuratorRecord(Path(team)).transaction() as shared:
        assert len(default.rows("release")) == 1 and len(shared.rows("release")) == 2
