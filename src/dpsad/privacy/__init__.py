"""Everything privacy, in two parts and the accountant between them.

- :mod:`.mechanism`: what runs on private records and what makes it DP.  :mod:`.mechanism.dpsgd` (Poisson
  batches from secret seeds, per-example clipping, noise: the DP-SGD step), its per-example engines
  (:mod:`.mechanism.per_example`, :mod:`.mechanism.clipped_sum`) and their precision, :mod:`.mechanism.plan`
  (one DP training's size and noise, and the ledger entries it writes), the central images' Gaussian release
  (:mod:`.mechanism.group_means`), Private Evolution's histograms (:mod:`.mechanism.histogram`) and the digest
  of this code that reruns the DP stages (:mod:`.mechanism.code_digest`).
- :mod:`.accounting`: the :class:`~.accounting.Accountant` (PLD, PRV, RDP), the one way to compose, with its
  cache an injected strategy; the noise calibration.
- :mod:`.books`: what was spent, by scope.  A run: :mod:`.books.ledger` (its entries and verdict) and
  :mod:`.books.integrity` (a stated verdict checked again).  A workspace: :mod:`.books.spent_log`.  The records,
  across workspaces: :mod:`.books.image_digests` (which records a split holds, by content), :mod:`.books.curator_record`
  (the curator's record, outside any workspace, and the witnesses that keep it from going back) and
  :mod:`.books.release_budget` (one budget over all releases of the same records, composed and written).  :mod:`.epsilon_cache`: the verdicts' cache (the calibration's only on request).
- :mod:`.stated`: what a released file states of its guarantee (the trainings it covers, numbers rounded up).

Nothing here reads a Snakemake object or imports the job machinery (tests/test_structure.py).  This package is
the only place that touches Opacus.
"""
