"""Bad input and damaged artifacts: one-line messages naming the file and what was expected, no partial files."""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch
from conftest import indexed_images
from helpers import write_under_a_file_size_limit
from PIL import Image
from test_workflow import ROOT, SNAKEMAKE, planned_jobs, snakemake, workdir
from workflow_helpers import skip_without_make_tests_venv

from dpsad.files.artifacts import load_torch
from dpsad.files.atomic import atomic_path, sweep_temporaries, temporaries_of
from dpsad.data.datafile import prepare, read_datafile
from dpsad.data.sources import load_imagefolder
from dpsad.errors import DpsadError
from dpsad.synthetic import load_synthetic, write_synthetic
from dpsad.jobs.preflight import clear_stale_lock
from dpsad.privacy.books.ledger import make_entry, write_ledger
from dpsad.jobs.stage import run_stage
from dpsad.privacy.mechanism.plan import poisson_sample_rate
from dpsad.training.checkpoints import check_finite, load_checkpoint


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

@pytest.mark.e2e  # starts a Python process
def test_stale_lock_is_cleared_only_when_no_snakemake_runs_there(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("x")
    live = subprocess.Popen(["bash", "-c", "exec -a snakemake sleep 60"], cwd=tmp_path)
    cmdline = Path(f"/proc/{live.pid}/cmdline")
    deadline = time.monotonic() + 30
    # until bash has exec'd: bash's own command line holds "snakemake" too, inside its -c string
    while cmdline.read_bytes().split(b"\0")[0] != b"snakemake" and time.monotonic() < deadline:
        time.sleep(0.01)
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


@pytest.mark.e2e
def test_truncated_data_file_given_to_a_teacher_fails_cleanly(prepared, tmp_path):
    cwd = workdir(tmp_path)
    (cwd / "results" / "mnist5k").mkdir(parents=True)
    data = cwd / "results" / "mnist5k" / "data.h5"
    data.write_bytes((prepared / "results" / "mnist5k" / "data.h5").read_bytes()[:4096])
    output = run_failing(cwd, "results/mnist5k/teacher/public.pt", "train_teacher")
    assert "error: results/mnist5k/data.h5: not a readable dpsad data file" in output
    assert "expected the output of prepare_data" in output


@pytest.mark.e2e
def test_a_data_file_whose_class_names_are_not_json_fails_the_teacher_cleanly(prepared, tmp_path):
    cwd = workdir(tmp_path)
    (cwd / "results" / "mnist5k").mkdir(parents=True)
    data = cwd / "results" / "mnist5k" / "data.h5"
    data.write_bytes((prepared / "results" / "mnist5k" / "data.h5").read_bytes())
    with h5py.File(data, "a") as handle:
        handle.attrs["class_names"] = "0, 1, 2"
    output = run_failing(cwd, "results/mnist5k/teacher/public.pt", "train_teacher")
    (line,) = [text for text in output.splitlines() if text.startswith("error:")]
    assert "data.h5: attribute class_names = '0, 1, 2' is not a JSON list" in line and "prepare_data" in line


@pytest.mark.e2e
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


@pytest.mark.e2e
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
    from dpsad.files.artifacts import read_json

    (tmp_path / "privacy.json").write_text(text)
    with pytest.raises(DpsadError, match=r"privacy.json: (not a readable privacy verdict|holds a JSON list).*account"):
        read_json(tmp_path / "privacy.json", "privacy verdict")


# --- inputs that used to succeed with wrong data, eat the machine, or end in a traceback --------------

def _save_npz(path: Path, images, labels) -> Path:
    np.savez(path, images=images, labels=labels)
    return path


@pytest.mark.e2e
def test_wrong_data_is_refused_or_converted_at_prepare_data(tmp_path):
    """Through Snakemake, one dataset per case in one run (-k): 16-bit PNGs are scaled to 8 bits, image_size
    resizes an npz, and a non-square npz, an empty class folder and unused classes are one-line errors."""
    rng = np.random.default_rng(0)
    sixteen = tmp_path / "sixteen"
    for cls in ("a", "b"):
        (sixteen / cls).mkdir(parents=True)
        for i in range(20):
            Image.fromarray(np.full((12, 12), 257 * (10 * i + 5), np.uint16)).save(sixteen / cls / f"{i}.png")
    empty = tmp_path / "emptyclass"
    for cls in ("a", "b"):
        (empty / cls).mkdir(parents=True)
    for i in range(20):
        Image.fromarray(rng.integers(0, 256, (12, 12), dtype=np.uint8)).save(empty / "a" / f"{i}.png")
    labels = np.arange(40) % 2
    square = _save_npz(tmp_path / "square.npz", rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), labels)
    oblong = _save_npz(tmp_path / "oblong.npz", rng.integers(0, 256, (40, 28, 32), dtype=np.uint8), labels)
    common = {"test_fraction": 0.2, "public_fraction": 0.3, "private_fraction": 0.5}
    data = {
        "sixteen": {"source": "imagefolder", "root": str(sixteen), "channels": 1, **common},
        "emptyclass": {"source": "imagefolder", "root": str(empty), "channels": 1, **common},
        "resized": {"source": "npz", "path": str(square), "image_size": 32, "num_classes": 2, **common},
        "oblong": {"source": "npz", "path": str(oblong), "num_classes": 2, **common},
        "unused": {"source": "npz", "path": str(square), "num_classes": 20, **common},
    }
    overlay = tmp_path / "wrong.yaml"
    overlay.write_text(json.dumps({"datasets": list(data), "data": data}))
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    (cwd / "results").mkdir()
    result = snakemake(cwd, "--cores", "2", "-k", "--configfile", "config/config.yaml", str(overlay), "--allowed-rules",
                       "prepare_data", "--", *(f"results/{name}/data.h5" for name in data), check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"npz '{oblong}' images: images of 28x32, expected square images" in output
    assert f"imagefolder: class 'b' has no images in '{empty / 'b'}'" in output
    assert f"npz '{square}' labels: 18 of 20 classes have no image (label 2 (2), 3 (3)" in output
    assert "expected images of every class (fix num_classes or class_names)" in output
    made = {p.parent.name for p in (cwd / "results").glob("*/data.h5")}
    assert made == {"sixteen", "resized"}, "a refused dataset left a data.h5"
    assert not [p for p in (cwd / "results").rglob("*") if p.name.endswith(".tmp")]
    prepared = read_datafile(cwd / "results" / "sixteen" / "data.h5")
    values = {int(v) for split in prepared.splits.values() for v in np.unique(split.images)}
    # each of the 20 grey levels 257 * (10 i + 5) reads as 10 i + 5 (Pillow's own conversion gave 255 for all)
    assert values <= {10 * i + 5 for i in range(20)} and len(values) >= 15, f"16-bit levels read as {sorted(values)}"
    assert read_datafile(cwd / "results" / "resized" / "data.h5").image_size == 32


@pytest.mark.e2e
@pytest.mark.parametrize("overlay, message", [
    ({"student": {"mode": "paper"}},
     "student.mode = 'paper' is the paper's printed mechanism, which is not DP; expected mode: sound, or allow_unsound"),
    ({"data": {"mnist5k": {"public": None, "public_fraction": 0, "private_fraction": 0.8}}},
     "data.mnist5k.public_fraction = 0 and no data.mnist5k.public source, but teachers ['public', 'public_kmeans'] "
     "train on the public split"),
    ({"data": {"mnist5k": {"class_names": ["a", "b"], "num_classes": 3}}},
     "data.mnist5k: num_classes 3 but 2 class_names, expected one of the two, or both agreeing"),
    ({"labels": True, "datasets": ["blank"], "data": {"blank": {"source": "npz", "path": "UNLABELLED"}}},
     "data.blank: labels: true but the dataset has no labels, expected labels: kmeans or none for unlabelled data"),
])
def test_config_errors_stop_before_any_job_in_one_line(tmp_path, overlay, message):
    unlabelled = _save_npz(tmp_path / "u.npz", indexed_images(20), np.zeros(20, np.int64))
    with np.load(unlabelled) as archive:
        np.savez(unlabelled, images=archive["images"])  # no labels array
    path = tmp_path / "overlay.yaml"
    path.write_text(json.dumps(overlay).replace("UNLABELLED", str(unlabelled)))
    (tmp_path / "wf").mkdir()
    result = snakemake(workdir(tmp_path / "wf"), "-n", "--configfile", "config/config.yaml", str(path), check=False)
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower() or "File " in line]
    assert result.returncode == 1 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert errors[0].startswith("error: config: ")


