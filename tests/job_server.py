"""A fork server for the workflow's Python jobs in the tests: it imports the heavy libraries the jobs use (torch
and its compiler stack, SciPy, dp-accounting, scikit-learn, Matplotlib, h5py) once, then runs each job's script in
a forked child, as ``python <script>`` would after those imports (4 to 8 s of CPU a job here, about 200 jobs in
the suite).  The workflow's package is not imported here: each job imports the copy its PYTHONPATH names.

A job reaches it through tests/job_shim.py, which Snakemake runs in place of ``python`` (the tests' Snakemake
server sets ``sys.executable`` to it).  The shim sends its command line, working directory, environment, process
group, umask, resource limits and its standard streams (as file descriptors); the child takes all of them, joins
the shim's process group (a kill of Snakemake's group reaches it), runs the script, and ends as the interpreter
would, without its finalization (tests/forked_exit.py).  The server sends the shim the child's pid, then its wait
status; the shim ends the same way.

Run as ``python tests/job_server.py <socket path>``, with OMP_NUM_THREADS=1 (so that no BLAS thread pool is
running when it forks); it prints one line, ``ready``, once it serves.
"""

import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys

SOCKET_PATH = sys.argv[1]
BASE_PATH = sys.path[1:]  # a fresh interpreter's path, without this file's folder

import importlib  # noqa: E402

from forked_exit import run_then_exit  # noqa: E402

# Libraries that the jobs import (a missing one is left to the job that needs it).  torch._dynamo: every
# torch.optim optimizer imports it at its first step.
WARM_LIBRARIES = ("torch", "torch._dynamo", "torch.func", "torch.distributed", "torch.utils.data", "numpy",
                  "scipy.signal", "scipy.optimize", "dp_accounting", "opacus.grad_sample.conv", "opacus.accountants",
                  "sklearn.metrics", "sklearn.linear_model", "sklearn.cluster", "faiss", "h5py", "PIL.Image",
                  "matplotlib.figure", "matplotlib.backends.backend_agg", "tqdm.auto", "yaml", "jsonschema",
                  "snakemake.script", "torchvision.datasets")
for name in WARM_LIBRARIES:
    try:
        importlib.import_module(name)
    except ImportError:
        pass

HEADER = struct.Struct("!I")


def receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """The shim's request (a length-prefixed JSON object) and the three file descriptors sent with it."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
        chunk = conn.recv(1 << 20)
        if not chunk:
            raise EOFError("the shim closed its connection mid-request")
        data += chunk
    (length,) = HEADER.unpack_from(data)
    return json.loads(data[HEADER.size:HEADER.size + length]), fds


def run_job(request: dict, fds: list[int]) -> None:
    """In the forked child: become the job the shim stands for, then run its script as ``__main__``."""
    try:
        os.setpgid(0, request["pgid"])
    except OSError:
        pass  # the shim's group is of another session: keep the server's
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.umask(request["umask"])
    for name, (soft, hard) in request["rlimits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):
            pass
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has them
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    import numpy

    numpy.random.seed()  # a fresh process's global state, not the server's
    script = os.path.abspath(request["argv"][0])
    python_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script), *python_path, *BASE_PATH]
    sys.argv = list(request["argv"])
    import runpy

    runpy.run_path(script, run_name="__main__")


def serve() -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET_PATH)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wake-up pipe
    running: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, wake_read, sys.stdin], [], [])
        if sys.stdin in ready and not sys.stdin.buffer.read1(1):
            break  # the test process that started the server has ended or closed it
        if wake_read in ready:
            os.read(wake_read, 4096)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass  # the shim has gone
                conn.close()
        if listener in ready:
            conn, _ = listener.accept()
            try:
                request, fds = receive_request(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            gc.freeze()  # the child's collections skip the server's objects (each would copy their pages)
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                os.close(wake_read)
                os.close(wake_write)
                for other in running.values():
                    other.close()
                run_then_exit(run_job, request, fds)
            for fd in fds:
                os.close(fd)
            running[pid] = conn
            try:
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            except OSError:
                pass


if __name__ == "__main__":
    serve()
