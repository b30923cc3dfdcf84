"""How a forked child of the tests' servers (job_server.py, snakemake_server.py) ends: as the interpreter's own
exit would end it, without the interpreter's finalization.

The exit is the same to its parent and its files: non-daemon threads joined, atexit handlers run (logging's
among them), the standard streams flushed, and the exit status of ``python <script>``: 0, a SystemExit's code
(a message is printed and gives 1), 1 after an uncaught exception's traceback, or death by SIGINT after an
uncaught KeyboardInterrupt.  What is left out is the finalization, which frees every object the child
inherited from its server: each free writes to a page shared with the server, so the kernel copies it.  A
forked child of the job server's libraries that ran a small torch product took 1.50 s of CPU ended by
``sys.exit``, 0.12 s ended this way (benchmarks/fork_exit.py; about 200 jobs in the suite).  The workflow's scripts close their files themselves (``with``
blocks, atomic renames); an unclosed file would lose its buffer here, so a test would fail, not pass.
"""

import atexit
import os
import signal
import sys
import threading


def _exit_status(code) -> int:
    """The exit status the interpreter gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_then_exit(function, *args) -> None:
    """``function(*args)``, then the process's end as described above (never returns)."""
    interrupted = False
    try:
        function(*args)
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status, interrupted = 130, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # what the interpreter's exit does first: wait for the non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if interrupted:  # as the interpreter ends after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)
