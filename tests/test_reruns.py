"""What reruns a stage: params, inputs and the DP mechanism's code; never a file time or the order of keys.

A rerun of a DP stage reads the private records again and spends budget again, so each change here that
leaves the mechanism and its inputs alone must plan no DP stage.  Dry runs over a copy of the tiny run whose
workflow and package are real copies, so the test can touch and edit them.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from workflow_helpers import planned_jobs, snakemake

TINY = ("--configfile", "config/config.yaml", "tests/data/tiny.yaml")
DP_STAGES = {"distill_student", "train_dpdm", "train_dpgan"}


@pytest.fixture(scope="module")
def copy(tiny_run, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("reruns") / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)
    for name in ("Snakefile", "workflow", "src"):
        target = (cwd / name).resolve()
        (cwd / name).unlink()
        (shutil.copytree if target.is_dir() else shutil.copy2)(target, cwd / name)
    assert planned_jobs(snakemake(cwd, "-n", "all", *TINY)) == {}  # the copy is up to date as it stands
    return cwd


def plan(cwd, *overlays) -> dict[str, int]:
    return planned_jobs(snakemake(cwd, "-n", "all", *TINY, *overlays))


@pytest.mark.e2e
def test_a_touched_or_copied_script_reruns_nothing(copy):
    later = time.time() + 60
    for script in (copy / "workflow" / "scripts").glob("*.py"):
        os.utime(script, (later, later))
    assert plan(copy) == {}


@pytest.mark.e2e
def test_a_touched_or_copied_result_above_a_megabyte_reruns_no_dp_stage(tiny_run, tmp_path):
    """Snakemake keeps the checksums that let a touched file count as unchanged only for files under its default
    1 MB: a teacher of the demo's size (5 MB) touched, or a workspace copied without its times, retrained DPDM."""
    cwd = tmp_path / "wf"
    shutil.copytree(tiny_run, cwd, symlinks=True)
    overlay = cwd / "wide.yaml"  # a teacher above 1 MB, and the DP stage that starts from it
    overlay.write_text("model: {base_channels: 24}\n")
    target = ("results/mnist5k/dpdm_eps10/dpdm.pt", *TINY, str(overlay))
    snakemake(cwd, "--cores", "2", *target)
    assert (cwd / "results" / "mnist5k" / "teacher" / "public.pt").stat().st_size > 1_000_000
    copied = tmp_path / "copied"  # every file (.snakemake/ too) gets the time of its copy
    shutil.copytree(cwd, copied, symlinks=True, copy_function=shutil.copyfile)
    for workspace in (cwd, copied):
        later = time.time() + 60  # the inputs newer than the DP stage's outputs, whatever order the copy took
        for name in ("teacher/public.pt", "data.h5"):
            os.utime(workspace / "results" / "mnist5k" / name, (later, later))
        assert planned_jobs(snakemake(workspace, "-n", *target)) == {}
        # the same times with Snakemake's default limit: only the checksums kept DPDM from training again
        assert planned_jobs(snakemake(workspace, "-n", "--max-checksum-file-size", "1MB", *target)) == {"train_dpdm": 1}


@pytest.mark.e2e
def test_a_default_written_out_reruns_nothing(copy):
    """Schema defaults, and the keys the schema leaves without one written out at what their absence means."""
    overlay = copy / "explicit.yaml"
    overlay.write_text("moco: {temperature: 0.2}\nkmeans: {seed: 0}\n"
                       "student: {mode: sound, lora_rank: null, ema_warmup: 10, dp: {subspace: false}}\n"
                       "dpdm: {trainable: all, lora_rank: null, ema_warmup: 10, dp: {subspace: false}}\n"
                       "dpgan: {dp: {subspace: false}}\npe: {simulator: false}\n"
                       "teachers: {public: {trainable: all, ema_warmup: 10, dp: {subspace: false}}}\n")
    assert plan(copy, str(overlay)) == {}


