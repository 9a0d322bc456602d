"""``python -m stateguard``: the ``stateguard`` console command (``stateguard.cli``)."""

import sys

from stateguard.cli import main

sys.exit(main())
