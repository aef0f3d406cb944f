# The domain-shift study (target domain, not part of `make run`): private in-domain text vs public
# text, and the DP masks that degrade to the public mask. Sizes, files, report spec: DOMAIN
# (fedlib.catalog.domain); mechanisms: fedlib.dp.public and fedlib.dp.distributed.

from fedlib.catalog.domain import DomainCatalog

DOMAIN = DomainCatalog(CATALOG)
DOMAIN_BASE = DOMAIN.base
DOMAIN_EVAL_DTYPE = DOMAIN.d["evaluation"]["dtype"]


wildcard_constraints:
    kind="private|control",
    dseed=r"\d+",
    dsp=r"[0-9.]+",
    dpdir=r"dp(-n[1-9]\d*)?",


rule domain_pool:
    """A token file of the study: the clients' in-domain or C4 pool, the public text, or the
    membership game's population."""
    input:
        model=MODEL_READY,
    output:
        f"{DOMAIN_BASE}/pools/{{role}}-s{{dseed}}.safetensors",
    log:
        f"{LOGS}/domain/pools/{{role}}-s{{dseed}}.log",
    benchmark:
        f"{BENCH}/domain/pools/{{role}}-s{{dseed}}.tsv"
    wildcard_constraints:
        role="private|control|public|population|public_membership",
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        data_dir=data_dir_arg(),
        args=lambda wc: DOMAIN.pool_args(wc.role, wc.dseed),
    shell:
        f"{FEDLIB} calibration-pool --model {{params.model}} --data-dir {{params.data_dir}} {{params.args}} "
        "--out {output} > {log} 2>&1"


rule domain_shard:
    """One client's part of the pool (IID, seeded by the data seed)."""
    input:
        f"{DOMAIN_BASE}/pools/{{kind}}-s{{dseed}}.safetensors",
    output:
        f"{DOMAIN_BASE}/{{kind}}/s{{dseed}}/shards/client_{{client}}.safetensors",
    log:
        f"{LOGS}/domain/{{kind}}/s{{dseed}}/shard_{{client}}.log",
    benchmark:
        f"{BENCH}/domain/{{kind}}/s{{dseed}}/shard_{{client}}.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        n=DOMAIN.d["clients"],
    shell:
        f"{FEDLIB} client-data --pool {{input}} --n-clients {{params.n}} --client {{wildcards.client}} "
        "--partition iid --seed {wildcards.dseed} --out {output} > {log} 2>&1"


rule domain_mask:
    """Plain Wanda: Centralized (the pool), the public + private mix, or one client (its shard)."""
    input:
        model=MODEL_READY,
        calib=lambda wc: DOMAIN.mask_calib(wc.kind, wc.dseed, wc.which),
    output:
        f"{DOMAIN_BASE}/{{kind}}/s{{dseed}}/sp{{dsp}}/{{which}}.mask.safetensors",
    log:
        f"{LOGS}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/{{which}}.log",
    benchmark:
        f"{BENCH}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/{{which}}.tsv"
    wildcard_constraints:
        which=r"central|mix|client_\d+",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} client-mask --model {{params.model}} --calib {{input.calib}} --method wanda "
        "--sparsity {wildcards.dsp} --local-group row --seed 0 --client-id {wildcards.which} "
        "--batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule domain_public_mask:
    """ε = 0: plain Wanda on the public text (also the DP clients' prefix and prior)."""
    input:
        model=MODEL_READY,
        calib=f"{DOMAIN_BASE}/pools/public-s{{dseed}}.safetensors",
    output:
        f"{DOMAIN_BASE}/public/s{{dseed}}/sp{{dsp}}/public.mask.safetensors",
    log:
        f"{LOGS}/domain/public/s{{dseed}}/sp{{dsp}}.log",
    benchmark:
        f"{BENCH}/domain/public/s{{dseed}}/sp{{dsp}}.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} client-mask --model {{params.model}} --calib {{input.calib}} --method wanda "
        "--sparsity {wildcards.dsp} --local-group row --seed 0 --client-id public "
        "--batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule domain_fedprllm:
    """FedPrLLM (layer comparison) over the clients' plain Wanda masks."""
    input:
        model=MODEL_READY,
        masks=lambda wc: [DOMAIN.mask(wc.kind, wc.dsp, wc.dseed, f"client_{c}") for c in range(DOMAIN.d["clients"])],
    output:
        mask=f"{DOMAIN_BASE}/{{kind}}/s{{dseed}}/sp{{dsp}}/fedprllm.mask.safetensors",
        report=f"{DOMAIN_BASE}/{{kind}}/s{{dseed}}/sp{{dsp}}/fedprllm.mask.clients.json",
    log:
        f"{LOGS}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/fedprllm.log",
    benchmark:
        f"{BENCH}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/fedprllm.tsv"
    conda:
        "../../envs/fedlib.yaml"
    resources:
        mem_mb=job_mem_mb("layers"),
    params:
        model=model_folder,
    shell:
        f"{FEDLIB} aggregate --model {{params.model}} --strategy fedprllm --server-group layer --sparsity {{wildcards.dsp}} "
        "--seed 0 --out {output.mask} --report {output.report} {input.masks} > {log} 2>&1"


