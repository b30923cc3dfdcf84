"""Tiny in-memory datasets and settings for the training tests."""

from __future__ import annotations

import copy
import json
from functools import lru_cache

import numpy as np

from dpsad.config import StudentSettings, sizing_section, validate_config
from dpsad.data.datafile import PreparedData, Split


def tiny_data(n_train=24, n_public=12, size=12, classes=3, seed=0) -> PreparedData:
    rng = np.random.default_rng(seed)

    def split(n):
        return Split(rng.integers(0, 256, (n, size, size, 1), dtype=np.uint8), (np.arange(n) % classes).astype(np.int64))

    return PreparedData(
        splits={"train": split(n_train), "public": split(n_public), "test": split(6)},
        class_names=[str(c) for c in range(classes)], labelled=True, image_size=size, channels=1, attrs={"seed": 0},
    )


MODEL = {"base_channels": 8, "channel_mult": [1, 2], "groups": 4, "time_embed_dim": 16}


def tiny_config(**student):
    """A validated configuration of tiny trainings (``student``: keys of its student section), a copy of its own."""
    return copy.deepcopy(_validated_tiny_config(json.dumps(student, sort_keys=True)))


@lru_cache(maxsize=None)
def _validated_tiny_config(student_json: str) -> dict:
    """Validated once a process for each student section: about 20 ms each, asked for a hundred times a suite."""
    student = json.loads(student_json)
    return validate_config({
        "datasets": ["toy"], "data": {"toy": {"source": "mnist5k"}},
        "diffusion": {"timesteps": 40},
        "teachers": {
            "public": {"split": "public", "steps": 6, "batch_size": 4, "checkpoint_every": 2, "warmup_steps": 2, "model": MODEL},
            "private": {"split": "private", "steps": 6, "batch_size": 4, "checkpoint_every": 2, "warmup_steps": 2, "model": MODEL},
            "dp": {"split": "private", "privacy": "dp", "target_epsilon": 5.0, "epochs": 1, "batch_size": 6,
                   "checkpoint_every": 2, "model": MODEL},
        },
        "student": {"epochs": 1, "batch_size": 6, "checkpoint_every": 2, "discriminator": {"base_channels": 8}, **student},
        "runs": [{"name": "dpsad", "method": "dpsad", "target_epsilon": 10.0}],
    })


def tiny_student(section: dict, target_epsilon: float = 10.0, delta: float = 1e-5) -> StudentSettings:
    """A ``student`` section of :func:`tiny_config` (changed as a test needs) as the typed settings a run gets."""
    return StudentSettings.from_section({**section, "target_epsilon": target_epsilon, "delta": delta,
                                         "dp_sizing": sizing_section(tiny_config(), "student")})


def every_other_poisson_draw_empty(monkeypatch) -> list:
    """Make every other Poisson draw an empty batch (which secret seeds give now and then, on no fixed step).

    Returns the list the real draws are appended to, one per step."""
    from dpsad.privacy.mechanism import dpsgd as mechanism

    draws = []
    real_sample = mechanism.PoissonSampler.sample

    def every_other_empty(self):
        draws.append(real_sample(self))
        return draws[-1][:0] if len(draws) % 2 else draws[-1]

    monkeypatch.setattr(mechanism.PoissonSampler, "sample", every_other_empty)
    return draws


def write_under_a_file_size_limit(tmp_path, call: str, limit_bytes: int) -> str:
    """Run ``call`` (Python code that writes a file) in a child process whose files may not grow past
    ``limit_bytes`` (``ulimit -f``); a DpsadError is printed as ``error: ...``.  Returns the child's stdout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(tmp_path) / "limited_write.py"
    script.write_text("import resource\nimport numpy as np\nfrom dpsad.errors import DpsadError\n"
                      f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, resource.RLIM_INFINITY))\n"
                      f"try:\n    {call}\nexcept DpsadError as err:\n    print('error:', err)\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
