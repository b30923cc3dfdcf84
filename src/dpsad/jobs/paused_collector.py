"""Imported first by every workflow script: Python's cyclic collector waits while the job's libraries load.

Importing torch creates some 290,000 objects, and the collector's runs meanwhile traced them again and again.
:func:`dpsad.jobs.stage.resume_the_collector` starts it again, as ``run_stage`` begins, with what the imports built
frozen out of its scans; a script that fails before that ends at once."""

import gc

gc.disable()
