# Privacy audit rules; sizes, paths and the report specs: PRIVACY (common.smk, fedlib.catalog.privacy);
# the analyses, which target runs each and what it writes: fedlib.privacy_analyses.


rule privacy_entropy:
    """Bits per entry of client 0's mask vs the fp16 weights; entropy across all clients' masks."""
    input:
        model=MODEL_READY,
        masks=PRIVACY.client_masks(),
    output:
        f"{PRIV_BASE}/entropy.json",
    log:
        f"{LOGS}/privacy/entropy.log",
    benchmark:
        f"{BENCH}/privacy/entropy.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("layers"),
    params:
        model=model_folder,
    shell:
        f"{FEDLIB} privacy entropy --model {{params.model}} --threads {{threads}} --out {{output}} {{input.masks}} > {{log}} 2>&1"


rule privacy_similarity:
    """Hamming distances between every pair of client masks (+ seeded whole-model draws)."""
    input:
        model=MODEL_READY,
        masks=PRIVACY.client_masks(),
    output:
        f"{PRIV_BASE}/{{size}}/similarity.json",
    log:
        f"{LOGS}/privacy/{{size}}/similarity.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/similarity.tsv"
    wildcard_constraints:
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: config.get("threads", 2)
    resources:
        mem_mb=job_mem_mb("blocks", count=lambda wc: PRIVACY.similarity_tokens(wc.size)),
        gpu=lambda wc: MODEL_JOB_GPUS if PRIVACY.of(wc.size, "similarity")["seeds"] else 0,
    params:
        model=model_folder,
        pruning=PRIVACY.pruning_args(),
        seeds=lambda wc: PRIVACY.similarity_seeds_args(
            wc.size, data_dir_arg(), span_arg("--c4-docs", config["calibration"].get("c4_docs"))
        ),
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy similarity --model {{params.model}} {{params.pruning}} {{params.seeds}} "
        "--batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} {input.masks} > {log} 2>&1"


