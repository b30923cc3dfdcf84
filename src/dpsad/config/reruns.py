"""What prepare_data's params may hold, so that reruns follow what it computes: the release and location keys
kept out, sorted keys.  A training's params are its settings' :meth:`~dpsad.config.settings.Settings.result_view`."""

from __future__ import annotations

from .settings import sorted_keys


# Keys that decide how a job runs, not what it computes.  They are kept out of the rules' params, so a
# change never reruns a stage (a rerun of a DP stage would read the private records again).
RELEASE_KEYS = ("privacy_budget", "release", "earlier_use")  # what leaves results/ and what it states, not what is computed


# Where the source files are, not what they hold: moving the data must not rerun prepare_data (and every DP
# stage after it).  What they hold is the stage's source_checksum parameter (dpsad.data.fingerprint).
LOCATION_KEYS = ("root", "path", "download")


def data_settings(section: dict) -> dict:
    """A ``data.<name>`` section without its release and location keys: what prepare_data's result depends on."""
    kept = {key: value for key, value in section.items() if key not in RELEASE_KEYS + LOCATION_KEYS}
    if not kept.get("without_bundled_digits", True):
        del kept["without_bundled_digits"]  # false is the absent key's meaning: written out, it reruns nothing
    if isinstance(kept.get("public"), dict):
        kept["public"] = sorted_keys({k: v for k, v in kept["public"].items() if k not in LOCATION_KEYS})
    return sorted_keys(kept)
