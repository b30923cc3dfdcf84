"""Everything privacy, one module a question:

- :mod:`.mechanism`, :mod:`.per_example`: the DP-SGD step (per-example gradients, clipping, noise, Poisson
  batches from secret seeds); :mod:`.group_means`: the central images' one Gaussian release.
- :mod:`.plan`: how one DP training is sized and its noise calibrated, and the ledger entries it writes.
- :mod:`.accounting`: the accountants (PLD, PRV, RDP): epsilon of a composition, sigma for a target.
  :mod:`.epsilon_memo`: a stated epsilon composed once and remembered for the jobs that check it.
- :mod:`.ledger`: what one artifact was built with (its entries, composed into its verdict).
- :mod:`.spent_log`: everything the curator spent on a dataset's records, released or not (``spent.jsonl``).
- :mod:`.curator_record`: the curator's record of every release, keyed by the private records (one database
  per curator, outside any workspace); :mod:`.curator_witness`: the heads that keep it from going back;
  :mod:`.curator_legacy`: the old per-workspace folder, imported.
- :mod:`.release_budget`: one budget over all releases of the same records (``BUDGET.json``'s composition).
- :mod:`.records`: which records a split holds, by content; :mod:`.integrity`: a stated verdict checked
  against its ledger and checkpoint; :mod:`.code`: the digest of the mechanism's code.

This package is the only place that touches Opacus.
"""
