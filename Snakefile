# fedlib: federated pruning of LLMs (FedPrLLM). Stages live in workflow/rules/*.smk;
# the logic lives in the fedlib library, which every rule calls through the `fedlib` CLI (FEDLIB).
# Another workflow can use this one as a module (`module fedlib: snakefile: ...`): nothing
# here changes the importer's shell, environment or locks.

import shlex
import sys

from snakemake.utils import min_version

# written and tested with Snakemake 9 (pyproject.toml pins the version `make install` installs)
min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


# this workflow's folder, also where another workflow imports it as a module
CHECKOUT = str(workflow.current_basedir)


include: "workflow/rules/common.smk"


# Jobs run this checkout's fedlib (its folder first on PYTHONPATH, set in each job's own shell)
# with the `python` of their environment: a conda environment of envs/fedlib.yaml, or else the
# interpreter that runs Snakemake (the .venv of `make install`, whether or not it is activated).
# The rules write it into their commands when they are read (f-strings: Snakemake formats a
# module's commands without the module's variables), so its braces are doubled for Snakemake.
_PYTHON = (
    "python" if "conda" in map(str, workflow.deployment_settings.deployment_method) else shlex.quote(sys.executable)
)
FEDLIB = f"PYTHONPATH={shlex.quote(CHECKOUT)}${{{{PYTHONPATH:+:$PYTHONPATH}}}} {_PYTHON} -m fedlib"


include: "workflow/rules/model.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/clients.smk"
include: "workflow/rules/server.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/zeroshot.smk"
include: "workflow/rules/studies.smk"
include: "workflow/rules/privacy.smk"
include: "workflow/rules/domain.smk"
include: "workflow/rules/cost.smk"


rule all:
    default_target: True
    input:
        f"{REPORTS}/table1.md",
        f"{REPORTS}/table1.csv",
        f"{REPORTS}/table12_run.md",
        f"{REPORTS}/table12_run.csv",
        PRIVACY_RUN_REPORTS,  # reduced privacy audit (workflow/rules/privacy.smk)
        f"{REPORTS}/cost_transfer.md",  # upload/download and network profiles (workflow/rules/cost.smk)
        f"{REPORTS}/cost_network.md",
