"""Keep a long-lived process's garbage from piling up between its full collections.

A run leaves a few hundred objects in reference cycles (an exception and the frames of its
traceback, LangGraph's threads and futures) that live long enough to reach the oldest
generation, which Python collects only once its newcomers outnumber a quarter of what is
already there: here the ~280 000 objects Django, LangGraph and Stripe start with, so not one
full collection in 600 runs, a worker's memory growing ~7 MB per 1000 runs meanwhile (the soak,
docs/reliability.md). Frozen, those objects are left out of every collection and of that count:
full collections then come every few hundred runs at most and look at the runs' objects only.
The collection after the freeze makes Python count anew. Called by each Celery pool process
(``stateguard_web/celery.py``) and each gunicorn process (``gunicorn.conf.py``) once started.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    gc.collect()
    gc.freeze()
    gc.collect()
