"""Print uv's options for the package sources pip is configured with on this machine (pip.conf, PIP_* variables).

uv reads no pip configuration.  Where a machine keeps wheels on its disk for pip (``find-links``, a ``file://``
``extra-index-url``), ``make`` passes them to uv too, so that torch's CUDA build (several GB) is not downloaded
again.  A machine with no such configuration prints nothing and uv uses PyPI alone.
"""

from __future__ import annotations

import shlex
import subprocess
import sys


def configured_sources(listing: str) -> tuple[list[str], list[str]]:
    """``pip config list`` output -> (find-links entries, extra index URLs), in pip's order, each once."""
    links: list[str] = []
    indexes: list[str] = []
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        target = links if key.endswith(".find-links") else indexes if key.endswith(".extra-index-url") else None
        if target is not None:
            target.extend(entry for entry in shlex.split(value)[0].split() if entry not in target)
    return links, indexes


def uv_options(listing: str) -> str:
    links, indexes = configured_sources(listing)
    options = [f"--find-links {shlex.quote(link)}" for link in links]
    options += [f"--extra-index-url {shlex.quote(url)}" for url in indexes]
    if indexes:  # a pinned version that pip's extra index holds is taken from it, not from PyPI
        options.append("--index-strategy unsafe-best-match")
    return " ".join(options)


if __name__ == "__main__":
    result = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    print(uv_options(result.stdout if result.returncode == 0 else ""))