rule domain_dp:
    """One pass of the clients' data through the public mask's prefix: every DP mechanism's masks
    at every ε (fedlib.privacy.stages.dp_federation), for one noise draw (folder dp, dp-n1, ...)."""
    input:
        model=MODEL_READY,
        public=f"{DOMAIN_BASE}/pools/public-s{{dseed}}.safetensors",
        clients=lambda wc: [DOMAIN.shard(wc.kind, wc.dseed, c) for c in range(DOMAIN.d["clients"])],
    output:
        masks=DOMAIN.dp_file_patterns(),
        record=f"{DOMAIN_BASE}/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}/pass.json",
    log:
        f"{LOGS}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}.log",
    benchmark:
        f"{BENCH}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["public", "clients"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        releases=json.dumps(DOMAIN.releases()),
        out_dir=lambda wc: DOMAIN.dp_dir(wc.kind, wc.dsp, wc.dseed, DOMAIN.draw_of(wc.dpdir)),
        noise_seed=lambda wc: DOMAIN.noise_seed(wc.dseed, DOMAIN.draw_of(wc.dpdir)),
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy dp-federation --model {{params.model}} --public {{input.public}} "
        "--calib {input.clients} --method wanda --sparsity {wildcards.dsp} --local-group row --seed 0 "
        "--releases {params.releases:q} --noise-seed {params.noise_seed} --out-dir {params.out_dir} "
        "--record {output.record} --batch-size {params.batch_size} {params.placement} --threads {threads} "
        "> {log} 2>&1"


rule domain_dp_fedprllm:
    """FedPrLLM (layer comparison) over the clients' normalised DP masks of one release."""
    input:
        model=MODEL_READY,
        masks=lambda wc: DOMAIN.dp_client_masks(wc.kind, wc.dsp, wc.dseed, wc.label, DOMAIN.draw_of(wc.dpdir)),
    output:
        mask=f"{DOMAIN_BASE}/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}/{{label}}/fedprllm.mask.safetensors",
        report=f"{DOMAIN_BASE}/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}/{{label}}/fedprllm.mask.clients.json",
    log:
        f"{LOGS}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}/{{label}}/fedprllm.log",
    benchmark:
        f"{BENCH}/domain/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}/{{label}}/fedprllm.tsv"
    wildcard_constraints:
        label=r"[a-z_]+-[0-9.]+",
    conda:
        "../../envs/fedlib.yaml"
    resources:
        mem_mb=job_mem_mb("layers"),
    params:
        model=model_folder,
    shell:
        f"{FEDLIB} aggregate --model {{params.model}} --strategy fedprllm --server-group layer --sparsity {{wildcards.dsp}} "
        "--seed 0 --out {output.mask} --report {output.report} {input.masks} > {log} 2>&1"