@pytest.mark.e2e
def test_scientific_numbers_without_a_dot_are_numbers(tmp_path):
    """YAML 1.1 reads `delta: 1e-5` as a string: the config takes it as the number it means."""
    path = tmp_path / "overlay.yaml"
    path.write_text("runs:\n  - {name: dpsad_eps10, method: dpsad, teacher: public, target_epsilon: 1e1, delta: 1e-5}\n"
                    "data:\n  mnist5k: {release: [dpsad_eps10]}\n")
    (tmp_path / "wf").mkdir()
    jobs = planned_jobs(snakemake(workdir(tmp_path / "wf"), "-n", "--configfile", "config/config.yaml", str(path), "all"))
    assert jobs["distill_student"] == 1


@pytest.mark.e2e
def test_a_huge_epsilon_calibrates_in_seconds_and_bounded_memory(prepared):
    """epsilon 1e6 once grew the noise search past 10 GB: the PLD grid widens with the loss span below sigma 1."""
    overlay = prepared / "huge.yaml"
    overlay.write_text(json.dumps({
        "runs": [{"name": "dpgan_huge", "method": "dpgan", "target_epsilon": 1e6, "delta": 1e-5}],
        "dpgan": {"epochs": 0.05, "batch_size": 16, "warm_steps": 4, "width": 16, "latent_dim": 8, "public_batch_size": 8},
        "data": {"mnist5k": {"release": []}}}))
    snakemake(prepared, "--cores", "1", "--configfile", "config/config.yaml", str(overlay), "--",
              "results/mnist5k/dpgan_huge/dpgan.pt")
    with open(prepared / "logs" / "mnist5k" / "train_dpgan_dpgan_huge.bench.tsv") as handle:
        (bench,) = list(csv.DictReader(handle, delimiter="\t"))
    assert float(bench["max_rss"]) < 2048, f"the job's peak memory was {bench['max_rss']} MB"
    (entry,) = json.loads((prepared / "results" / "mnist5k" / "dpgan_huge" / "dpgan.ledger.json").read_text())["entries"]
    assert 0 < entry["noise_multiplier"] < 0.01  # a real (tiny) noise, calibrated to the target
    log = (prepared / "logs" / "mnist5k" / "train_dpgan_dpgan_huge.log").read_text()
    assert "error" not in log.lower()

    # the same generator sampled under a 1 MiB file-size limit (synthetic.h5 would be ~2.4 MB): once SIGSEGV
    # inside libhdf5, now one line naming the file, a non-zero exit and no synthetic.h5
    big = prepared / "big.yaml"
    big.write_text(json.dumps({"sample": {"n_per_class": 300, "batch_size": 500}}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = " ".join([SNAKEMAKE, "--cores", "1", "--configfile", "config/config.yaml", str(overlay), str(big), "--",
                        "results/mnist5k/dpgan_huge/synthetic.h5"])
    limited = subprocess.run(["bash", "-c", f"ulimit -f 1024; exec {command}"], cwd=prepared, capture_output=True,
                             text=True, env=env, timeout=600)
    errors = [line for line in (limited.stdout + limited.stderr).splitlines() if line.startswith("error:")]
    assert limited.returncode != 0 and len(errors) == 1, limited.stderr[-3000:]
    assert errors[0].startswith("error: disk full at results/mnist5k/dpgan_huge/synthetic.h5: the file-size limit")
    run = prepared / "results" / "mnist5k" / "dpgan_huge"
    assert not (run / "synthetic.h5").exists() and not list(run.glob("*.tmp"))


def test_file_system_faults_are_one_line_errors(tmp_path, capsys, monkeypatch):
    """A full disk, a file-size limit and a refused permission end the stage with one line, not a traceback."""
    import errno

    from dpsad.jobs.stage import run_stage

    def job(error):
        def body(snakemake, log):
            raise error
        return body

    monkeypatch.chdir(tmp_path)  # the stage lock lives in ./.snakemake
    stub = SimpleNamespace(rule="sample", log=[str(tmp_path / "x.log")], output=[str(tmp_path / "out.h5")], threads=1)
    cases = [(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out.h5")), "disk full at"),
             (OSError(errno.EFBIG, "File too large", str(tmp_path / "out.h5")), "disk full at"),
             (PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "run")), "permission denied at")]
    for error, words in cases:
        with pytest.raises(SystemExit) as stopped:
            run_stage(stub, job(error))
        assert stopped.value.code == 1
        err = capsys.readouterr().err
        (line,) = [text for text in err.splitlines() if text.startswith("error:")]
        assert line.startswith(f"error: {words} ") and error.filename in line and "Traceback" not in err
    with pytest.raises(OSError):  # any other OSError keeps its traceback (in the rule's log)
        run_stage(stub, job(OSError(errno.EIO, "Input/output error")))


@pytest.mark.e2e  # starts a Python process
def test_a_file_size_limit_stops_sampling_before_libhdf5_can_crash(tmp_path):
    """Under `ulimit -f`, writing synthetic.h5 used to end in SIGSEGV inside libhdf5: now one line, no file."""
    out = tmp_path / "run" / "synthetic.h5"
    printed = write_under_a_file_size_limit(
        tmp_path, "from dpsad.synthetic import write_synthetic; "
        f"write_synthetic({str(out)!r}, np.zeros((3000, 28, 28, 1), np.uint8), np.zeros(3000, np.int64), dataset='d', "
        "method='m', run='r', privacy={'dp_guarantee': False}, class_names=['0'], config_sha256='x', code_version='y')",
        2**20)
    assert printed.startswith(f"error: disk full at {out}: the file-size limit (ulimit -f) is 1.0 MiB")
    assert not out.exists() and not list(out.parent.glob("*.tmp"))


@pytest.mark.e2e  # starts a Python process
def test_make_demo_names_a_config_file_that_is_not_yaml(tmp_path):
    """Snakemake's own message for a broken --configfile does not name the file: `make demo` checks first."""
    venv = Path(sys.executable).parents[1]
    broken = tmp_path / "broken.yaml"
    broken.write_text("runs:\n\t- {name: x}\n")
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    for name in ("Makefile", "pyproject.toml"):
        (cwd / name).symlink_to(ROOT / name)
    skip_without_make_tests_venv(venv)
    result = subprocess.run(["make", "--no-print-directory", "demo", f"VENV={venv}",
                             f"ARGS=--configfile config/config.yaml {broken}"], cwd=cwd, capture_output=True, text=True,
                            timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and errors == [
        f"error: config file {broken}: found character '\\t' that cannot start any token at line 2, column 1, "
        "expected valid YAML (spaces, not tabs, for indentation)"], result.stderr[-2000:]
    assert not (cwd / "results").exists()


@pytest.mark.e2e
def test_a_ledger_without_a_field_and_a_truncated_privacy_json_fail_their_readers_in_one_line(prepared):
    """account reads a ledger entry lacking 'private'; sample reads a truncated privacy.json: one `error:` line
    each, a non-zero exit and nothing new in results/ (the generator here is a placeholder neither job reaches)."""
    run = prepared / "results" / "mnist5k" / "dpgan_eps10"
    run.mkdir(parents=True, exist_ok=True)
    (run / "dpgan.pt").write_bytes(b"placeholder")
    entry = make_entry(stage="train_dpgan", private=True, mechanism="sgm", sample_rate=0.01, noise_multiplier=1.0,
                       steps=10, clip_norm=1.0, noise_seed="secret")
    del entry["private"]
    (run / "dpgan.ledger.json").write_text(json.dumps({"entries": [entry]}))
    try:
        output = run_failing(prepared, "results/mnist5k/dpgan_eps10/privacy.json", "account")
        (line,) = [text for text in output.splitlines() if text.startswith("error:")]
        assert "dpgan.ledger.json: ledger entry for 'train_dpgan' lacks ['private']" in line
        (run / "privacy.json").write_text('{"dp_guarantee": tr')
        output = run_failing(prepared, "results/mnist5k/dpgan_eps10/synthetic.h5", "sample")
        (line,) = [text for text in output.splitlines() if text.startswith("error:")]
        assert "privacy.json: not a readable privacy verdict" in line and "account" in line
    finally:
        for path in run.iterdir():
            path.unlink()


@pytest.mark.e2e
def test_a_job_that_asked_for_a_gpu_stops_at_once_without_cuda(prepared):
    """A GPU job on a node without usable CUDA used to train on the CPU until its time limit."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    for resource in ("train_teacher:gres=gpu:a100:2",):  # the gpu resource takes the same path (devices.requested_gpus)
        output = run_failing(prepared, "results/mnist5k/teacher/public.pt", "train_teacher", "--set-resources", resource)
        (line,) = [text for text in output.splitlines() if text.startswith("error:")]
        assert "train_teacher asked for" in line and "GPU(s) but CUDA is not available here" in line, line
        assert "set gpus_per_job: 0 to run on the CPU" in line


@pytest.mark.e2e
def test_a_ledger_edited_after_its_stage_wrote_it_is_refused_at_account(prepared):
    """Fewer steps written into a ledger by hand (a smaller epsilon) no longer match the digest its stage wrote."""
    run = prepared / "results" / "mnist5k" / "dpgan_eps10"
    run.mkdir(parents=True, exist_ok=True)
    (run / "dpgan.pt").write_bytes(b"placeholder")
    entry = make_entry(stage="train_dpgan", private=True, mechanism="sgm", sample_rate=0.01, noise_multiplier=1.0,
                       steps=1000, clip_norm=1.0, noise_seed="secret")
    write_ledger(run / "dpgan.ledger.json", [entry])
    content = json.loads((run / "dpgan.ledger.json").read_text())
    content["entries"][0]["steps"] = 10
    (run / "dpgan.ledger.json").write_text(json.dumps(content))
    try:
        output = run_failing(prepared, "results/mnist5k/dpgan_eps10/privacy.json", "account")
        (line,) = [text for text in output.splitlines() if text.startswith("error:")]
        assert "dpgan.ledger.json: its entries no longer match the entries_sha256 written with them" in line
    finally:
        for path in run.iterdir():
            path.unlink()
