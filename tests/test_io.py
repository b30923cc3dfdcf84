"""The released synthetic.h5: round trip, the verdict it carries, refusal of malformed files."""

from __future__ import annotations

import os

from pathlib import Path

import h5py
import numpy as np
import pytest

from dpsad.errors import DpsadError
from dpsad.synthetic import load_synthetic, write_synthetic, write_synthetic_batches
from dpsad.plots import GridCollector, sample_grid

PRIVACY_TRUE = {"dp_guarantee": True, "epsilon": 9.87, "delta": 1e-5, "accountant": "rdp", "reasons": []}
PRIVACY_FALSE = {"dp_guarantee": False, "epsilon": None, "delta": 1e-5, "accountant": "rdp",
                 "reasons": ["train_teacher: trained on private records without noise"]}


def write(path, privacy=PRIVACY_TRUE, labels=True):
    images = np.random.default_rng(0).integers(0, 256, (12, 28, 28, 1), dtype=np.uint8)
    write_synthetic(path, images, np.arange(12) % 3 if labels else None, dataset="toy", method="dpsad", run="dpsad_eps10",
                    privacy=privacy, class_names=["a", "b", "c"], config_sha256="0" * 64, code_version="test")
    return images


def test_round_trip(tmp_path):
    path = tmp_path / "synthetic.h5"
    images = write(path)
    data = load_synthetic(path)
    assert np.array_equal(data.images, images) and data.labels.tolist() == (np.arange(12) % 3).tolist()
    assert data.attrs["dp_guarantee"] is True and data.attrs["epsilon"] == pytest.approx(9.87)
    assert data.class_names == ["a", "b", "c"]
    assert "(9.87, 1e-05)-DP" in data.attrs["guarantee_notes"]
    x, y = data.torch_dataset()[0]
    assert x.shape == (1, 28, 28) and 0.0 <= float(x.min()) and float(x.max()) <= 1.0 and int(y) == 0


META = dict(dataset="toy", method="dpsad", run="dpsad_eps10", privacy=PRIVACY_TRUE, class_names=["a", "b", "c"],
            config_sha256="0" * 64, code_version="test")


def test_streamed_batches_write_the_same_dataset_in_chunks(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (2500, 28, 28, 1), dtype=np.uint8)
    labels = np.arange(2500) % 3
    consumed = []

    def batches():
        for start in range(0, 2500, 300):
            consumed.append(start)
            yield images[start:start + 300], labels[start:start + 300]

    path = tmp_path / "synthetic.h5"
    write_synthetic_batches(path, batches(), total=2500, image_shape=(28, 28, 1), labelled=True, **META)
    data = load_synthetic(path)
    assert len(consumed) == 9 and np.array_equal(data.images, images) and np.array_equal(data.labels, labels)
    with h5py.File(path) as handle:  # chunked and compressed: written batch by batch, read back in parts
        chunk = handle["images"].chunks
        assert chunk is not None and chunk[0] < 2500 and handle["images"].compression == "gzip"


@pytest.mark.parametrize("total", [2499, 2501])
def test_a_stream_of_the_wrong_length_leaves_no_file(tmp_path, total):
    images = np.zeros((2500, 8, 8, 1), np.uint8)
    path = tmp_path / "synthetic.h5"
    with pytest.raises(DpsadError, match="expected"):
        write_synthetic_batches(path, [(images[:1500], None), (images[1500:], None)], total=total,
                                image_shape=(8, 8, 1), labelled=False, **META)
    assert list(tmp_path.iterdir()) == []


def test_the_grid_collector_keeps_what_the_grid_shows(tmp_path):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (90, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 3, 90)
    collector = GridCollector(per_row=4)
    passed = list(collector.passing([(images[i:i + 7], labels[i:i + 7]) for i in range(0, 90, 7)]))
    assert np.array_equal(np.concatenate([b for b, _ in passed]), images)  # batches pass unchanged
    assert sum(len(k) for k, _ in collector.kept) == 12  # 4 per class, nothing more
    collector.save(tmp_path / "streamed.png")
    sample_grid(images, labels, tmp_path / "whole.png", per_row=4)
    assert (tmp_path / "streamed.png").read_bytes() == (tmp_path / "whole.png").read_bytes()


