"""Fault families through Snakemake: wrong data refused, one `error:` line per family, bounded memory.

Families: data files, configuration values, damaged artifacts and ledgers, the file system.  Each family
has a test through Snakemake (one line on stderr starting with `error:`, a non-zero exit, nothing left in
results/) beside unit tests of the readers.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import write_under_a_file_size_limit
from PIL import Image
from test_workflow import ROOT, snakemake, workdir
from workflow_helpers import skip_without_make_tests_venv

from dpsad.files.artifacts import load_torch
from dpsad.config import load_config_file
from dpsad.data.datafile import prepare
from dpsad.data.sources import load_hdf5, load_imagefolder, load_npz
from dpsad.errors import DpsadError
from dpsad.privacy.books.integrity import check_checkpoint_entries, check_stated_epsilon
from dpsad.privacy.books.ledger import make_entry, read_ledgers, verdict, write_ledger
from dpsad.sampling.draw import planned_labels
from dpsad.runtime.devices import resolve_device

SPLITS = {"test_fraction": 0.2, "public_fraction": 0.3, "private_fraction": 0.5}


def error_lines(text: str) -> list[str]:
    """The jobs' `error:` lines of Snakemake's stderr.  Jobs running side by side write into the same stream as
    Snakemake, so a job's line can land right after one of Snakemake's `====` banners, before its newline."""
    return [line.lstrip("=") for line in text.splitlines() if line.lstrip("=").startswith("error:")]


def images(n: int, side: int, width: int | None = None) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, side, width or side), dtype=np.uint8)


# --- data files ---------------------------------------------------------------------------------------

def test_an_imagefolder_of_oblong_images_is_refused_even_with_an_image_size(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            Image.fromarray(images(1, 16, 24)[0]).save(tmp_path / cls / f"{i}.png")  # 24 wide, 16 high
    with pytest.raises(DpsadError, match=r"is 24x16, expected square images"):
        load_imagefolder({"root": str(tmp_path), "channels": 1, "image_size": 16})


def test_an_image_past_pillows_pixel_limit_is_one_line(tmp_path):
    (tmp_path / "a").mkdir()
    Image.new("L", (14000, 14000)).save(tmp_path / "a" / "huge.png")
    with pytest.raises(DpsadError, match=r"huge.png' has more pixels than Pillow reads safely"):
        load_imagefolder({"root": str(tmp_path), "channels": 1})


def test_a_npy_a_truncated_npz_and_an_npz_without_images_name_the_file(tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, images(4, 16))
    with pytest.raises(DpsadError, match="holds a single array \\(a .npy file\\), expected an .npz"):
        load_npz({"path": str(npy)})
    whole = tmp_path / "whole.npz"
    np.savez(whole, images=images(40, 16), labels=np.arange(40) % 2)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(whole.read_bytes()[:3000])
    with pytest.raises(DpsadError, match="is not a readable .npz"):
        load_npz({"path": str(cut)})
    xy = tmp_path / "xy.npz"
    np.savez(xy, x=images(4, 16), y=np.arange(4))
    with pytest.raises(DpsadError, match=r"no 'images' array \(found \['x', 'y'\]\)"):
        load_npz({"path": str(xy)})


def test_an_hdf5_file_is_read_for_its_arrays_only(tmp_path):
    """Broken links beside valid arrays are left alone, and an unrelated large dataset is never read."""
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as handle:
        handle["images"] = images(40, 16)
        handle["labels"] = np.arange(40) % 2
        handle["dangling"] = h5py.SoftLink("/nowhere")
        handle["external"] = h5py.ExternalLink("missing.h5", "/images")
        handle.create_dataset("unrelated", shape=(256, 1024, 1024), dtype=np.uint8)  # 256 MiB if read (unwritten)
    tracemalloc.start()
    raw = load_hdf5({"path": str(path)})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert raw.images.shape == (40, 16, 16) and list(raw.labels[:4]) == [0, 1, 0, 1]
    assert peak < 20 * 2**20, f"reading the file allocated {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize(("array", "extra", "message"), [
    (images(40, 1), {}, "images of 1x1, expected at least 8x8"),
    (images(40, 256), {}, "images of 256x256 and no image_size, expected image_size set"),
])
def test_images_outside_the_models_range_are_refused_before_training(tmp_path, array, extra, message):
    path = tmp_path / "d.npz"
    np.savez(path, images=array, labels=np.arange(40) % 2)
    with pytest.raises(DpsadError, match=message):
        prepare({"source": "npz", "path": str(path), "seed": 0, **SPLITS, **extra}, "d", str(tmp_path / "data.h5"))
    assert not (tmp_path / "data.h5").exists()


def test_labels_of_a_hundred_million_classes_stop_at_once_in_little_memory(tmp_path):
    path = tmp_path / "d.npz"
    labels = np.arange(40) % 2
    labels[0] = 10**8
    np.savez(path, images=images(40, 16), labels=labels)
    tracemalloc.start()
    with pytest.raises(DpsadError, match="100000001 classes, expected at most 10000"):
        prepare({"source": "npz", "path": str(path), "seed": 0, **SPLITS}, "d", str(tmp_path / "data.h5"))
    assert tracemalloc.get_traced_memory()[1] < 100 * 2**20
    tracemalloc.stop()
    with pytest.raises(DpsadError, match="makes 10000000000 images, expected at most 10000000"):
        planned_labels(10_000, {"n_per_class": 1_000_000})


@pytest.mark.e2e
def test_data_faults_through_snakemake_are_one_line_each(tmp_path):
    """prepare_data on each wrong file: one `error:` line per job, a non-zero exit, no data.h5."""
    npy = tmp_path / "x.npy"
    np.save(npy, images(40, 16))
    xy = tmp_path / "xy.npz"
    np.savez(xy, x=images(40, 16), y=np.arange(40) % 2)
    tiny = tmp_path / "tiny.npz"
    np.savez(tiny, images=images(40, 1), labels=np.arange(40) % 2)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(tiny.read_bytes()[:200])  # also read when the configuration is checked (labels: true)
    oblong = tmp_path / "oblong"
    for cls in ("a", "b"):
        (oblong / cls).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(images(1, 16, 24)[0]).save(oblong / cls / f"{i}.png")
    data = {"npy": {"source": "npz", "path": str(npy), **SPLITS},
            "xy": {"source": "npz", "path": str(xy), **SPLITS},
            "tiny": {"source": "npz", "path": str(tiny), **SPLITS},
            "cut": {"source": "npz", "path": str(cut), **SPLITS},
            "oblong": {"source": "imagefolder", "root": str(oblong), "channels": 1, "image_size": 16, **SPLITS}}
    overlay = tmp_path / "data.yaml"
    overlay.write_text(json.dumps({"datasets": list(data), "data": data}))
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    result = snakemake(cwd, "--cores", "2", "-k", "--configfile", "config/config.yaml", str(overlay), "--allowed-rules",
                       "prepare_data", "--", *(f"results/{name}/data.h5" for name in data), check=False)
    lines = error_lines(result.stderr)
    # on a failure, each job's log and every line of Snakemake's long output that names an error
    logs = {name: cwd / "logs" / name / "prepare_data.log" for name in data}
    happened = "\n".join([*(f"{name}: {log.read_text()[-500:] if log.is_file() else 'no log'}"
                            for name, log in logs.items()),
                          *(line[:300] for line in result.stderr.splitlines() if "rror" in line)])
    assert result.returncode != 0 and len(lines) == 5, happened
    assert "Traceback" not in result.stderr
    for expected in ("holds a single array (a .npy file)", "no 'images' array (found ['x', 'y'])", "is not a readable .npz",
                     "images of 1x1, expected at least 8x8", "is 24x16, expected square images"):
        assert any(expected in line for line in lines), (expected, lines)
    assert not list((cwd / "results").glob("*/data.h5"))


# --- configuration values -----------------------------------------------------------------------------

@pytest.mark.parametrize(("overlay", "message"), [
    ({"sample": {"eta": float("nan")}}, "config: sample.eta = nan, expected a finite number"),
    ({"student": {"epochs": float("nan")}}, "config: student.epochs = nan, expected a finite number"),
    ({"student": {"lr": float("nan")}}, "config: student.lr = nan, expected a finite number"),
    ({"runs": [{"name": "x", "method": "dpsad", "target_epsilon": float("inf")}]},
     "config: runs[0].target_epsilon = inf, expected a finite number"),
    ({"sample": {"seed": -1}}, "config: sample.seed = -1, expected an integer seed from 0 to 2**63 - 1"),
    ({"data": {"mnist5k": {"num_classes": 10**8}}}, "100000000 is greater than the maximum of 10000"),
    ({"sample": {"n_per_class": 10**9}}, "1000000000 is greater than the maximum of 1000000"),
])
def test_bad_numbers_are_refused_when_the_configuration_is_read(tmp_path, overlay, message):
    path = tmp_path / "overlay.yaml"
    path.write_text(json.dumps(overlay, allow_nan=True).replace("NaN", ".nan").replace("Infinity", ".inf"))
    with pytest.raises(DpsadError) as raised:
        load_config_file(ROOT / "config" / "config.yaml", overrides=_yaml(path))
    assert message in str(raised.value)


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


@pytest.mark.e2e
def test_config_faults_through_snakemake_stop_before_any_job(tmp_path):
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    result = snakemake(cwd, "-n", "--configfile", "config/config.yaml", "--config", "sample={eta: .nan}", check=False)
    assert result.returncode == 1 and error_lines(result.stderr) == [
        "error: config: sample.eta = nan, expected a finite number"], result.stderr[-2000:]


def test_a_device_this_torch_cannot_use_is_one_line():
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        pytest.skip("MPS is available here")
    with pytest.raises(DpsadError, match="device 'mps' requested but this torch .* has no usable MPS"):
        resolve_device("mps")


# --- damaged artifacts and ledgers --------------------------------------------------------------------

def _dp_entry(**change) -> dict:
    entry = make_entry(stage="distill_student", private=True, mechanism="sgm", sample_rate=0.032, noise_multiplier=1.2,
                       steps=125, clip_norm=1.0, noise_seed="secret")
    return {**entry, **change}


@pytest.mark.parametrize(("change", "message"), [
    ({"steps": "many"}, "has steps = 'many', expected a whole number of steps >= 0"),
    ({"noise_multiplier": None}, "has noise_multiplier = None, expected a number >= 0"),
    ({"sample_rate": 2.0}, "has sample_rate = 2.0, expected a number in (0, 1]"),
])
def test_a_ledger_entry_of_the_wrong_type_or_range_is_named(tmp_path, change, message):
    path = tmp_path / "student.ledger.json"
    path.write_text(json.dumps({"entries": [_dp_entry(**change)]}))
    with pytest.raises(DpsadError, match=f"ledger entry for 'distill_student' {message}".replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        read_ledgers([path])


def test_an_edited_ledger_is_refused_by_its_own_digest(tmp_path):
    path = tmp_path / "student.ledger.json"
    write_ledger(path, [_dp_entry(), _dp_entry(stage="discriminator")])
    assert len(read_ledgers([path])) == 2
    content = json.loads(path.read_text())
    content["entries"][0]["steps"] = 10  # fewer steps: a smaller epsilon
    path.write_text(json.dumps(content))
    with pytest.raises(DpsadError, match="its entries no longer match the entries_sha256 written with them"):
        read_ledgers([path])
    content["entries"] = content["entries"][1:]  # an entry removed
    path.write_text(json.dumps(content))
    with pytest.raises(DpsadError, match="no longer match"):
        read_ledgers([path])
    del content["entries_sha256"]  # ... and the digest that would give it away
    path.write_text(json.dumps(content))
    with pytest.raises(DpsadError, match="has no entries_sha256, expected the digest every dpsad stage writes"):
        read_ledgers([path])


def test_an_edited_verdict_is_never_stamped_into_the_data(tmp_path):
    """sample takes the guarantee from the ledger: privacy.json with another epsilon or fewer components is
    refused before synthetic.h5 is written."""
    from dpsad.privacy.books.integrity import verified_verdict

    ledger = tmp_path / "student.ledger.json"
    entries = write_ledger(ledger, [_dp_entry()])
    stated = verdict(entries, delta=1e-5, accountant="pld", target_epsilon=None, num_private_records=4000)
    privacy = tmp_path / "privacy.json"
    privacy.write_text(json.dumps(stated))
    assert verified_verdict(privacy, ledger)["epsilon"] == pytest.approx(stated["epsilon"])
    privacy.write_text(json.dumps({**stated, "epsilon": 0.01}))
    with pytest.raises(DpsadError, match=r"privacy.json: states epsilon 0.01, but its components compose to"):
        verified_verdict(privacy, ledger)
    privacy.write_text(json.dumps({**stated, "components": [], "epsilon": 0.0}))
    with pytest.raises(DpsadError, match=r"privacy.json: its components differ from the entries of .*student.ledger.json"):
        verified_verdict(privacy, ledger)


def test_a_stated_epsilon_its_components_do_not_give_is_refused():
    entries = [_dp_entry()]
    stated = verdict(entries, delta=1e-5, accountant="pld", target_epsilon=None, num_private_records=4000)
    check_stated_epsilon(stated, "privacy.json")  # as written: accepted
    with pytest.raises(DpsadError, match=r"privacy.json: states epsilon 1.0, but its components compose to"):
        check_stated_epsilon({**stated, "epsilon": 1.0}, "privacy.json")
    fixed = [{**entries[0], "noise_seed": "fixed"}]
    with pytest.raises(DpsadError, match="states dp_guarantee true, but its components give none"):
        check_stated_epsilon({**stated, "components": fixed}, "privacy.json")


def test_a_ledger_that_lost_an_entry_of_its_checkpoint_is_refused():
    own = [_dp_entry()]
    check_checkpoint_entries({"ledger": own}, "student.pt", own, "student.ledger.json")
    with pytest.raises(DpsadError, match="student.ledger.json: lacks the entry for 'distill_student' that student.pt"):
        check_checkpoint_entries({"ledger": own}, "student.pt", [], "student.ledger.json")
    with pytest.raises(DpsadError, match="has another version of the entry"):
        check_checkpoint_entries({"ledger": own}, "student.pt", [{**own[0], "steps": 1}], "student.ledger.json")


def test_a_checkpoint_without_its_model_configuration_is_named(tmp_path):
    path = tmp_path / "public.pt"
    torch.save({"kind": "diffusion_model", "model": {}, "ema": {}, "settings": {}, "step": 1, "diffusion_config": {}},
               path)
    with pytest.raises(DpsadError, match=r"public.pt: a diffusion_model checkpoint without \['model_config'\]"):
        load_torch(path)
    # a checkpoint of no dpsad kind, where the student reads its teacher: one line, not KeyError('model_config')
    from dpsad.training.diffusion_training import load_diffusion_model

    path = tmp_path / "teacher" / "public.pt"
    path.parent.mkdir()
    torch.save({"step": 1}, path)
    with pytest.raises(DpsadError, match=r"public.pt: a checkpoint of kind None, expected one of \['diffusion_model', "
                                         r"'dpsad_student'\] written by train_teacher"):
        load_diffusion_model(path, torch.device("cpu"))


# --- the file system ----------------------------------------------------------------------------------

@pytest.mark.e2e
def test_a_file_size_limit_in_prepare_data_and_the_teacher_names_the_file(tmp_path):
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    args = ["--cores", "1", "--configfile", "config/config.yaml", "tests/data/tiny.yaml"]

    def limited(target: str, kib: int) -> subprocess.CompletedProcess:
        def limit():
            resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, resource.RLIM_INFINITY))
        snakemake_bin = str(Path(sys.executable).with_name("snakemake"))
        return subprocess.run([snakemake_bin, target, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                              preexec_fn=limit, env={**os.environ, "OMP_NUM_THREADS": "1"})

    result = limited("results/mnist5k/data.h5", 400)
    (line,) = error_lines(result.stderr)
    assert result.returncode != 0 and line.startswith(
        "error: disk full at results/mnist5k/data.h5: the file-size limit (ulimit -f) is 0.4 MiB"), result.stderr[-2000:]
    snakemake(cwd, "results/mnist5k/data.h5", *args)
    result = limited("results/mnist5k/teacher/public.pt", 40)
    (line,) = error_lines(result.stderr)
    assert result.returncode != 0 and line.startswith("error: writing results/mnist5k/teacher/public.pt")
    assert "the disk is full or a file-size limit (ulimit -f) was reached" in line
    assert not (cwd / "results" / "mnist5k" / "teacher").exists() or not list((cwd / "results" / "mnist5k" / "teacher").iterdir())


@pytest.mark.e2e  # starts a Python process
@pytest.mark.parametrize("kib", [256, 512, 768])
def test_a_file_size_limit_while_data_h5_is_written_is_one_error_not_a_crash(tmp_path, kib):
    """At 512 KiB libhdf5 failed while closing data.h5 (RuntimeError, then SIGSEGV at exit): the room is checked
    before the write, and an h5py fault during one is an OSError with its errno; no file is left behind."""
    from dpsad.files.artifacts import create_hdf5

    out = tmp_path / "results" / "data.h5"
    printed = write_under_a_file_size_limit(
        tmp_path, "from dpsad.data.datafile import prepare; prepare({'source': 'mnist5k', 'test_fraction': 0.2, "
        f"'public_fraction': 0.1, 'private_fraction': 0.9}}, 'm', {str(out)!r})", kib * 1024)
    assert printed.startswith(f"error: disk full at {out}: the file-size limit (ulimit -f) is")
    assert not out.exists() and not list(out.parent.glob("*.tmp"))
    # past the check (another writer filled the disk meanwhile): h5py's own report becomes an OSError with its errno
    with pytest.raises(OSError) as err:
        with create_hdf5(tmp_path / "x.h5"):
            raise RuntimeError("Can't decrement id ref count (file write failed: error message = 'File too large')")
    assert err.value.errno == 27 and err.value.filename is None


@pytest.mark.e2e
def test_a_file_where_a_folder_goes_stops_before_snakemake_touches_it(tmp_path):
    (tmp_path / "wf").mkdir()
    cwd = workdir(tmp_path / "wf")
    (cwd / "results" / "mnist5k").mkdir(parents=True)
    (cwd / "results" / "mnist5k" / "dpgan_eps10").write_text("not a folder")
    result = snakemake(cwd, "-n", "--configfile", "config/config.yaml", check=False)
    assert result.returncode == 1 and error_lines(result.stderr) == [
        f"error: {cwd / 'results' / 'mnist5k' / 'dpgan_eps10'} is a file, expected a folder (or nothing) there: "
        "move the file away"], result.stderr[-2000:]
    (cwd / "results" / "mnist5k" / "dpgan_eps10").unlink()
    (cwd / "logs").write_text("not a folder")
    preflight = subprocess.run([sys.executable, "-m", "dpsad.jobs.preflight"], cwd=cwd, capture_output=True, text=True)
    assert preflight.returncode == 1 and error_lines(preflight.stderr) == [
        f"error: {cwd / 'logs'} is a file, expected a folder (or nothing) there: move the file away"]


def test_a_file_in_the_way_of_a_stage_folder_is_named_where_it_stands(tmp_path, monkeypatch):
    """The check the Snakefile makes before Snakemake builds its plan (whose own answer is a traceback): a file
    anywhere on the path of a folder the stages write, found whether that folder exists yet or not."""
    from dpsad.jobs.preflight import folder_problem, stage_folders

    monkeypatch.chdir(tmp_path)
    folders = stage_folders(["mnist5k"], ["dpsad_eps10"])
    assert "results/mnist5k/dpsad_eps10" in folders and folder_problem(folders) is None
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "mnist5k").write_text("not a folder")
    assert folder_problem(folders, writable=False) == (
        f"{tmp_path / 'results' / 'mnist5k'} is a file, expected a folder (or nothing) there: move the file away")


def test_a_read_only_file_system_is_one_line(tmp_path, capsys, monkeypatch):
    import errno
    from types import SimpleNamespace

    from dpsad.jobs.stage import run_stage

    def body(snakemake, log):
        raise OSError(errno.EROFS, "Read-only file system")  # as h5py and torch raise it: no file name

    monkeypatch.chdir(tmp_path)
    stub = SimpleNamespace(rule="sample", log=[str(tmp_path / "x.log")], output=["results/d/r/synthetic.h5"], threads=1)
    with pytest.raises(SystemExit) as stopped:
        run_stage(stub, body)
    assert stopped.value.code == 1
    assert error_lines(capsys.readouterr().err) == [
        "error: read-only file system at results/d/r/synthetic.h5, expected a folder this job can write to"]


def test_a_missing_config_file_is_named_in_one_line_before_snakemake_reads_it(tmp_path, capsys):
    """`make demo` runs this check first: Snakemake's own answer to a missing --configfile is a traceback."""
    from dpsad.config.files import main

    missing = tmp_path / "missing.yaml"
    assert main(["--configfile", str(ROOT / "config" / "config.yaml"), str(missing), "--cores", "2"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: config file {missing}: cannot be read (No such file or directory), expected a YAML file"]
    assert main([f"--configfile={ROOT / 'config' / 'config.yaml'}"]) == 0


# --- folders the jobs cannot write, through Snakemake and `make demo` ---------------------------------------

TINY = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml")


def under_a_read_only_folder(cwd: Path, folder: Path, command: list[str]) -> subprocess.CompletedProcess:
    """``command`` in ``cwd`` with ``folder`` mounted read-only over itself, in a mount namespace of its own (as a
    read-only file system, whoever runs it: a root user writes through permission bits)."""
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(folder), *command],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def one_error_line(result: subprocess.CompletedProcess) -> str:
    text = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in text, text[-3000:]
    (line,) = error_lines(result.stderr)
    return line


@pytest.fixture(scope="module")
def read_only_cases(tiny_run, tmp_path_factory):
    """A copy of the tiny run without one run's samples and another's verdict, and an empty workspace."""
    cwd = tmp_path_factory.mktemp("read-only") / "wf"
    subprocess.run(["cp", "-a", str(tiny_run), str(cwd)], check=True)
    for name in ("synthetic.h5", "grid.png"):
        (cwd / "results" / "mnist5k" / "dpsad_eps1" / name).unlink()
    for name in ("privacy.json", "epsilon.png"):
        (cwd / "results" / "mnist5k" / "dpdm_eps10" / name).unlink()
    fresh = workdir(tmp_path_factory.mktemp("read-only-fresh"))
    (fresh / "results").mkdir()
    return cwd, fresh


@pytest.mark.e2e
@pytest.mark.parametrize("through", ["snakemake", "make demo"])
@pytest.mark.parametrize("case", ["sample", "account", "results"])
def test_a_folder_the_jobs_cannot_write_is_one_line_before_any_job(read_only_cases, through, case):
    """The three faults of the review: results/ read-only while sample writes synthetic.h5 and while account
    writes privacy.json, and a results/ in which Snakemake cannot create a dataset's folder."""
    cwd, fresh = read_only_cases
    where, folder, target = {
        "sample": (cwd, cwd / "results" / "mnist5k" / "dpsad_eps1", "results/mnist5k/dpsad_eps1/synthetic.h5"),
        "account": (cwd, cwd / "results" / "mnist5k" / "dpdm_eps10", "results/mnist5k/dpdm_eps10/privacy.json"),
        "results": (fresh, fresh / "results", "results/mnist5k/data.h5")}[case]
    if through == "snakemake":
        command = [str(Path(sys.executable).with_name("snakemake")), target, "--cores", "1", *TINY]
    else:
        skip_without_make_tests_venv(Path(sys.executable).parents[1])
        for name in ("Makefile", "pyproject.toml"):
            if not (where / name).exists():
                (where / name).symlink_to(ROOT / name)
        command = ["make", "--no-print-directory", "demo", f"VENV={Path(sys.executable).parents[1]}",
                   f"TARGET={target}", f"ARGS={' '.join(TINY)}"]
    line = one_error_line(under_a_read_only_folder(where, folder, command))
    print(line)
    assert line.startswith(f"error: cannot write in {folder}") and "read-only file system" in line
    assert not (where / target).exists()
