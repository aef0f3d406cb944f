# fedlib: federated pruning of LLMs (FedPrLLM). Stages live in workflow/rules/*.smk;
# the logic lives in the fedlib library, which every rule calls through the `fedlib` CLI.

from snakemake.utils import min_version

# written and tested with Snakemake 9 (pyproject.toml pins the version `make install` installs)
min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
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
