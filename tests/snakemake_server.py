"""A Snakemake fork server for the tests: it imports Snakemake once, then runs each command line it is sent in a
forked child, which is what ``snakemake <args>`` would run after its imports (about 1 s of CPU each here, paid
once instead of about 110 times in the suite).

Started by ``workflow_helpers.SnakemakeServer`` as ``python <dir>/snakemake <the snakemake entry point>``, a link
named ``snakemake``: a child's ``/proc/<pid>/cmdline`` then reads as a Snakemake command line to the workflow's
own checks (``dpsad.jobs.preflight.is_snakemake``), as a real ``snakemake``'s does.

Protocol, one JSON object per line: a request ``{"cwd", "args", "env", "stdout", "stderr"}`` on stdin; the replies
``{"pid": n}`` when its child has started and ``{"returncode": n}`` when it has ended.  A child ends as the
interpreter's exit would end it (threads joined, atexit handlers run, streams flushed), without its finalization
(tests/forked_exit.py).
"""

import gc
import json
import os
import sys

from forked_exit import run_then_exit  # this file's folder, before the entry point's takes its place

ENTRY_POINT = sys.argv[1]
sys.path[0] = os.path.dirname(ENTRY_POINT)  # the entry point's folder first, as when it is run itself

import importlib  # noqa: E402

from snakemake.cli import main  # noqa: E402  (the imports this server exists to pay once)
from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry  # noqa: E402
from snakemake_interface_logger_plugins.registry import LoggerPluginRegistry  # noqa: E402
from snakemake_interface_report_plugins.registry import ReportPluginRegistry  # noqa: E402
from snakemake_interface_scheduler_plugins.registry import SchedulerPluginRegistry  # noqa: E402
from snakemake_interface_storage_plugins.registry import StoragePluginRegistry  # noqa: E402

# Every command line builds Snakemake's argument parser from these registries (singletons): each one, made
# here, has found and imported its plugins before the first fork (0.2 s of each command's CPU otherwise).
for registry in (ExecutorPluginRegistry, StoragePluginRegistry, ReportPluginRegistry, LoggerPluginRegistry,
                 SchedulerPluginRegistry):
    registry()

# Libraries that every run of this workflow imports after the CLI (Snakemake's own lazy imports, and those of
# the workflow's package, which itself is not imported here: a test may run another checkout's copy).  A
# library missing here is imported by the command that needs it, as without the server.
WARM_LIBRARIES = ("h5py", "PIL.Image", "jinja2", "docutils.core", "nbformat", "requests", "smart_open",
                  "jsonschema", "fastjsonschema", "yte", "pygments", "dpath", "platformdirs", "argparse_dataclass",
                  "graphlib", "packaging.version", "snakemake.dag", "snakemake.jobs", "snakemake.profiles",
                  "snakemake.scheduling.job_scheduler", "snakemake.script", "snakemake.storage")
for name in WARM_LIBRARIES:
    try:
        importlib.import_module(name)
    except ImportError:
        pass


def run_child(request: dict) -> None:
    """In the forked child: the command line of ``request`` (then forked_exit's exit)."""
    os.setpgid(0, 0)  # its own process group, which a timeout stops whole
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the tests' job server (workflow_helpers.JobServer): Snakemake runs a job's script with sys.executable
    sys.executable = os.environ.get("DPSAD_TEST_JOB_SHIM") or sys.executable
    sys.argv = [ENTRY_POINT, *request["args"]]
    main(request["args"])


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        gc.freeze()  # the child's collections skip the server's objects (each would copy their pages)
        pid = os.fork()
        if pid == 0:
            run_then_exit(run_child, request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