@pytest.mark.e2e
def test_a_report_only_key_reruns_only_the_report(copy):
    overlay = copy / "no_feature_teacher.yaml"
    overlay.write_text("kmeans: {teacher: null}\n")
    assert plan(copy, str(overlay)) == {"all": 1, "cluster_report": 1}


@pytest.mark.e2e
def test_choosing_the_public_subspace_reruns_dpdm_and_what_follows_it_only(copy):
    overlay = copy / "subspace.yaml"
    overlay.write_text("dpdm: {dp: {subspace: true}}\n")
    planned = plan(copy, str(overlay))
    assert planned.get("train_dpdm", 0) >= 1 and not {"distill_student", "train_dpgan", "train_teacher"} & set(planned)


@pytest.mark.e2e
def test_the_dp_mechanisms_code_reruns_every_dp_stage_and_a_comment_does_not(copy):
    mechanism = copy / "src" / "dpsad" / "privacy" / "mechanism" / "dpsgd.py"
    original = mechanism.read_text()
    try:
        mechanism.write_text(original + "\n# a comment, and a docstring change, run nothing new\n")
        assert plan(copy) == {}
        mechanism.write_text(original + "\n_CHANGED = 1\n")
        planned = plan(copy)
        print(planned)
        assert DP_STAGES <= set(planned) and planned["distill_student"] == 3
        assert not {"prepare_data", "train_moco", "kmeans_labels"} & set(planned)
    finally:
        mechanism.write_text(original)


def test_moving_a_module_the_mechanism_imports_is_not_a_change_of_the_mechanism():
    """Where a module the mechanism imports lives in the package does not count; what it imports does."""
    from dpsad.privacy.mechanism.code_digest import code_sha256

    before = "def f():\n    from ..jobs.distributed import SINGLE\n    return SINGLE\n"
    after = "def f():\n    from ..runtime.distributed import SINGLE\n    return SINGLE\n"
    assert code_sha256(before) == code_sha256(after) == code_sha256(after.replace("..runtime.", "."))
    assert code_sha256(after) != code_sha256(after.replace("SINGLE", "OTHER"))
    assert code_sha256(after) != code_sha256(after.replace("distributed", "precision"))


def test_the_mechanism_digest_reads_the_syntax_tree_as_python_3_11_wrote_it_on_any_python(monkeypatch):
    """A .venv rebuilt with a newer Python must not rerun every DP stage: ``ast.dump`` differs between versions (3.12
    adds ``type_params=[]``, 3.13 leaves out empty fields), the digest's own dump does not."""
    import ast
    import sys

    from dpsad.privacy.mechanism.code_digest import PACKAGE, _dump, code_sha256

    source = (PACKAGE / "privacy" / "mechanism" / "dpsgd.py").read_text()
    before = code_sha256(source)
    monkeypatch.setattr(ast, "dump", lambda *args, **kwargs: "another Python's dump")
    assert code_sha256(source) == before
    monkeypatch.undo()

    if sys.version_info[:2] == (3, 11):  # the digests every workspace holds were taken with 3.11's ast.dump
        for path in sorted(PACKAGE.rglob("*.py")):
            tree = ast.parse(path.read_text())
            assert _dump(tree) == ast.dump(tree), path
    function = ast.parse("def f(x):\n    return x\n").body[0]
    plain = _dump(function)
    function._fields = (*type(function)._fields, "type_params")  # a 3.12 tree of the same code
    function.type_params = []
    assert _dump(function) == plain
    function.type_params = [ast.Name(id="T")]  # 3.12 syntax does count
    assert _dump(function) != plain
    text = ast.parse('f"{x:{y}}"')  # 3.12.1 gives a nested format spec an empty part first
    plain = _dump(text)
    text.body[0].value.values[0].format_spec.values.insert(0, ast.Constant(value=""))
    assert _dump(text) == plain
