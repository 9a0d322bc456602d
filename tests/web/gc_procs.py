"""A pool process's start as Celery makes it (``worker_process_init``, with or without the app's
receivers), then ``RUNS`` runs' worth of garbage, as a worker's runs leave it: many objects in
cycles found by a young collection, and 40 that live long enough to reach the oldest generation
first; prints how many full collections Python made of itself meanwhile.

    python -m tests.web.gc_procs RUNS [--without-the-apps-receivers]
"""

from __future__ import annotations

import gc
import itertools
import sys

import django


class _Node:
    pass


def main(argv: list[str]) -> None:
    django.setup()
    from celery.signals import worker_process_init

    import stateguard_web.celery  # noqa: F401  (connects the app's receivers)

    if "--without-the-apps-receivers" in argv:
        worker_process_init.receivers.clear()
    worker_process_init.send(sender=None)
    before = gc.get_stats()[2]["collections"]
    live: list[list[_Node]] = []
    for _ in range(int(argv[0])):
        for _ in range(1000):  # what a run makes and drops, found by a young collection
            made: list[object] = []
            made.append(made)
        run = [_Node() for _ in range(40)]  # a cycle: each links to the next and back
        for a, b in itertools.pairwise(run):
            a.next, b.prev = b, a  # type: ignore[attr-defined]
        live.append(run)
        if len(live) > 20:  # outlived collections of the young generations: garbage now
            live.pop(0)
    print(gc.get_stats()[2]["collections"] - before)


if __name__ == "__main__":
    main(sys.argv[1:])