rule domain_eval_windows:
    """The in-domain test split (all windows) and the guards' evenly spaced windows."""
    input:
        model=MODEL_READY,
    output:
        f"{DOMAIN_BASE}/eval_windows/{{dataset}}.safetensors",
    log:
        f"{LOGS}/domain/eval_windows/{{dataset}}.log",
    benchmark:
        f"{BENCH}/domain/eval_windows/{{dataset}}.tsv"
    wildcard_constraints:
        dataset=r"[a-z0-9]+",
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        data_dir=data_dir_arg(),
        seqlen=EVAL["seqlen"],
        args=lambda wc: DOMAIN.eval_window_args(wc.dataset),
    shell:
        f"{FEDLIB} eval-windows --model {{params.model}} --data-dir {{params.data_dir}} --dataset {{wildcards.dataset}} "
        "--seqlen {params.seqlen} {params.args} --out {output} > {log} 2>&1"


rule domain_validation_windows:
    """The in-domain validation split, as many evenly spaced windows as the study scores on test:
    where the headroom analysis chooses an estimator (domain.headroom.split: validation)."""
    input:
        model=MODEL_READY,
    output:
        DOMAIN.validation_windows("{dataset}"),
    log:
        f"{LOGS}/domain/eval_windows/{{dataset}}-validation.log",
    benchmark:
        f"{BENCH}/domain/eval_windows/{{dataset}}-validation.tsv"
    wildcard_constraints:
        dataset=r"[a-z0-9]+",
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        data_dir=data_dir_arg(),
        seqlen=EVAL["seqlen"],
        args=lambda wc: DOMAIN.eval_window_args(wc.dataset),
    shell:
        f"{FEDLIB} eval-windows --model {{params.model}} --data-dir {{params.data_dir}} --dataset {{wildcards.dataset}} "
        "--split validation --seqlen {params.seqlen} {params.args} --out {output} > {log} 2>&1"


DOMAIN_WINDOWS = [DOMAIN.eval_windows(d) for d in DOMAIN.eval_datasets()]


rule domain_eval:
    """Perplexity of one of the study's masks, per window (paired comparisons): on the study's
    windows (.eval.json), or on the in-domain validation windows (.validation.json: the headroom
    analysis's, domain.headroom.split)."""
    input:
        model=MODEL_READY,
        mask=f"{DOMAIN_BASE}/{{path}}.mask.safetensors",
        windows=lambda wc: (DOMAIN_WINDOWS if wc.scored == "eval" else [DOMAIN.validation_windows(DOMAIN.d["private"])]),
    output:
        f"{DOMAIN_BASE}/{{path}}.{{scored}}.json",
    log:
        f"{LOGS}/domain/{{path}}.{{scored}}.log",
    benchmark:
        f"{BENCH}/domain/{{path}}.{{scored}}.tsv"
    wildcard_constraints:
        path=r"(private|control|public)/.+",
        scored="eval|validation",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["windows"], batch_size=1, logits=True),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        placement=f"--device {DEVICE} --dtype {DOMAIN_EVAL_DTYPE}",
    shell:
        f"{FEDLIB} evaluate --model {{params.model}} --mask {{input.mask}} --windows {{input.windows}} "
        "--label {wildcards.path} --batch-size 1 {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule domain_dense_eval:
    """The dense model's perplexity in the study's evaluation dtype and in float32 (what that dtype costs)."""
    input:
        model=MODEL_READY,
        windows=DOMAIN_WINDOWS,
    output:
        f"{DOMAIN_BASE}/dense-{{dtype}}.eval.json",
    log:
        f"{LOGS}/domain/dense-{{dtype}}.eval.log",
    benchmark:
        f"{BENCH}/domain/dense-{{dtype}}.eval.tsv"
    wildcard_constraints:
        dtype="float32|bfloat16|float16",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["windows"], batch_size=1, logits=True),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        device=DEVICE,
    shell:
        f"{FEDLIB} evaluate --model {{params.model}} --windows {{input.windows}} --label dense-{{wildcards.dtype}} "
        "--batch-size 1 --device {params.device} --dtype {wildcards.dtype} --threads {threads} --out {output} > {log} 2>&1"


