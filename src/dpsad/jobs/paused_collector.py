"""Imported first by every workflow script: Python's cyclic collector waits while the job's libraries load.

Importing torch creates some 290,000 objects, and the collector's runs meanwhile traced them again and again: 0.2 s
of CPU a job (``benchmarks/job_start.py``).  :func:`dpsad.jobs.stage.run_stage` starts it again before the stage's
body runs, with what the imports built frozen out of its scans; a script that fails before that ends at once."""

import gc

gc.disable()
