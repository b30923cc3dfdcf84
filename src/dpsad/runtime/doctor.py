"""What this machine's torch can do, before a long job finds out: ``python -m dpsad.runtime.doctor [--gpus N]``.

Prints torch's version and CUDA build, the driver that build needs and the one found, the GPUs torch sees, and
whether a training job that asks for N GPUs (``gpus_per_job``, or the ``gpu`` resource) would start here.  Exit
code 0 when it would, 1 when it would stop at once.  Run it on a GPU node (``srun --gpus=1 make doctor``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

# The oldest NVIDIA Linux driver each CUDA major version runs on (NVIDIA's CUDA release notes).
MIN_DRIVER = {"13": "580", "12": "525", "11": "450"}


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def diagnose(gpus: int) -> tuple[list[str], bool]:
    """(lines to print, whether a job asking for ``gpus`` GPUs would start)."""
    import torch

    build = torch.version.cuda
    lines = [f"torch {torch.__version__}, " + (f"built for CUDA {build}" if build else "a CPU-only build")]
    if build:
        needed = MIN_DRIVER.get(build.split(".")[0])
        found = driver_version()
        lines.append(f"NVIDIA driver: {found or 'none found (no nvidia-smi)'}"
                     + (f"; this build needs {needed} or newer" if needed else ""))
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    lines.append(f"CUDA available: {available}; GPUs visible: {count}")
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        lines.append(f"  cuda:{index} {props.name}, {props.total_memory / 2**30:.1f} GiB")
    if available:
        import torch.distributed as dist

        lines.append(f"NCCL (several GPUs in one job): {'available' if dist.is_nccl_available() else 'missing'}")
    if gpus == 0:
        return lines + ["a job with gpus_per_job: 0 would start here, on the CPU"], True
    if not available:
        why = ("this torch is a CPU-only build" if not build else
               f"torch cannot reach a GPU (a driver older than CUDA {build} needs, no GPU on this node, or "
               "CUDA_VISIBLE_DEVICES empty)")
        return lines + [f"a job asking for {gpus} GPU(s) would NOT start: {why}"], False
    if count < gpus:
        return lines + [f"a job asking for {gpus} GPU(s) would NOT start: only {count} visible"], False
    return lines + [f"a job asking for {gpus} GPU(s) would start here"], True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpsad.runtime.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the job would ask for (default 1)")
    args = parser.parse_args(argv)
    if args.gpus < 0:
        parser.error(f"--gpus {args.gpus}, expected 0 or more")
    lines, ok = diagnose(args.gpus)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
