"""`python -m deltadrain.cli`: the `deltadrain` command."""

import sys

from deltadrain.cli import main

sys.exit(main())
