# Cost tables (FedPrLLM Table 3, Tables 15-16, App. D.3; fedlib.cost): transfer and network in
# rule all (deterministic, from files `make run` has), time and memory a named target (measured).

from fedlib.cost import fedspallm_record, time_inputs, time_spec, transfer_inputs

COST_INPUTS = transfer_inputs(CATALOG)
COST_CONTEXT = json.dumps(CATALOG.report_context(*CATALOG.setting()))
COST_TIME_SPEC = time_spec(CATALOG, BENCH)


rule cost_transfer:
    """Table 3 analogue: bytes (and mask entries) each client uploads and downloads, one-shot vs
    iterative FedPrLLM, from the real client files and the files the iterative protocol sends."""
    input:
        model=MODEL_READY,
        clients=COST_INPUTS["clients"],
        glob=COST_INPUTS["glob"],
    output:
        md=f"{REPORTS}/cost_transfer.md",
        csv=f"{REPORTS}/cost_transfer.csv",
        html=report(f"{REPORTS}/cost_transfer.html", caption="../report/cost_transfer.rst", category="Cost"),
        record=f"{RESULTS}/cost/transfer.json",
    log:
        f"{LOGS}/cost/transfer.log",
    benchmark:
        f"{BENCH}/cost/transfer.tsv"
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        context=COST_CONTEXT,
        fedspallm="",
    shell:
        f"{FEDLIB} cost transfer --model {{params.model}} --client-masks {{input.clients}} --global {{input.glob}} "
        "{params.fedspallm} --record {output.record} --context {params.context:q} --out-md {output.md} "
        "--out-csv {output.csv} --out-html {output.html} > {log} 2>&1"


rule cost_network:
    """Table 16 / App. D.3 analogue: communication time of every strategy under network profiles,
    with and without 20 % stragglers, modelled over the measured bytes of cost_transfer."""
    input:
        model=MODEL_READY,
        record=f"{RESULTS}/cost/transfer.json",
    output:
        md=f"{REPORTS}/cost_network.md",
        csv=f"{REPORTS}/cost_network.csv",
        html=report(f"{REPORTS}/cost_network.html", caption="../report/cost_network.rst", category="Cost"),
    log:
        f"{LOGS}/cost/network.log",
    benchmark:
        f"{BENCH}/cost/network.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        context=COST_CONTEXT,
    shell:
        f"{FEDLIB} cost network --model {{params.model}} --record {{input.record}} --context {{params.context:q}} "
        "--out-md {output.md} --out-csv {output.csv} --out-html {output.html} > {log} 2>&1"


rule cost_time_table:
    """Table 15 analogue: client time (mean, max), server time and peak memory per strategy, from
    the jobs' benchmark files (measurements: a named target, not in rule all)."""
    input:
        model=MODEL_READY,
        bench=time_inputs(COST_TIME_SPEC),
    output:
        md=f"{REPORTS}/cost_time.md",
        csv=f"{REPORTS}/cost_time.csv",
        html=report(f"{REPORTS}/cost_time.html", caption="../report/cost_time.rst", category="Cost"),
    log:
        f"{LOGS}/cost/time.log",
    benchmark:
        f"{BENCH}/cost/time.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        context=COST_CONTEXT,
        spec=json.dumps(COST_TIME_SPEC),
    shell:
        f"{FEDLIB} cost time --model {{params.model}} --spec {{params.spec:q}} --context {{params.context:q}} "
        "--out-md {output.md} --out-csv {output.csv} "
        "--out-html {output.html} > {log} 2>&1"


# FedSpaLLM's row needs its simulation of the default setting's clients: named target cost_fedspallm
use rule cost_transfer as cost_transfer_fedspallm with:
    input:
        model=MODEL_READY,
        clients=COST_INPUTS["clients"],
        glob=COST_INPUTS["glob"],
        fedspallm=fedspallm_record(CATALOG),
    output:
        md=f"{REPORTS}/cost_transfer_fedspallm.md",
        csv=f"{REPORTS}/cost_transfer_fedspallm.csv",
        html=report(f"{REPORTS}/cost_transfer_fedspallm.html", caption="../report/cost_transfer.rst", category="Cost"),
        record=f"{RESULTS}/cost/transfer_fedspallm.json",
    log:
        f"{LOGS}/cost/transfer_fedspallm.log",
    benchmark:
        f"{BENCH}/cost/transfer_fedspallm.tsv"
    params:
        model=model_folder,
        context=COST_CONTEXT,
        fedspallm=lambda wc, input: f"--fedspallm {input.fedspallm}",


use rule cost_network as cost_network_fedspallm with:
    input:
        model=MODEL_READY,
        record=f"{RESULTS}/cost/transfer_fedspallm.json",
    output:
        md=f"{REPORTS}/cost_network_fedspallm.md",
        csv=f"{REPORTS}/cost_network_fedspallm.csv",
        html=report(f"{REPORTS}/cost_network_fedspallm.html", caption="../report/cost_network.rst", category="Cost"),
    log:
        f"{LOGS}/cost/network_fedspallm.log",
    benchmark:
        f"{BENCH}/cost/network_fedspallm.tsv"


rule cost_fedspallm:
    """Named target: the transfer and network tables with FedSpaLLM's row (runs its simulation)."""
    input:
        f"{REPORTS}/cost_transfer_fedspallm.md",
        f"{REPORTS}/cost_network_fedspallm.md",


rule cost_time:
    """Named target: the time and memory table (measurements, so not in rule all)."""
    input:
        f"{REPORTS}/cost_time.md",
