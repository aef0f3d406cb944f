# Privacy audit of the shared masks (FedPrLLM Sec. 4.5 / App. C, made into real measurements):
# entropy, similarity, sensitivity, membership inference, inversion, and the randomized-response
# defence with its perplexity cost. Two size sets: "run" (config `privacy:`, reduced, part of
# `make run`) and "full" (`privacy.full:` overrides per analysis; target privacy_full).
# Sizes, paths and table specs live here; the rules in privacy.smk.
# Results: results/privacy/<setting>/...; tables: reports/privacy_<analysis>[_full].{md,csv}.

PRIVACY_DEFAULTS = {
    "similarity": {"seeds": [], "seed_samples": 32},
    "sensitivity": {"neighbours": 2, "blocks": None},
    "membership": {"targets": 32, "pairs": 4, "blocks": 1, "seqlen": 64, "samples": None,
                   "population": 256, "epsilons": [0.01, 0.1, 1]},
    "inversion": {"tokens": [16], "texts": 1, "steps": 300, "prior": False, "prior_samples": 32,
                  "tiny": [1, 2, 3]},
    "defence": {"epsilons": [1, 4], "group": "layer", "datasets": ["wikitext2"]},
}
PRIVACY_ANALYSES = ["entropy", "similarity", "sensitivity", "membership", "inversion", "defence"]


def _privacy_sizes():
    given = dict(config.get("privacy") or {})
    full_overrides = given.pop("full", None) or {}
    run = {k: {**v, **(given.get(k) or {})} for k, v in PRIVACY_DEFAULTS.items()}
    full = {k: {**v, **(full_overrides.get(k) or {})} for k, v in run.items()}
    return {"run": run, "full": full}


PRIVACY = _privacy_sizes()
for _size, _sizes in PRIVACY.items():
    _missing = set(_sizes["defence"]["datasets"]) - set(EVAL["datasets"])
    if _missing:
        raise ValueError(f"privacy ({_size}): defence datasets {sorted(_missing)} are not evaluation.datasets; "
                         "the no-noise row reuses Table 1's evaluation")
PRIV_CALIB, PRIV_SPLIT, PRIV_PRUNE = setting()
PRIV_BASE = f"{RESULTS}/privacy/{PRIV_CALIB}/{PRIV_SPLIT}/{PRIV_PRUNE}"


def _eps_name(eps):
    """A per-bit ε as it appears in file names (1 -> 1, 0.5 -> 0.5)."""
    return f"{float(eps):g}"


def priv(size, analysis):
    return PRIVACY[size][analysis]


def priv_setting():
    method, sparsity, group = parse_prune(PRIV_PRUNE)
    _, nsamples, seqlen = parse_calib(PRIV_CALIB)
    _, n = parse_split(PRIV_SPLIT)
    return method, sparsity, group_arg(group), nsamples, seqlen, n


def priv_client_masks():
    _, n = parse_split(PRIV_SPLIT)
    return [f"{RESULTS}/masks/{PRIV_CALIB}/{PRIV_SPLIT}/{PRIV_PRUNE}/client_{i}.mask.safetensors" for i in range(n)]


def priv_shard(i):
    return f"{RESULTS}/shards/{PRIV_CALIB}/{PRIV_SPLIT}/client_{i}.safetensors"


def priv_pruning_args():
    method, sparsity, group, *_ = priv_setting()
    return f"--method {method} --sparsity {sparsity} --group {group} --seed {config['seed']}"


