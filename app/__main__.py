"""``python -m censusdp.app``: the ``censusdp`` command."""

import sys

from censusdp.app.cli import main

sys.exit(main())
