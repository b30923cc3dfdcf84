"""Bad input and damaged artifacts: one-line messages naming the file and what was expected, no partial files."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch
from conftest import indexed_images
from PIL import Image
from test_workflow import snakemake, workdir

from dpsad.artifacts import load_torch
from dpsad.atomic import atomic_path, sweep_temporaries, temporaries_of
from dpsad.data.datafile import prepare, read_datafile
from dpsad.data.sources import load_imagefolder
from dpsad.errors import DpsadError
from dpsad.io import load_synthetic, write_synthetic
from dpsad.locks import clear_stale_lock
from dpsad.privacy.ledger import make_entry, write_ledger
from dpsad.stage import run_stage
from dpsad.training.common import check_finite, load_checkpoint, poisson_sample_rate


def truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def one_line(message: str) -> bool:
    return "\n" not in message.strip()


# --- the package's readers --------------------------------------------------------------------------

def test_corrupt_image_in_an_imagefolder_is_named(imagefolder_root):
    bad = next((imagefolder_root / "cat").iterdir()).with_name("broken.png")
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(DpsadError) as err:
        load_imagefolder({"root": str(imagefolder_root), "class_names": ["cat", "dog"]})
    assert str(bad) in str(err.value) and "not a readable image" in str(err.value) and ".png" in str(err.value)


def test_truncated_data_file_names_its_path_and_writer(tmp_path):
    settings = {"source": "npz", "path": str(tmp_path / "x.npz"), "num_classes": 10}
    np.savez(tmp_path / "x.npz", images=indexed_images(50), labels=np.arange(50) % 10)
    prepare(settings, "toy", tmp_path / "data.h5")
    truncate(tmp_path / "data.h5", 2000)
    with pytest.raises(DpsadError) as err:
        read_datafile(tmp_path / "data.h5")
    message = str(err.value)
    assert str(tmp_path / "data.h5") in message and "not a readable dpsad data file" in message
    assert "prepare_data" in message and one_line(message)


@pytest.mark.parametrize(("name", "writer"), [("student.pt", "distill_student"), ("teacher/public.pt", "train_teacher"),
                                              ("dpdm.pt", "train_dpdm"), ("student.pt.resume", "distill_student")])
def test_truncated_checkpoint_names_its_path_and_writer(tmp_path, name, writer):
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    torch.save({"step": 3, "model": {"w": torch.zeros(100)}}, path)
    truncate(path)
    with pytest.raises(DpsadError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert str(path) in message and "not a readable dpsad checkpoint" in message and writer in message
    assert one_line(message)


@pytest.mark.parametrize("source", ["npz", "hdf5"])
def test_corrupt_array_file_is_named(tmp_path, source):
    path = tmp_path / f"data.{source}"
    path.write_bytes(b"PK\x03\x04 truncated" if source == "npz" else b"\x89HDF\r\n\x1a\n truncated")
    with pytest.raises(DpsadError) as err:
        prepare({"source": source, "path": str(path), "num_classes": 10}, "toy", tmp_path / "out.h5")
    assert f"'{path}' is not a readable" in str(err.value) and "expected" in str(err.value) and one_line(str(err.value))
    assert not list(tmp_path.glob("*out.h5*"))


def test_checkpoint_that_is_not_a_dict_is_refused(tmp_path):
    torch.save([1, 2, 3], tmp_path / "student.pt")
    with pytest.raises(DpsadError, match="holds a list, expected a dpsad checkpoint"):
        load_torch(tmp_path / "student.pt")


def test_class_names_that_are_not_json_are_refused(tmp_path):
    path = tmp_path / "synthetic.h5"
    privacy = {"dp_guarantee": False, "epsilon": None, "delta": 1e-5, "reasons": ["test"], "accountant": "pld"}
    write_synthetic(path, np.zeros((2, 8, 8, 1), np.uint8), np.zeros(2, np.int64), dataset="toy", method="dpsad",
                    run="r", privacy=privacy, class_names=["a"], config_sha256="0" * 64, code_version="test")
    with h5py.File(path, "a") as handle:
        handle.attrs["class_names"] = "a, b"
    with pytest.raises(DpsadError, match=r"class_names = 'a, b' is not JSON, expected a JSON list of strings"):
        load_synthetic(path)


def test_nan_message_says_what_was_expected():
    with pytest.raises(FloatingPointError, match="became nan at step 7, expected a finite loss"):
        check_finite(float("nan"), 7, "x.pt.resume")


def test_batch_larger_than_the_data_is_said_once(caplog):
    with caplog.at_level(logging.WARNING):
        assert poisson_sample_rate(64, 40, "distill_student", logging.getLogger("t")) == 1.0
        assert poisson_sample_rate(16, 40, "distill_student", logging.getLogger("t")) == pytest.approx(0.4)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "batch_size 64 is larger than the 40 records" in warnings[0]


def test_delta_not_below_one_over_n_stops_prepare_before_writing(tmp_path):
    np.savez(tmp_path / "x.npz", images=indexed_images(200), labels=np.arange(200) % 10)
    settings = {"source": "npz", "path": str(tmp_path / "x.npz"), "num_classes": 10}
    with pytest.raises(DpsadError) as err:
        prepare(settings, "toy", tmp_path / "data.h5", deltas={"ok": 1e-5, "loose": 0.01})
    assert "run loose: delta = 0.01 is not below 1/n" in str(err.value) and "expected a smaller delta" in str(err.value)
    assert not list(tmp_path.glob("*data.h5*"))


# --- temporaries left by a kill during a write ---------------------------------------------------------

def test_atomic_writes_sweep_temporaries_a_killed_writer_left(tmp_path):
    target = tmp_path / "student.pt.resume"
    stale = tmp_path / ".student.pt.resume.k1ll3d.tmp"  # what SIGKILL inside torch.save leaves behind
    stale.write_bytes(b"truncated")
    other = tmp_path / ".student.pt.abc.tmp"  # another file's temporary is not ours
    other.write_bytes(b"x")
    assert temporaries_of(target) == [stale]
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and not stale.exists() and other.exists()
    assert sweep_temporaries(tmp_path / "student.pt") == [other] and not other.exists()


def test_a_stage_sweeps_temporaries_of_its_outputs_and_resume_files_at_start(tmp_path):
    out = tmp_path / "student.pt"
    left = [tmp_path / ".student.pt.resume.zz1.tmp", tmp_path / ".student.pt.zz2.tmp"]
    for path in left:
        path.write_bytes(b"half")
    seen = {}
    fake = SimpleNamespace(log=[str(tmp_path / "stage.log")], threads=1, output=[str(out)], rule="distill_student")
    run_stage(fake, lambda sm, log: seen.setdefault("left", [p.exists() for p in left]))
    assert seen["left"] == [False, False]
    assert "left by an interrupted run" in (tmp_path / "stage.log").read_text()


# --- Snakemake's lock after a kill ------------------------------------------------------------------

def test_stale_lock_is_cleared_only_when_no_snakemake_runs_there(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("x")
    live = subprocess.Popen(["bash", "-c", "exec -a snakemake sleep 60"], cwd=tmp_path)
    try:
        assert clear_stale_lock(tmp_path).startswith("lock kept: Snakemake is running")
        assert (locks / "0.input.lock").exists()
    finally:
        live.kill()
        live.wait()
    assert clear_stale_lock(tmp_path).startswith("removed the lock")
    assert not list(locks.iterdir())
    assert clear_stale_lock(tmp_path) == "no lock"


# --- the same failures through Snakemake: message, exit code, nothing new in results/ ----------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    cwd = workdir(tmp_path_factory.mktemp("fail"))
    snakemake(cwd, "--cores", "1", "results/mnist5k/data.h5")
    return cwd


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def run_failing(cwd: Path, target: str, rule: str, *extra: str) -> str:
    before = files_under(cwd / "results")
    result = snakemake(cwd, "--cores", "1", target, "--allowed-rules", rule, *extra, check=False)
    assert result.returncode != 0
    assert files_under(cwd / "results") == before, "a failed job left files in results/"
    return result.stdout + result.stderr


def test_truncated_data_file_given_to_a_teacher_fails_cleanly(prepared, tmp_path):
    cwd = workdir(tmp_path)
    (cwd / "results" / "mnist5k").mkdir(parents=True)
    data = cwd / "results" / "mnist5k" / "data.h5"
    data.write_bytes((prepared / "results" / "mnist5k" / "data.h5").read_bytes()[:4096])
    output = run_failing(cwd, "results/mnist5k/teacher/public.pt", "train_teacher")
    assert "error: results/mnist5k/data.h5: not a readable dpsad data file" in output
    assert "expected the output of prepare_data" in output


def test_truncated_teacher_given_to_the_student_fails_cleanly(prepared):
    teacher = prepared / "results" / "mnist5k" / "teacher"
    teacher.mkdir(exist_ok=True)
    torch.save({"model": {"w": torch.zeros(1000)}}, teacher / "public.pt")
    truncate(teacher / "public.pt", 300)
    write_ledger(teacher / "public.ledger.json", [make_entry(stage="train_teacher_public", private=False, mechanism="none",
                                                             steps=1)])
    try:
        output = run_failing(prepared, "results/mnist5k/dpsad_eps10/student.pt", "distill_student")
    finally:
        for path in teacher.iterdir():
            path.unlink()
    assert "error: results/mnist5k/teacher/public.pt: not a readable dpsad checkpoint" in output
    assert "train_teacher" in output


def test_corrupt_image_empty_array_and_too_large_delta_fail_prepare_data(tmp_path, imagefolder_root):
    cwd = workdir(tmp_path)
    (cwd / "results").mkdir()
    bad = imagefolder_root / "dog" / "truncated.png"
    Image.new("L", (8, 8)).save(bad)
    truncate(bad, 30)
    overlay = tmp_path / "folder.yaml"
    overlay.write_text(json.dumps({"datasets": ["pets"], "data": {"pets": {
        "source": "imagefolder", "root": str(imagefolder_root), "class_names": ["cat", "dog"], "channels": 1,
        "image_size": 28}}}))
    # about 8 private images, so delta must stay below 1/8
    loose = tmp_path / "loose.yaml"
    loose.write_text(json.dumps({"runs": [{"name": "dpsad_eps10", "method": "dpsad", "target_epsilon": 10.0, "delta": 0.2}]}))
    output = run_failing(cwd, "results/pets/data.h5", "prepare_data", "--configfile", "config/config.yaml", str(overlay))
    assert f"'{bad}' is not a readable image" in output

    empty = tmp_path / "empty.npz"
    np.savez(empty, images=np.zeros((0, 28, 28), np.uint8), labels=np.zeros(0, np.int64))
    no_images = tmp_path / "empty.yaml"
    no_images.write_text(json.dumps({"datasets": ["pets"], "data": {"pets": {"source": "npz", "path": str(empty),
                                                                             "num_classes": 2}}}))
    output = run_failing(cwd, "results/pets/data.h5", "prepare_data", "--configfile", "config/config.yaml", str(no_images))
    assert f"npz '{empty}': no images in 'images', expected at least one" in output

    bad.unlink()
    output = run_failing(cwd, "results/pets/data.h5", "prepare_data", "--configfile", "config/config.yaml", str(overlay),
                         str(loose))
    assert "run dpsad_eps10: delta = 0.2 is not below 1/n" in output and "expected a smaller delta" in output


@pytest.mark.parametrize("text", ['{"dp_guarantee": tr', "[1, 2]", ""])
def test_a_truncated_or_foreign_privacy_json_names_its_path_and_writer(tmp_path, text):
    from dpsad.artifacts import read_json

    (tmp_path / "privacy.json").write_text(text)
    with pytest.raises(DpsadError, match=r"privacy.json: (not a readable privacy verdict|holds a JSON list).*account"):
        read_json(tmp_path / "privacy.json", "privacy verdict")
