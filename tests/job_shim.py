"""Stands in for ``python`` when the tests' Snakemake runs a job's script: the job runs in a fork of the tests' job
server (tests/job_server.py), which has imported the heavy libraries already; this process waits for it and ends
as it ended (its exit code, or the signal that ended it).

Only the standard library, imported without site (``python -S``): it starts in milliseconds.  A command line
other than ``<script>.py`` (``-m snakemake ...``, ``-c ...``), or a server that cannot be reached, runs the real
interpreter instead (DPSAD_TEST_REAL_PYTHON), as without the server.  SIGTERM, SIGINT and SIGHUP are passed on.
"""

import json
import os
import resource
import signal
import socket
import struct
import sys

REAL_PYTHON = os.environ.get("DPSAD_TEST_REAL_PYTHON", "")
SERVER = os.environ.get("DPSAD_TEST_JOB_SERVER", "")


def real_python() -> None:
    os.execv(REAL_PYTHON, [REAL_PYTHON, *sys.argv[1:]])


def main() -> None:
    args = sys.argv[1:]
    if not SERVER or len(args) != 1 or not args[0].endswith(".py") or args[0].startswith("-"):
        real_python()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(SERVER)
    except OSError:
        real_python()
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")}
    umask = os.umask(0)
    os.umask(umask)
    request = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ), "pgid": os.getpgid(0),
                          "umask": umask, "rlimits": limits}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    replies = conn.makefile("rb")
    first = replies.readline()
    if not first:
        sys.exit("error: the tests' job server ended before it started the job")
    child = json.loads(first)["pid"]

    def forward(number, _frame):
        try:
            os.kill(child, number)
        except ProcessLookupError:
            pass

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, forward)
    last = replies.readline()
    if not last:
        sys.exit("error: the tests' job server ended while the job ran")
    status = json.loads(last)["status"]
    if status < 0:  # ended by a signal: end by the same one
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


if __name__ == "__main__":
    main()
