"""Settings for ``bench/p6_api.py`` only: the site's own settings and a URLconf that adds the
floor views (``bench/p6_urls.py``). Nothing here is served by a deployment."""

from __future__ import annotations

from stateguard_web.settings import *  # noqa: F403

ROOT_URLCONF = "bench.p6_urls"

# Experiment switch (bench only): no middleware at all, to see what the stack's thread hops
# cost on each path (not a configuration to run: no HTTPS redirect, sessions or CSRF).
if env.str("P6_MIDDLEWARE", default="") == "none":  # noqa: F405
    MIDDLEWARE = []