rule domain_membership:
    """LiRA membership game against one DP mechanism at one ε (its block-0 masks, each with its own
    noise; the mechanism accounted over those blocks): the audited ε lower bound."""
    input:
        model=MODEL_READY,
        population=f"{DOMAIN_BASE}/pools/population-s0.safetensors",
        public=f"{DOMAIN_BASE}/pools/public_membership-s0.safetensors",
    output:
        f"{DOMAIN_BASE}/membership/{{label}}.json",
    log:
        f"{LOGS}/domain/membership/{{label}}.log",
    benchmark:
        f"{BENCH}/domain/membership/{{label}}.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["population", "public"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        sparsity=DOMAIN.membership_sparsity(),
        args=lambda wc: DOMAIN.membership_args(wc.label),
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy membership --model {{params.model}} --population {{input.population}} "
        "--method wanda --sparsity {params.sparsity} --local-group row --seed 0 {params.args} --dp-public {input.public} "
        "{params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule domain_report:
    input:
        DOMAIN.inputs(),
    output:
        DOMAIN.outputs(),
    log:
        f"{LOGS}/report/domain.log",
    benchmark:
        f"{BENCH}/report/domain.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        spec=json.dumps(DOMAIN.spec()),
    shell:
        f"{FEDLIB} privacy domain-report --spec {{params.spec:q}} > {{log}} 2>&1"


rule domain_headroom_pass:
    """What limits the distributed DP masks (fedlib.privacy.dp_headroom): the exact private energies,
    the shipped estimator and a candidate at emulated data sizes, an oracle reference, on one
    setting's private data."""
    input:
        model=MODEL_READY,
        public=DOMAIN.pool("public", DOMAIN.headroom_setting()[1]),
        clients=[DOMAIN.shard("private", DOMAIN.headroom_setting()[1], c) for c in range(DOMAIN.d["clients"])],
        windows=DOMAIN.headroom_windows(),
    output:
        DOMAIN.headroom_json(),
    log:
        f"{LOGS}/domain/headroom.log",
    benchmark:
        f"{BENCH}/domain/headroom.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("headroom", tokens=["public", "clients"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        variants=lambda wc: json.dumps(DOMAIN.headroom()["variants"]),
        seeds=lambda wc: " ".join(str(s) for s in DOMAIN.headroom()["noise_seeds"]),
        sparsity=DOMAIN.headroom_setting()[0],
        clip=DOMAIN.d["clip"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
        eval_dtype=DOMAIN_EVAL_DTYPE,
    shell:
        f"{FEDLIB} privacy dp-headroom --model {{params.model}} --public {{input.public}} --calib {{input.clients}} "
        "--windows {input.windows} --variants {params.variants:q} --noise-seeds {params.seeds} --clip {params.clip} "
        "--method wanda --sparsity {params.sparsity} --local-group row --seed 0 --batch-size {params.batch_size} "
        "{params.placement} --eval-dtype {params.eval_dtype} --eval-threads 1 --threads {threads} --out {output} > {log} 2>&1"


rule domain_headroom:
    """The DP headroom table (reports/headroom.{md,csv}; needs domain.headroom; not part of rule all)."""
    input:
        **DOMAIN.headroom_evals(),
        headroom=DOMAIN.headroom_json(),
    output:
        **DOMAIN.headroom_outputs(),
    log:
        f"{LOGS}/report/headroom.log",
    benchmark:
        f"{BENCH}/report/headroom.tsv"
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        dataset=DOMAIN.d["private"],
        model=config["model"]["name"],
        config=CATALOG.config_files,
    shell:
        f"{FEDLIB} privacy headroom-report --headroom {{input.headroom}} --public-eval {{input.public}} "
        "--central-eval {input.central} --dataset {params.dataset} --model-name {params.model} --config {params.config:q} "
        "--out {output.md} > {log} 2>&1"


rule domain:
    """The domain-shift study (reports/domain.{md,csv,png}; not part of rule all)."""
    input:
        DOMAIN.outputs(),
