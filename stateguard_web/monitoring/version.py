"""Which code a process runs, for the workers page: a worker left on last week's release
after a deploy (or a web host that was not restarted) shows up there beside the others.

``STATEGUARD_VERSION`` when the deployment sets it (a release tag, an image digest, the
commit a build was made from); otherwise the package's version and, from a git checkout, its
commit (``0.1.0+g1a2b3c4``), read once per process.
"""

from __future__ import annotations

import subprocess
from functools import cache
from importlib import metadata

from django.conf import settings


@cache
def code_version() -> str:
    if settings.STATEGUARD_VERSION:
        return str(settings.STATEGUARD_VERSION)
    try:
        release = metadata.version("stateguard")
    except metadata.PackageNotFoundError:
        release = "unknown"
    try:  # a checkout, not an installed tree: which commit (git's own answer, 2 s at most)
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=2, check=False)
    except (OSError, subprocess.SubprocessError):
        return release
    commit = done.stdout.strip()
    return f"{release}+g{commit}" if done.returncode == 0 and commit else release
