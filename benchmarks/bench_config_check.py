"""What the configuration check (fedlib.config_check.validate_config) adds to every `snakemake -n`.

Per config: the check in a fresh interpreter (as in a dry run: its imports included, after the
schema validation Snakemake does anyway), the check again in the same process (imports paid),
and the whole dry run of rule all for scale. Medians over interleaved repeats (a shared machine).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from common import median, timed, write

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {  # name -> (config files merged in order, working directory)
    "config.yaml": (["config.yaml"], REPO),
    "config/gemma.yaml": (["config.yaml", "config/gemma.yaml"], REPO),
    ".test/config.yaml": ([".test/config.yaml"], REPO / ".test"),
}

CHECK = """
import sys, time, yaml
from pathlib import Path
from snakemake.utils import update_config, validate
config = {}
for f in sys.argv[3:]:
    update_config(config, yaml.safe_load(open(f)))
validate(config, sys.argv[1])
start = time.perf_counter()
from fedlib.config_check import validate_config
validate_config(config, Path(sys.argv[2]))
cold = time.perf_counter() - start
start = time.perf_counter()
validate_config(config, Path(sys.argv[2]))
print(cold, time.perf_counter() - start)
"""


def check_seconds(files: list[str], workdir: Path) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", CHECK, str(REPO / "fedlib/schemas/config.schema.yaml"),
                          str(workdir), *[str(REPO / f) for f in files]],
                         capture_output=True, text=True, check=True, env=env, cwd=REPO).stdout.split()
    return float(out[0]), float(out[1])


def dry_run(files: list[str], workdir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    extra = ["--configfile", *[str(REPO / f) for f in files[1:]]] if len(files) > 1 else []
    subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                    "-n", "--cores", "2", "--quiet", *extra], capture_output=True, check=True, env=env, cwd=workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {}
    for name, (files, workdir) in CONFIGS.items():
        cold, warm, dry = [], [], []
        for _ in range(args.repeats):
            c, w = check_seconds(files, workdir)
            cold.append(c)
            warm.append(w)
            dry += timed(lambda: dry_run(files, workdir), 1)
        results[name] = {"check_cold_seconds": cold, "check_warm_seconds": warm, "dry_run_seconds": dry,
                         "check_cold_median": median(cold), "check_warm_median": median(warm),
                         "dry_run_median": median(dry)}
        print(f"{name}: check {median(cold):.2f}s in a fresh interpreter ({median(warm):.3f}s warm); "
              f"whole `snakemake -n` {median(dry):.1f}s")
    write("config_check", {"repeats": args.repeats, "configs": results})


if __name__ == "__main__":
    main()