rule privacy_sensitivity:
    """Masks of client 0's data and of data sets differing from it in exactly one sample."""
    input:
        model=MODEL_READY,
        calib=PRIVACY.shard(0),
        base=PRIVACY.client_masks()[0],
        replacements=lambda wc: PRIVACY.replacement_shards(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/sensitivity.json",
    log:
        f"{LOGS}/privacy/{{size}}/sensitivity.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/sensitivity.tsv"
    wildcard_constraints:
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib", "replacements"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=PRIVACY.pruning_args(),
        neighbours=lambda wc: PRIVACY.of(wc.size, "sensitivity")["neighbours"],
        blocks=lambda wc: PRIVACY.of(wc.size, "sensitivity")["blocks"] or "all",
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy sensitivity --model {{params.model}} {{params.pruning}} --calib {{input.calib}} "
        "--base-mask {input.base} --replacements {input.replacements} --neighbours {params.neighbours} --blocks {params.blocks} "
        "--batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule privacy_membership:
    """LiRA membership inference on in-process shadow masks of the first decoder blocks."""
    input:
        model=MODEL_READY,
        population=lambda wc: PRIVACY.population(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/membership.json",
    log:
        f"{LOGS}/privacy/{{size}}/membership.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/membership.tsv"
    wildcard_constraints:
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["population"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=PRIVACY.pruning_args(),
        targets=lambda wc: PRIVACY.of(wc.size, "membership")["targets"],
        pairs=lambda wc: PRIVACY.of(wc.size, "membership")["pairs"],
        blocks=lambda wc: PRIVACY.of(wc.size, "membership")["blocks"] or "all",
        samples=lambda wc: PRIVACY.membership_samples(wc.size),
        epsilons=lambda wc: " ".join(eps_name(e) for e in PRIVACY.membership_epsilons(wc.size)),
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy membership --model {{params.model}} {{params.pruning}} --population {{input.population}} "
        "--targets {params.targets} --samples {params.samples} --pairs {params.pairs} --blocks {params.blocks} "
        "--epsilons {params.epsilons} --batch-size {params.batch_size} {params.placement} --threads {threads} "
        "--out {output} > {log} 2>&1"


rule privacy_inversion:
    """The server inverts block-0 q_proj masks of private texts; plus the tiny-model case."""
    input:
        model=MODEL_READY,
        texts=lambda wc: PRIVACY.inversion_texts(wc.size),
        prior=lambda wc: PRIVACY.prior_pool(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/inversion.json",
    log:
        f"{LOGS}/privacy/{{size}}/inversion.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/inversion.tsv"
    wildcard_constraints:
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["texts", "prior"]),
    params:
        model=model_folder,
        sparsity=lambda wc: PRIVACY.sparsity,
        group=lambda wc: PRIVACY.group,
        seed=config["seed"],
        per_length=lambda wc: PRIVACY.of(wc.size, "inversion")["texts"],
        steps=lambda wc: PRIVACY.of(wc.size, "inversion")["steps"],
        prior=lambda wc: (
            "--use-prior" if PRIVACY.of(wc.size, "inversion")["prior"] and PRIVACY.prior_pool(wc.size) else ""
        ),
        tiny=lambda wc: " ".join(str(t) for t in PRIVACY.of(wc.size, "inversion")["tiny"]),
    shell:
        f"{FEDLIB} privacy inversion --model {{params.model}} --texts {{input.texts}} --per-length {{params.per_length}} "
        "--sparsity {params.sparsity} --local-group {params.group} --seed {params.seed} --steps {params.steps} "
        "--prior-tokens {input.prior} {params.prior} --tiny-lengths {params.tiny} --threads {threads} "
        "--out {output} > {log} 2>&1"


rule privacy_rr_aggregate:
    """Defence: randomized response (per-bit ε) on every client's mask, FedPrLLM top-k on the noisy votes."""
    input:
        model=MODEL_READY,
        masks=PRIVACY.client_masks(),
        clean=lambda wc: PRIVACY.clean_global(wc.group),
    output:
        mask=f"{PRIV_BASE}/defence/rr{{eps}}_{{group}}.mask.safetensors",
        record=f"{PRIV_BASE}/defence/rr{{eps}}_{{group}}.record.json",
    log:
        f"{LOGS}/privacy/defence/rr{{eps}}_{{group}}.log",
    benchmark:
        f"{BENCH}/privacy/defence/rr{{eps}}_{{group}}.tsv"
    wildcard_constraints:
        eps=r"[0-9.]+",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("layers"),
    params:
        model=model_folder,
        sparsity=lambda wc: PRIVACY.sparsity,
        group=lambda wc: group_arg(wc.group),
        seed=config["seed"],
    shell:
        f"{FEDLIB} privacy rr-aggregate --model {{params.model}} --epsilon {{wildcards.eps}} --server-group {{params.group}} "
        "--sparsity {params.sparsity} --seed {params.seed} --clean-global {input.clean} --threads {threads} "
        "--out {output.mask} --record {output.record} {input.masks} > {log} 2>&1"


rule privacy_defence_eval:
    """Perplexity of the global model under randomized response, on Table 1's evaluation windows."""
    input:
        model=MODEL_READY,
        mask=f"{PRIV_BASE}/defence/rr{{eps}}_{{group}}.mask.safetensors",
        windows=lambda wc: PRIVACY.defence_windows(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/defence/rr{{eps}}_{{group}}.eval.json",
    log:
        f"{LOGS}/privacy/{{size}}/defence/rr{{eps}}_{{group}}.eval.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/defence/rr{{eps}}_{{group}}.eval.tsv"
    wildcard_constraints:
        eps=r"[0-9.]+",
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["windows"], batch_size=EVAL.get("batch_size", 1), logits=True),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        batch_size=EVAL.get("batch_size", 1),
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} evaluate --model {{params.model}} --mask {{input.mask}} --windows {{input.windows}} "
        "--label rr{wildcards.eps}_{wildcards.group} --batch-size {params.batch_size} {params.placement} --threads {threads} "
        "--out {output} > {log} 2>&1"


for _size in ("run", "full"):

    rule:
        name:
            f"privacy_report_{_size}"
        input:
            PRIVACY.report_inputs("privacy", _size),
        output:
            priv_outputs(_size, for_report=True),
        log:
            f"{LOGS}/report/privacy_{_size}.log",
        benchmark:
            f"{BENCH}/report/privacy_{_size}.tsv"
        localrule: True
        conda:
            "../../envs/fedlib.yaml"
        params:
            spec=json.dumps(PRIVACY.report_spec("privacy", _size)),
        shell:
            f"{FEDLIB} privacy report --spec {{params.spec:q}} > {{log}} 2>&1"


rule privacy:
    """The reduced privacy audit (also part of rule all)."""
    input:
        PRIVACY_RUN_REPORTS,


rule privacy_full:
    """The full privacy audit (sizes in privacy.full)."""
    input:
        priv_outputs("full"),


rule privacy_dp_client:
    """A client's mask in DP federation {fed} (sample-level Gaussian mechanism on Wanda's statistics,
    fedlib.dp.gaussian; none at ε = ∞)."""
    input:
        model=MODEL_READY,
        calib=lambda wc: PRIVACY.dp_shard(wc.size, wc.fed, int(wc.client)),
    output:
        f"{PRIV_BASE}/{{size}}/dp/{{fed}}/{{eps}}/client_{{client}}.mask.safetensors",
    log:
        f"{LOGS}/privacy/{{size}}/dp/{{fed}}/{{eps}}/client_{{client}}.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/dp/{{fed}}/{{eps}}/client_{{client}}.tsv"
    wildcard_constraints:
        fed=DP_FEDERATION,
        eps=r"[0-9.]+|inf",
        client=r"\d+",
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=PRIVACY.pruning_args(),
        dp=lambda wc: PRIVACY.dp_client_args(wc.size, wc.eps, int(wc.client)),
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} client-mask --model {{params.model}} --calib {{input.calib}} {{params.pruning}} "
        "--client-id {wildcards.client} {params.dp} --batch-size {params.batch_size} "
        "{params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule privacy_dp_aggregate:
    """FedPrLLM (layer comparison) over DP federation {fed}'s masks at one ε."""
    input:
        model=MODEL_READY,
        masks=lambda wc: [
            PRIVACY.dp_client_mask(wc.size, wc.fed, wc.eps, i) for i in range(PRIVACY.dp_clients(wc.size, wc.fed))
        ],
    output:
        mask=f"{PRIV_BASE}/{{size}}/dp/{{fed}}/{{eps}}/global.mask.safetensors",
        report=f"{PRIV_BASE}/{{size}}/dp/{{fed}}/{{eps}}/global.mask.clients.json",
    log:
        f"{LOGS}/privacy/{{size}}/dp/{{fed}}/{{eps}}/aggregate.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/dp/{{fed}}/{{eps}}/aggregate.tsv"
    wildcard_constraints:
        fed=DP_FEDERATION,
        eps=r"[0-9.]+|inf",
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    resources:
        mem_mb=job_mem_mb("layers"),
    params:
        model=model_folder,
        sparsity=lambda wc: PRIVACY.sparsity,
        seed=config["seed"],
    shell:
        f"{FEDLIB} aggregate --model {{params.model}} --strategy fedprllm --server-group layer --sparsity {{params.sparsity}} "
        "--seed {params.seed} --out {output.mask} --report {output.report} {input.masks} > {log} 2>&1"


rule privacy_dp_public:
    """ε = 0: the server prunes with Wanda on public text alone (as many windows as the largest
    DP federation's private data), the baseline a DP mechanism has to beat."""
    input:
        model=MODEL_READY,
        calib=lambda wc: PRIVACY.dp_public_text(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/dp/public/0/global.mask.safetensors",
    log:
        f"{LOGS}/privacy/{{size}}/dp/public.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/dp/public.tsv"
    wildcard_constraints:
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["calib"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=PRIVACY.pruning_args(),
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} client-mask --model {{params.model}} --calib {{input.calib}} {{params.pruning}} "
        "--client-id public --batch-size {params.batch_size} {params.placement} --threads {threads} "
        "--out {output} > {log} 2>&1"


rule privacy_dp_eval:
    """Perplexity of a DP federation's FedPrLLM global model (public/0: the public-text model)."""
    input:
        model=MODEL_READY,
        mask=f"{PRIV_BASE}/{{size}}/dp/{{fed}}/{{eps}}/global.mask.safetensors",
        windows=lambda wc: PRIVACY.defence_windows(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/dp/{{fed}}/{{eps}}/eval.json",
    log:
        f"{LOGS}/privacy/{{size}}/dp/{{fed}}/{{eps}}/eval.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/dp/{{fed}}/{{eps}}/eval.tsv"
    wildcard_constraints:
        eps=r"[0-9.]+|inf",
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["windows"], batch_size=EVAL.get("batch_size", 1), logits=True),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        batch_size=EVAL.get("batch_size", 1),
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} evaluate --model {{params.model}} --mask {{input.mask}} --windows {{input.windows}} "
        "--label dp-{wildcards.fed}-{wildcards.eps} --batch-size {params.batch_size} {params.placement} "
        "--threads {threads} --out {output} > {log} 2>&1"


rule privacy_dp_release_audit:
    """The white-box audit of one release of the DP client mechanism and of its two positive controls
    (a sensitivity understated, no noise), at each claimed ε, with each game's ceiling."""
    input:
        model=MODEL_READY,
        population=lambda wc: PRIVACY.release_audit_population(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/dp/release_audit.json",
    log:
        f"{LOGS}/privacy/{{size}}/dp/release_audit.log",
    benchmark:
        f"{BENCH}/privacy/{{size}}/dp/release_audit.tsv"
    wildcard_constraints:
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks+weights", tokens=["population"]),
    params:
        model=model_folder,
        audit=lambda wc: PRIVACY.release_audit_args(wc.size),
    shell:
        f"{FEDLIB} privacy release-audit --model {{params.model}} --population {{input.population}} "
        "{params.audit} --threads {threads} --out {output} > {log} 2>&1"


rule privacy_dp_membership:
    """LiRA membership attack on DP masks (each with its own noise) at one ε: the audited ε lower bound."""
    input:
        model=MODEL_READY,
        population=lambda wc: PRIVACY.population(wc.size),
    output:
        f"{PRIV_BASE}/{{size}}/dp/{{eps}}/membership.json",
    log:
        f"{LOGS}/privacy/{{size}}/dp/{{eps}}/membership.log",
    wildcard_constraints:
        eps=r"[0-9.]+|inf",
        size="run|full",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["population"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=PRIVACY.pruning_args(),
        targets=lambda wc: PRIVACY.of(wc.size, "membership")["targets"],
        pairs=lambda wc: PRIVACY.of(wc.size, "membership")["pairs"],
        blocks=lambda wc: PRIVACY.of(wc.size, "membership")["blocks"] or "all",
        samples=lambda wc: PRIVACY.membership_samples(wc.size),
        dp=lambda wc: PRIVACY.dp_args(wc.size, wc.eps),
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy membership --model {{params.model}} {{params.pruning}} --population {{input.population}} "
        "--targets {params.targets} --samples {params.samples} --pairs {params.pairs} --blocks {params.blocks} "
        "{params.dp} --batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule privacy_membership_scale_game:
    """One seed's membership game against the client's whole mask, client data of {samples} x {seqlen} tokens."""
    input:
        model=MODEL_READY,
        population=lambda wc: PRIVACY.scale_population(wc.seqlen),
    output:
        PRIVACY.scale_json("{samples}", "{seqlen}", "{seed}"),
    log:
        f"{LOGS}/privacy/membership_scale/{{samples}}x{{seqlen}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/privacy/membership_scale/{{samples}}x{{seqlen}}/seed{{seed}}.tsv"
    wildcard_constraints:
        samples="[0-9]+",
        seqlen="[0-9]+",
        seed="[0-9]+",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["population"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=lambda wc: PRIVACY.pruning_args(seed=wc.seed),
        targets=PRIVACY.scale()["targets"],
        pairs=PRIVACY.scale()["pairs"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy membership --model {{params.model}} {{params.pruning}} --population {{input.population}} "
        "--targets {params.targets} --samples {wildcards.samples} --pairs {params.pairs} --blocks all "
        "--batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule privacy_membership_shared_game:
    """One seed's shared-shadow membership game against the client's whole mask at size {size}."""
    input:
        model=MODEL_READY,
        population=lambda wc: PRIVACY.shared_population(
            PRIVACY.shared_sizes()[wc.size]["population"], PRIVACY.shared_sizes()[wc.size]["seqlen"]
        ),
    output:
        f"{PRIV_BASE}/membership_shared/{{size}}/seed{{seed}}.json",
    log:
        f"{LOGS}/privacy/membership_shared/{{size}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/privacy/membership_shared/{{size}}/seed{{seed}}.tsv"
    wildcard_constraints:
        size=r"\d+x\d+-of\d+-s\d+-c\d+",
        seed="[0-9]+",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["population"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=lambda wc: PRIVACY.pruning_args(seed=wc.seed),
        samples=lambda wc: PRIVACY.shared_sizes()[wc.size]["samples"],
        shadows=lambda wc: PRIVACY.shared_sizes()[wc.size]["shadows"],
        clients=lambda wc: PRIVACY.shared_sizes()[wc.size]["clients"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy membership-shared --model {{params.model}} {{params.pruning}} "
        "--population {input.population} --samples {params.samples} --shadows {params.shadows} "
        "--n-clients {params.clients} --batch-size {params.batch_size} {params.placement} --threads {threads} "
        "--out {output} > {log} 2>&1"


rule privacy_attribute_game:
    """One seed's attribute inference game for one property (a domain or a term) against the client's whole mask."""
    input:
        model=MODEL_READY,
        population=PRIVACY.attribute_population(),
        property=lambda wc: PRIVACY.attribute_properties()[wc.property]["inputs"],
    output:
        PRIVACY.attribute_json("{property}", "{seed}"),
    log:
        f"{LOGS}/privacy/attribute/{{property}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/privacy/attribute/{{property}}/seed{{seed}}.tsv"
    wildcard_constraints:
        property="(domain|term)-[A-Za-z0-9]+",
        seed="[0-9]+",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["population"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=lambda wc: PRIVACY.pruning_args(seed=wc.seed),
        property=lambda wc: PRIVACY.attribute_properties()[wc.property]["args"],
        trials=PRIVACY.attribute()["trials"],
        samples=PRIVACY.attribute()["samples"],
        pairs=PRIVACY.attribute()["pairs"],
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy attribute --model {{params.model}} {{params.pruning}} --population {{input.population}} "
        "{params.property} --trials {params.trials} --samples {params.samples} --pairs {params.pairs} --blocks all "
        "--batch-size {params.batch_size} {params.placement} --threads {threads} --out {output} > {log} 2>&1"


rule privacy_public_text:
    """Public text for privacy_dp's ε = 0 row: a draw of its own (seed + 1) from the calibration
    documents, never the evaluation documents."""
    input:
        model=MODEL_READY,
    output:
        f"{RESULTS}/privacy/public/{{dataset}}-public-{{windows}}-s{{seed}}.safetensors",
    log:
        f"{LOGS}/privacy/public_text-{{dataset}}-{{windows}}-s{{seed}}.log",
    benchmark:
        f"{BENCH}/privacy/public_text-{{dataset}}-{{windows}}-s{{seed}}.tsv"
    wildcard_constraints:
        windows=r"\d+",
        seed=r"\d+",
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        data_dir=data_dir_arg(),
        seqlen=config["calibration"]["seqlen"],
        docs=span_arg("--c4-docs", config["calibration"].get("c4_docs")),
    shell:
        f"{FEDLIB} calibration-pool --model {{params.model}} --data-dir {{params.data_dir}} "
        "--dataset {wildcards.dataset} --nsamples {wildcards.windows} --seqlen {params.seqlen} "
        "--seed {wildcards.seed} {params.docs} --out {output} > {log} 2>&1"


rule privacy_heldout_text:
    """Windows (evenly spaced, or all) of the calibration dataset's held-out evaluation text: public
    in-domain text (an inversion prior)."""
    input:
        model=MODEL_READY,
    output:
        PRIVACY.heldout_text("{windows}"),
    log:
        f"{LOGS}/privacy/heldout_text-{{windows}}.log",
    benchmark:
        f"{BENCH}/privacy/heldout_text-{{windows}}.tsv"
    wildcard_constraints:
        windows=r"all|\d+",
    localrule: True
    conda:
        "../../envs/fedlib.yaml"
    params:
        model=model_folder,
        data_dir=data_dir_arg(),
        dataset=Calib.parse(PRIVACY.calib).dataset,
        seqlen=EVAL["seqlen"],
        c4_docs=span_arg("--c4-docs", EVAL.get("c4_docs")),
        windows=lambda wc: "" if wc.windows == "all" else f"--windows {wc.windows}",
    shell:
        f"{FEDLIB} eval-windows --model {{params.model}} --data-dir {{params.data_dir}} "
        "--dataset {params.dataset} --seqlen {params.seqlen} {params.c4_docs} {params.windows} --out {output} > {log} 2>&1"


rule privacy_inversion_client_attack:
    """The server inverts one client's uploaded block-0 q/k/v masks to the bag of its whole calibration set."""
    input:
        model=MODEL_READY,
        mask=lambda wc: PRIVACY.client_masks()[int(wc.client)],
        shard=lambda wc: PRIVACY.shard(int(wc.client)),
        priors=[p["file"] for p in PRIVACY.inversion_client_priors().values()],
    output:
        PRIVACY.inversion_client_json("{client}"),
    log:
        f"{LOGS}/privacy/inversion_client/client_{{client}}.log",
    benchmark:
        f"{BENCH}/privacy/inversion_client/client_{{client}}.tsv"
    wildcard_constraints:
        client="[0-9]+",
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["priors"]),
    params:
        model=model_folder,
        priors=lambda wc: " ".join(f"{name}={p['file']}" for name, p in PRIVACY.inversion_client_priors().items()),
        steps=PRIVACY.inversion_client()["steps"],
        moves=PRIVACY.inversion_client()["refine_moves"],
        candidates=PRIVACY.inversion_client()["candidates"],
    shell:
        f"{FEDLIB} privacy inversion-client --model {{params.model}} --mask {{input.mask}} --shard {{input.shard}} "
        "--prior {params.priors} --steps {params.steps} --refine-moves {params.moves} "
        "--candidates {params.candidates} --threads {threads} --out {output} > {log} 2>&1"


rule privacy_secagg_game:
    """The membership game against what secure aggregation shows the server: the sum of m clients'
    masks, and its global mask, per cohort size m (the membership analysis's population and client size)."""
    input:
        model=MODEL_READY,
        population=PRIVACY.population("run"),
    output:
        PRIVACY.secagg_json(),
    log:
        f"{LOGS}/privacy/secagg.log",
    benchmark:
        f"{BENCH}/privacy/secagg.tsv"
    conda:
        "../../envs/fedlib.yaml"
    threads: 1
    resources:
        mem_mb=job_mem_mb("blocks", tokens=["population"]),
        gpu=MODEL_JOB_GPUS,
    params:
        model=model_folder,
        pruning=PRIVACY.pruning_args(),
        samples=PRIVACY.membership_samples("run"),
        sizes=PRIVACY.secagg_args(),
        batch_size=PRUNE_BATCH,
        placement=PLACEMENT_ARGS,
    shell:
        f"{FEDLIB} privacy secagg --model {{params.model}} {{params.pruning}} --population {{input.population}} "
        "--samples {params.samples} {params.sizes} --batch-size {params.batch_size} {params.placement} "
        "--threads {threads} --out {output} > {log} 2>&1"


# Every named target's report and the target itself (fedlib.privacy_analyses: the analyses with a target;
# their report specs: PRIVACY.report_spec, the bundled audit's rules are above)
for _analysis in PRIVACY_TARGETS:
    for _size in _analysis.sizes:
        _name = _analysis.name + ("" if len(_analysis.sizes) == 1 else f"_{_size}")

        rule:
            name:
                _analysis.report_rule(_size)
            input:
                PRIVACY.report_inputs(_analysis.target, _size),
            output:
                PRIVACY.report_outputs(_analysis.target, _size),
            log:
                f"{LOGS}/report/privacy_{_name}.log",
            benchmark:
                f"{BENCH}/report/privacy_{_name}.tsv"
            localrule: True
            conda:
                "../../envs/fedlib.yaml"
            params:
                # the command is a param, not part of an f-string: Snakemake evaluates a rule's shell
                # expression again when the job runs, when the loop variables hold their last values
                command=f"privacy {_analysis.report}",
                spec=json.dumps(PRIVACY.report_spec(_analysis.target, _size)),
            shell:
                f"{FEDLIB} {{params.command}} --spec {{params.spec:q}} > {{log}} 2>&1"

        rule:
            name:
                _analysis.target + ("" if _size == "run" else f"_{_size}")
            input:
                PRIVACY.report_outputs(_analysis.target, _size),
