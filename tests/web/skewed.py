"""``python -m tests.web.skewed SECONDS MODULE *ARGS``: ``python -m MODULE *ARGS`` in a process
whose clock is SECONDS off (``time_machine``, ticking; also in the processes it forks, such as
Celery's pool): a host whose clock drifted, for the clock-skew tests (``test_worker_faults``)."""

from __future__ import annotations

import runpy
import sys
import time

import time_machine

if __name__ == "__main__":
    offset, module, *argv = sys.argv[1:]
    time_machine.travel(time.time() + float(offset), tick=True).start()
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
