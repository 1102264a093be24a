"""Set up a Valkey before/after comparison for `bench/ab_compare/ab_valkey.sh`: one bench pipeline over four
streams, MESSAGES produced once, and four copies of its config (before1, after1, before2, after2),
each with a consumer group and a lake of its own, so that every run drains the same entries.

    DELTADRAIN_HOME=/tmp/ddab DELTADRAIN_VALKEY_PORT=26996 \\
        .venv/bin/python bench/ab_compare/ab_setup_valkey.py WORKDIR MESSAGES     # prints the pipeline name
"""

import sys
from pathlib import Path

from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.bench import _bench_config, _config_copy
from deltadrain.dev.produce import produce

work = Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)
config, name = _bench_config(work, 4, 200_000)
cfg = load_config(config)
services.up(cfg, ["valkey"])
produce(cfg, cfg.pipeline(name), int(sys.argv[2]), seed=11, progress=False)
for tag in ("before1", "after1", "before2", "after2"):
    _config_copy(config, tag)
print(name)
