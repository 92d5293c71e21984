"""``python -m fenceline_client.gateway``: the same as ``fenceline-mcp``."""

import sys

from fenceline_client.gateway.cli import main

sys.exit(main())
