"""The ``fenceline-mcp`` console script: says how to install the gateway's dependencies when
they are missing (``fenceline-client`` without its ``gateway`` extra), else runs it."""

import sys


def main() -> int:
    try:
        from fenceline_client.gateway import server  # here: the extra may be missing
    except ImportError as missing:
        package = (missing.name or "a dependency").split(".")[0]
        print(f"fenceline-mcp: {package} is not installed: pip install 'fenceline-client[gateway]'", file=sys.stderr)
        return 2
    return server.main()
