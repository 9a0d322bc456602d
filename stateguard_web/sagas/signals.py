"""What the journal tells the layers above it, without importing them.

``run_waits``: a worker wrote a status on which a run waits for an operator (``paused`` for an
approval, ``needs_attention``), with ``run_code`` and ``status``. Sent right after the status is
written (in the worker's transaction where there is one), rarely (never once per step); a
receiver that does work outside the database queues it on commit and never raises (a saga
must not fail for it). The notifications app
listens (``notifications/receivers.py``).
"""

from __future__ import annotations

from django.dispatch import Signal

run_waits = Signal()
