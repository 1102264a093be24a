"""`python -m deltadrain.dev.bench PHASE CONFIG PIPELINE WORKDIR ARG`: one phase in a process of its own."""

import json
import sys

from deltadrain.dev.bench.phases import run_phase

print(json.dumps(run_phase(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))))