@pytest.mark.e2e  # starts a Python process
def test_the_stages_that_draw_no_chart_load_no_matplotlib_and_a_chart_still_renders(tmp_path):
    """Sampling, the release and its budget write sample grids with PIL only: what their scripts import loads no
    matplotlib (0.4 to 0.8 s of each such job); a chart imports it when drawn."""
    import subprocess
    import sys

    scripts = Path(__file__).resolve().parents[1] / "workflow" / "scripts"
    imports = "\n".join(line for name in ("sample.py", "release.py", "release_budget.py")
                        for line in (scripts / name).read_text().splitlines() if line.startswith(("from ", "import ")))
    check = imports + "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))"
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
    assert "dpsad.release_folder" in imports and loaded.strip() == "[]", loaded

    from dpsad.plots import epsilon_curve

    epsilon_curve([(0.5, 1.0), (1.0, 2.0)], 100, 3.0, tmp_path / "epsilon.png", "a run")
    assert (tmp_path / "epsilon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.e2e  # starts a Python process
def test_the_bookkeeping_stages_load_no_torch():
    """The ledger, table and budget stages compute nothing with torch: what their scripts import (the job runner
    included) loads none of it (3 s of each such job on a small machine).  The runner reads the launcher's worker
    variable by name, the name torch's launcher is given."""
    import subprocess
    import sys

    from dpsad.jobs.stage import TRAINING_WORKER_ENV
    from dpsad.runtime.distributed import WORKER_ENV

    assert TRAINING_WORKER_ENV == WORKER_ENV
    scripts = Path(__file__).resolve().parents[1] / "workflow" / "scripts"
    for name in ("account.py", "privacy_spent.py", "compare.py", "release_budget.py", "audit_table.py", "prepare_data.py"):
        imports = "\n".join(line for line in (scripts / name).read_text().splitlines() if line.startswith(("from ", "import ")))
        check = imports + "\nimport sys\nprint('torch' in sys.modules)"
        loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
        assert "dpsad.jobs.stage" in imports and loaded.strip() == "False", (name, loaded)


@pytest.mark.e2e  # starts a Python process
def test_a_stage_that_imports_torch_late_computes_with_the_jobs_threads(tmp_path):
    """prepare_data imports torch inside its loaders, after the job runner has started: torch still gets the
    job's threads (through OMP_NUM_THREADS, which torch reads when it is imported)."""
    import subprocess
    import sys

    code = f"""
import os, sys
from types import SimpleNamespace
from dpsad.jobs.stage import run_stage
os.chdir({str(tmp_path)!r})
def body(snakemake, log):
    assert "torch" not in sys.modules
    import torch
    print("threads", torch.get_num_threads())
run_stage(SimpleNamespace(rule="prepare_data", log=[], output=[{str(tmp_path / "out")!r}], threads=1), body)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SLURM_JOB_ID")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "threads 1" in done.stdout, done.stdout + done.stderr  # torch alone would take every core


@pytest.mark.e2e  # starts a Python process
def test_a_jobs_collector_waits_while_its_script_imports_and_runs_again_in_its_body(tmp_path):
    """Every workflow script imports dpsad.jobs.paused_collector before anything else; the collector is off while
    the script's libraries load, and on again in the stage's body with what they built frozen.  A process whose
    collector ran all along (a test calling run_stage) keeps it as it was: run_stage freezes nothing there (an
    interpreter whose site packages froze objects at start-up keeps just those)."""
    import ast
    import subprocess
    import sys

    scripts = Path(__file__).resolve().parents[1] / "workflow" / "scripts"
    for path in sorted(scripts.glob("*.py")):
        body = ast.parse(path.read_text()).body
        first = next(node for node in body if isinstance(node, (ast.Import, ast.ImportFrom)))
        assert isinstance(first, ast.Import) and first.names[0].name == "dpsad.jobs.paused_collector", path.name
        last = body[-1]  # run_stage turns the collector on again
        assert isinstance(last, ast.Expr) and getattr(last.value.func, "id", None) == "run_stage", path.name
    code = f"""
import sys
if sys.argv[1] == "job":
    import dpsad.jobs.paused_collector
import gc, os
from types import SimpleNamespace
from dpsad.jobs.stage import run_stage
print("importing", gc.isenabled())
frozen = gc.get_freeze_count()
os.chdir({str(tmp_path)!r})
run_stage(SimpleNamespace(rule="sample", log=[], output=[{str(tmp_path / "out")!r}], threads=1),
          lambda snakemake, log: print("body", gc.isenabled(), gc.get_freeze_count() > frozen))
"""
    printed = {kind: subprocess.run([sys.executable, "-c", code, kind], capture_output=True, text=True,
                                    check=True).stdout.splitlines() for kind in ("job", "test")}
    assert printed == {"job": ["importing False", "body True True"], "test": ["importing True", "body True False"]}


def test_a_release_that_read_no_private_record_says_so(tmp_path):
    path = tmp_path / "synthetic.h5"
    write(path, {**PRIVACY_TRUE, "epsilon": 0.0, "components": [{"stage": "train_teacher", "private": False}]})
    notes = load_synthetic(path).attrs["guarantee_notes"]
    assert notes.startswith("No private record was read") and "secret seeds" not in notes
    write(path, {**PRIVACY_TRUE, "components": [{"stage": "distill_student", "private": True}]})
    assert "(9.87, 1e-05)-DP" in load_synthetic(path).attrs["guarantee_notes"]


def test_the_test_settings_of_a_verdict_are_sentences_of_the_files_notes(tmp_path):
    path = tmp_path / "synthetic.h5"
    settings = ["A test setting left this out.", "And that."]
    for privacy in ({**PRIVACY_TRUE, "test_settings": settings}, {**PRIVACY_FALSE, "test_settings": settings}):
        write(path, privacy, labels=privacy["dp_guarantee"])
        assert load_synthetic(path).attrs["guarantee_notes"].endswith(" A test setting left this out. And that.")
        path.unlink()
    write(path, PRIVACY_TRUE)
    assert "test setting" not in load_synthetic(path).attrs["guarantee_notes"]


def test_no_guarantee_is_stated_as_such(tmp_path):
    path = tmp_path / "synthetic.h5"
    write(path, PRIVACY_FALSE, labels=False)
    data = load_synthetic(path)
    assert data.attrs["dp_guarantee"] is False and np.isnan(data.attrs["epsilon"])
    assert data.attrs["guarantee_notes"].startswith("NO differential privacy guarantee")
    assert data.labels is None


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda f: f.attrs.__setitem__("format_version", 2), "format_version = 2"),
        (lambda f: f.attrs.__delitem__("dp_guarantee"), "missing root attributes"),
        (lambda f: (f.__delitem__("images"), f.create_dataset("images", data=np.zeros((12, 28, 28, 1), np.float32))), "dtype float32"),
        (lambda f: (f.__delitem__("labels"), f.create_dataset("labels", data=np.arange(12) + 5)), "labels outside"),
        (lambda f: f.attrs.__setitem__("format", "other"), "format = 'other'"),
    ],
)
def test_malformed_files_are_refused(tmp_path, corrupt, message):
    path = tmp_path / "synthetic.h5"
    write(path)
    with h5py.File(path, "a") as handle:
        corrupt(handle)
    with pytest.raises(DpsadError, match=message):
        load_synthetic(path)


def test_a_guarantee_without_epsilon_is_refused(tmp_path):
    path = tmp_path / "synthetic.h5"
    write(path)
    with h5py.File(path, "a") as handle:
        handle.attrs["epsilon"] = float("nan")
    with pytest.raises(DpsadError, match="dp_guarantee is true but epsilon"):
        load_synthetic(path)


def test_not_hdf5(tmp_path):
    path = tmp_path / "synthetic.h5"
    path.write_text("hello")
    with pytest.raises(DpsadError, match="not a readable HDF5 file"):
        load_synthetic(path)


def test_guarantee_notes_state_the_form_of_the_public_data(tmp_path):
    from dpsad.data.datafile import public_data_sentence

    separate = public_data_sentence({"public_form": "separate_source", "public_source": "font_digits"})
    fraction = public_data_sentence({"public_form": "fraction_of_source", "public_source": "mnist5k"})
    assert "separate source (font_digits)" in separate and "same source (mnist5k)" in fraction
    path = tmp_path / "synthetic.h5"
    for privacy in ({**PRIVACY_TRUE, "public_data": separate}, {**PRIVACY_FALSE, "public_data": separate}):
        write(path, privacy)
        notes = load_synthetic(path).attrs["guarantee_notes"]
        assert notes.endswith(separate) and notes.count(separate) == 1


def _readme_reading_snippet() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = text.split("```python\n")[1:]
    (snippet,) = [block.split("```")[0] for block in blocks if 'h5py.File("synthetic.h5")' in block]
    return snippet


@pytest.mark.parametrize("labelled", [True, False], ids=["labelled", "unconditional"])
def test_the_readmes_reading_snippet_reads_every_release(tmp_path, monkeypatch, labelled):
    """The snippet a recipient copies works with h5py alone, on a run with labels and on one without."""
    images = np.zeros((4, 8, 8, 1), np.uint8)
    write_synthetic(tmp_path / "synthetic.h5", images, np.arange(4) % 2 if labelled else None, dataset="d",
                    method="dpsad", run="r", privacy={"dp_guarantee": True, "epsilon": 1.0, "delta": 1e-5, "accountant": "pld", "reasons": []},
                    class_names=["a", "b"] if labelled else [], config_sha256="x", code_version="y")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_readme_reading_snippet(), "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    assert scope["images"].shape == (4, 8, 8, 1)
    assert (scope["labels"] is None) is (not labelled)