def priv_membership_samples(size):
    m = priv(size, "membership")
    if m.get("samples"):
        return int(m["samples"])
    *_, nsamples, _, n = priv_setting()
    return max(1, nsamples // n)


def priv_membership_epsilons(size):
    eps = set(float(e) for e in priv(size, "membership").get("epsilons") or [])
    eps |= set(float(e) for e in priv(size, "defence").get("epsilons") or [])
    return sorted(eps)


def priv_population(size):
    m = priv(size, "membership")
    dataset = parse_calib(PRIV_CALIB)[0]
    return f"{RESULTS}/pools/{dataset}-{m['population']}x{m['seqlen']}.safetensors"


def priv_inversion_texts(size):
    inv = priv(size, "inversion")
    dataset = parse_calib(PRIV_CALIB)[0]
    return [f"{RESULTS}/pools/{dataset}-{inv['texts']}x{t}.safetensors" for t in inv["tokens"]]


def priv_prior_pool(size):
    """Public text for the attacker's unigram prior: WikiText-2 windows (not the clients' C4);
    none with prior_samples 0 (no unigram baseline then)."""
    inv = priv(size, "inversion")
    if not inv["prior_samples"]:
        return []
    return [f"{RESULTS}/pools/wikitext2-{inv['prior_samples']}x{parse_calib(PRIV_CALIB)[2]}.safetensors"]


def priv_similarity_tokens(wc):
    """(tokens, tokens per sample) of one seeded calibration draw of the similarity analysis
    (the draws run one at a time; none without seeds)."""
    sim = priv(wc.size, "similarity")
    seqlen = parse_calib(PRIV_CALIB)[2]
    return (sim["seed_samples"] * seqlen if sim["seeds"] else 0, seqlen)


def priv_replacement_shards(size):
    """Other clients' shards: the samples that replace one of client 0's."""
    _, n = parse_split(PRIV_SPLIT)
    *_, nsamples, _, _ = priv_setting()
    per_client = max(1, nsamples // n)
    needed = -(-priv(size, "sensitivity")["neighbours"] // per_client)
    if n < 2:
        raise ValueError("privacy sensitivity needs at least 2 clients (replacement samples come from client 1..)")
    return [priv_shard(i) for i in range(1, min(n, 1 + needed))]


def priv_json(size, analysis):
    if analysis == "entropy":
        return f"{PRIV_BASE}/entropy.json"
    return f"{PRIV_BASE}/{size}/{analysis}.json"


def priv_defence_spec(size):
    d = priv(size, "defence")
    group = d["group"]
    records = {_eps_name(e): f"{PRIV_BASE}/defence/rr{_eps_name(e)}_{group}.record.json" for e in d["epsilons"]}
    evals = {_eps_name(e): f"{PRIV_BASE}/{size}/defence/rr{_eps_name(e)}_{group}.eval.json" for e in d["epsilons"]}
    return {
        "records": records, "evals": evals, "datasets": d["datasets"], "group": group,
        "clean_eval": eval_json(PRIV_CALIB, PRIV_SPLIT, PRIV_PRUNE, f"fedprllm_oneshot_{group}_noscale"),
        "dense_eval": eval_json(PRIV_CALIB, PRIV_SPLIT, PRIV_PRUNE, "dense"),
    }


def priv_outputs(size, for_report=False):
    """The audit's tables and plots; ``for_report`` flags the HTML pages and plots for the HTML report."""
    suffix = "" if size == "run" else "_full"
    shown = [f"{REPORTS}/privacy_{analysis}{suffix}.html" for analysis in PRIVACY_ANALYSES]
    shown += [f"{REPORTS}/privacy_membership_roc{suffix}.png", f"{REPORTS}/privacy_defence{suffix}.png"]
    if for_report:
        caption = "../report/privacy.rst" if size == "run" else "../report/privacy_full.rst"
        shown = [report(path, caption=caption, category="Privacy") for path in shown]
    out = [f"{REPORTS}/privacy_{analysis}{suffix}.{ext}" for analysis in PRIVACY_ANALYSES for ext in ("md", "csv")]
    return out + [f"{REPORTS}/privacy_entropy_layers{suffix}.csv"] + shown


def priv_report_spec(size):
    d = priv_defence_spec(size)
    return {
        "context": report_context(PRIV_CALIB, PRIV_SPLIT, PRIV_PRUNE),
        "out_dir": REPORTS, "suffix": "" if size == "run" else "_full", "size": size,
        **{a: priv_json(size, a) for a in PRIVACY_ANALYSES if a != "defence"},
        "defence": d,
    }


def priv_report_inputs(size):
    spec = priv_report_spec(size)
    d = spec["defence"]
    files = [spec[a] for a in PRIVACY_ANALYSES if a != "defence"]
    files += list(d["records"].values()) + list(d["evals"].values()) + [d["clean_eval"], d["dense_eval"]]
    return files


#: the reduced audit's tables and plots (rule all)
PRIVACY_RUN_REPORTS = priv_outputs("run")


def _defence_windows(wc):
    return [f"{RESULTS}/eval_windows/{d}.safetensors" for d in priv(wc.size, "defence")["datasets"]]
