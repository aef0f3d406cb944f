# fedlib: federated pruning of LLMs (FedPrLLM). Stages live in workflow/rules/*.smk;
# the logic lives in the fedlib library, which every rule calls through the `fedlib` CLI.

import os
import shlex
import sys

from snakemake.logging import logger
from snakemake.utils import min_version
from snakemake_interface_executor_plugins.settings import DeploymentMethod, ExecMode

from fedlib.runlock import claim_workdir

# written and tested with Snakemake 9 (pyproject.toml pins the version `make install` installs)
min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# A run killed with kill -9 left Snakemake's lock: removed when no other Snakemake of this
# workflow is alive here (fedlib.runlock); jobs on cluster nodes (not the main process) skip it.
if workflow.exec_mode == ExecMode.DEFAULT and claim_workdir():
    logger.info("Removed the lock of an earlier run that is no longer running (.snakemake/locks).")

# Jobs run this checkout's fedlib (`python -m fedlib`, PYTHONPATH) with the `python` of their
# environment: a conda environment of envs/fedlib.yaml, or else the interpreter that runs
# Snakemake (the .venv of `make install`, whether or not it is activated).
# (braces doubled twice: once for these f-strings, once for Snakemake's own formatting)
_JOB_ENV = f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
    _JOB_ENV += f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH; "
shell.prefix(_JOB_ENV)


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
