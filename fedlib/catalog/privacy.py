"""The privacy audit's sizes, files and report specs (FedPrLLM Sec. 4.5 / App. C as measurements).

The analyses, their default sizes and their tables are :data:`fedlib.privacy_analyses.ANALYSES`.
Two size sets: "run" (config `privacy:`, reduced, part of `make run`) and "full" (`privacy.full:`
overrides per analysis; target privacy_full). The audit runs on the default setting.
Results: {results}/privacy/<setting>/...; tables: {reports}/privacy_<analysis>[_full].{md,csv}.
"""

from __future__ import annotations

from fedlib.catalog.tables import Catalog
from fedlib.catalog.variants import Calib, Prune, Split, Variant, group_arg
from fedlib.privacy_analyses import ANALYSES, AUDIT, BUNDLED
from fedlib.report import DATASET_TITLES

#: each analysis's default sizes (the config overrides them key by key)
DEFAULTS = {analysis.name: dict(analysis.defaults) for analysis in ANALYSES if analysis.defaults}
SIZES = ("run", "full")


def eps_name(eps) -> str:
    """A per-bit ε as it appears in file names (1 -> 1, 0.5 -> 0.5)."""
    return f"{float(eps):g}"


def shared_size_name(size: dict) -> str:
    """A privacy_membership_shared size as a file-name part: 32x512-of64-s8-c12."""
    return f"{size['samples']}x{size['seqlen']}-of{size['population']}-s{size['shadows']}-c{size['clients']}"


def sizes(config) -> dict:
    """{"run": analysis -> sizes, "full": ...}: the defaults, config `privacy:` over them, and
    `privacy.full:` over that (per analysis)."""
    given = dict(config.get("privacy") or {})
    full_overrides = given.pop("full", None) or {}
    run = {k: {**v, **(given.get(k) or {})} for k, v in DEFAULTS.items()}
    full = {k: {**v, **(full_overrides.get(k) or {})} for k, v in run.items()}
    return {"run": run, "full": full}


class PrivacyCatalog:
    """Sizes, inputs, CLI arguments and report spec of the audit of ``catalog``'s default setting."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        config = catalog.config
        self.sizes = sizes(config)
        for size, by_analysis in self.sizes.items():
            missing = set(by_analysis["defence"]["datasets"]) - set(config["evaluation"]["datasets"])
            if missing:
                raise ValueError(f"privacy ({size}): defence datasets {sorted(missing)} are not evaluation.datasets; "
                                 "the no-noise row reuses Table 1's evaluation")
        self.calib, self.split, self.prune = catalog.setting()
        results = catalog.results
        self.results = results
        self.base = f"{results}/privacy/{self.calib}/{self.split}/{self.prune}"
        self._calib, self._split, self._prune = Calib.parse(self.calib), Split.parse(self.split), Prune.parse(self.prune)

    def of(self, size: str, analysis: str) -> dict:
        return self.sizes[size][analysis]

    @property
    def sparsity(self) -> float:
        return self._prune.sparsity

    @property
    def group(self) -> str:
        """The clients' comparison group, CLI spelling."""
        return group_arg(self._prune.group)

    def client_masks(self) -> list[str]:
        return self.catalog.client_masks(self.calib, self.split, self.prune)

    def clean_global(self, group: str) -> str:
        """The noise-free global mask the defence compares with: Table 1's one-shot FedPrLLM file
        with server group ``group`` (path spelling)."""
        label = Variant.fedprllm("oneshot", group, False).label
        return self.catalog.variant_source(self.calib, self.split, self.prune, label)[0]

    def shard(self, i: int) -> str:
        return f"{self.results}/shards/{self.calib}/{self.split}/client_{i}.safetensors"

    def pruning_args(self, seed: int | None = None) -> str:
        """How the audit's own pruning jobs (similarity draws, sensitivity, membership shadows) prune;
        ``seed`` (default: the config's) is the tie-break seed, and a membership game's."""
        p = self._prune
        seed = self.catalog.config["seed"] if seed is None else int(seed)
        args = f"--method {p.method} --sparsity {p.sparsity} --local-group {self.group} --seed {seed}"
        options = self.catalog.method_options_arg(p.method)
        return f"{args} {options}" if options else args

    def similarity_seeds_args(self, size: str, data_dir: str, docs: str) -> str:
        """Arguments of the seeded whole-model calibration draws; none without seeds."""
        sim = self.of(size, "similarity")
        if not sim["seeds"]:
            return ""
        return "--seeds {} --seed-samples {} --seqlen {} --dataset {} --data-dir {} {}".format(
            " ".join(str(s) for s in sim["seeds"]), sim["seed_samples"], self._calib.seqlen, self._calib.dataset,
            data_dir, docs)

    def similarity_tokens(self, size: str) -> tuple[int, int]:
        """(tokens, tokens per sample) of one seeded calibration draw of the similarity analysis
        (the draws run one at a time; none without seeds)."""
        sim = self.of(size, "similarity")
        seqlen = self._calib.seqlen
        return (sim["seed_samples"] * seqlen if sim["seeds"] else 0, seqlen)

    def membership_samples(self, size: str) -> int:
        m = self.of(size, "membership")
        if m.get("samples"):
            return int(m["samples"])
        return max(1, self._calib.nsamples // self._split.clients)

    def membership_epsilons(self, size: str) -> list[float]:
        eps = {float(e) for e in self.of(size, "membership").get("epsilons") or []}
        eps |= {float(e) for e in self.of(size, "defence").get("epsilons") or []}
        return sorted(eps)

    def pool(self, dataset: str, nsamples: int, seqlen: int) -> str:
        """The token file of ``nsamples`` windows of ``seqlen`` tokens of ``dataset`` (rule calibration_pool)."""
        return f"{self.results}/pools/{Calib(dataset, nsamples, seqlen)}.safetensors"

    def population(self, size: str) -> str:
        m = self.of(size, "membership")
        return self.pool(self._calib.dataset, m["population"], m["seqlen"])

    def inversion_texts(self, size: str) -> list[str]:
        inv = self.of(size, "inversion")
        return [self.pool(self._calib.dataset, inv["texts"], t) for t in inv["tokens"]]

    def prior_pool(self, size: str) -> list[str]:
        """Public text for the attacker's unigram prior: WikiText-2 windows (not the clients' C4);
        none with prior_samples 0 (no unigram baseline then)."""
        inv = self.of(size, "inversion")
        if not inv["prior_samples"]:
            return []
        return [self.pool("wikitext2", inv["prior_samples"], self._calib.seqlen)]

    def replacement_shards(self, size: str) -> list[str]:
        """Other clients' shards: the samples that replace one of client 0's."""
        n = self._split.clients
        per_client = max(1, self._calib.nsamples // n)
        needed = -(-self.of(size, "sensitivity")["neighbours"] // per_client)
        if n < 2:
            raise ValueError("privacy sensitivity needs at least 2 clients (replacement samples come from client 1..)")
        return [self.shard(i) for i in range(1, min(n, 1 + needed))]

    def defence_windows(self, size: str) -> list[str]:
        return [f"{self.results}/eval_windows/{d}.safetensors" for d in self.of(size, "defence")["datasets"]]

    def json(self, size: str, analysis: str) -> str:
        if analysis == "entropy":
            return f"{self.base}/entropy.json"
        return f"{self.base}/{size}/{analysis}.json"

    def defence_spec(self, size: str) -> dict:
        d = self.of(size, "defence")
        group = d["group"]
        records = {eps_name(e): f"{self.base}/defence/rr{eps_name(e)}_{group}.record.json" for e in d["epsilons"]}
        evals = {eps_name(e): f"{self.base}/{size}/defence/rr{eps_name(e)}_{group}.eval.json" for e in d["epsilons"]}
        clean = Variant.fedprllm("oneshot", group, False).label
        return {
            "records": records, "evals": evals, "datasets": d["datasets"], "group": group,
            "clean_eval": self.catalog.eval_json(self.calib, self.split, self.prune, clean),
            "dense_eval": self.catalog.eval_json(self.calib, self.split, self.prune, "dense"),
        }

    # -- DP client masks (target privacy_dp) ------------------------------------------------------
    # A federation is "setting" (the setting's first clients: the audited one) or the calib
    # component of a pool split IID among dp.clients clients (the utility curve's larger
    # clients); "public" is the server calibrating on public text alone (ε = 0).

    def dp_clients(self, size: str, fed: str = "setting") -> int:
        """How many clients federation ``fed`` has (the setting's: its first ones)."""
        clients = self.of(size, "dp")["clients"]
        return min(clients, self._split.clients) if fed == "setting" else clients

    def dp_federations(self, size: str) -> dict[str, int]:
        """Federation -> samples per client: the setting's, then one per ``dp.samples``."""
        d = self.of(size, "dp")
        feds = {"setting": max(1, self._calib.nsamples // self._split.clients)}
        for n in d["samples"]:
            feds[str(Calib(self._calib.dataset, d["clients"] * int(n), self._calib.seqlen))] = int(n)
        return feds

    def dp_shard(self, size: str, fed: str, client: int) -> str:
        if fed == "setting":
            return self.shard(client)
        return f"{self.results}/shards/{fed}/{Split('iid', self.dp_clients(size, fed))}/client_{client}.safetensors"

    def dp_client_mask(self, size: str, fed: str, eps, client: int) -> str:
        """A client's DP mask file; the setting's at ε = ∞ is its plain mask (already computed)."""
        if fed == "setting" and float(eps) == float("inf"):
            return self.client_masks()[client]
        return f"{self.base}/{size}/dp/{fed}/{eps_name(eps)}/client_{client}.mask.safetensors"

    def dp_client_args(self, size: str, eps, client: int) -> str:
        """client-mask's DP arguments (none at ε = ∞) with the audit's reproducible stand-in for
        the client's secret noise (a real client draws it from the OS: ``fedlib client-mask``
        without --dp-noise-seed) and its game's unit, one window: a simulation, not private."""
        if float(eps) == float("inf"):
            return ""
        return (f"{self.dp_args(size, eps)} --dp-noise-seed {1_000_003 * int(self.catalog.config['seed']) + client} "
                f"--dp-allow-seeded-noise --dp-unit window")

    def dp_args(self, size: str, eps) -> str:
        d = self.of(size, "dp")
        return f"--dp-epsilon {eps_name(eps)} --dp-delta {d['delta']!r} --dp-clip {float(d['clip'])!r}"

    def dp_settings(self, size: str) -> list[str]:
        """The DP table's ε, as in file names: the configured ones and ∞ (no DP)."""
        return [eps_name(e) for e in self.of(size, "dp")["epsilons"]] + ["inf"]

    def dp_public_windows(self, size: str) -> int:
        """Public text the ε = 0 row calibrates on: as many windows as the largest federation's
        private data."""
        return max(self.dp_clients(size, fed) * n for fed, n in self.dp_federations(size).items())

    def dp_public_text(self, size: str) -> str:
        """The ε = 0 row's public text: its own draw (seed + 1) of windows from the calibration
        documents, which are disjoint from the evaluation documents (the config check)."""
        seed = int(self.catalog.config["seed"]) + 1
        return f"{self.results}/privacy/public/{self._calib.dataset}-public-{self.dp_public_windows(size)}-s{seed}.safetensors"

    def dp_public_mask(self, size: str) -> str:
        return f"{self.base}/{size}/dp/public/0/global.mask.safetensors"

    def dp_eval(self, size: str, fed: str, eps) -> str:
        return f"{self.base}/{size}/dp/{fed}/{eps}/eval.json"

    def release_audit(self, size: str) -> dict:
        """The release audit's settings (``privacy.dp.release_audit`` over its defaults) and the ε
        it audits: the DP table's and its own smaller ones, where a game of this size has power."""
        d = self.of(size, "dp")
        audit = {**DEFAULTS["dp"]["release_audit"], **(d.get("release_audit") or {})}
        return {**audit, "epsilons": sorted({float(e) for e in [*d["epsilons"], *audit["epsilons"]]})}

    def release_audit_population(self, size: str) -> str:
        """The rows the auditor picks its pair from: windows of the calibration length."""
        return self.pool(self._calib.dataset, int(self.release_audit(size)["population"]), self._calib.seqlen)

    def release_audit_args(self, size: str) -> str:
        d, audit = self.of(size, "dp"), self.release_audit(size)
        return (f"--epsilons {' '.join(eps_name(e) for e in audit['epsilons'])} --delta {d['delta']!r} "
                f"--clip {float(d['clip'])!r} --trials {int(audit['trials'])} --factor {float(audit['factor'])!r} "
                f"--seed {int(self.catalog.config['seed'])}")

    def dp_spec(self, size: str) -> dict:
        d, suffix = self.of(size, "dp"), "" if size == "run" else "_full"
        defence = self.defence_spec(size)
        return {
            "context": self.catalog.report_context(self.calib, self.split, self.prune),
            "out_dir": self.catalog.reports, "suffix": suffix, "datasets": self.of(size, "defence")["datasets"],
            "clients": self.dp_clients(size), "samples_per_client": self.dp_federations(size)["setting"],
            "seqlen": self._calib.seqlen, "delta": d["delta"], "clip": float(d["clip"]),
            "settings": {eps: {"client_mask": self.dp_client_mask(size, "setting", eps, 0),
                               "eval": self.dp_eval(size, "setting", eps),
                               "membership": f"{self.base}/{size}/dp/{eps}/membership.json"}
                         for eps in self.dp_settings(size)},
            "release_audit": f"{self.base}/{size}/dp/release_audit.json",
            "utility": {
                "federations": [{"clients": self.dp_clients(size, fed), "samples": n,
                                 "data": "the setting's shards" if fed == "setting" else f"pool {fed}",
                                 "settings": {eps: {"client_mask": self.dp_client_mask(size, fed, eps, 0),
                                                    "eval": self.dp_eval(size, fed, eps)}
                                              for eps in self.dp_settings(size)}}
                                for fed, n in self.dp_federations(size).items()],
                "public": {"mask": self.dp_public_mask(size), "eval": self.dp_eval(size, "public", 0),
                           "text": self.dp_public_text(size)},
                "randomized_response": {"records": defence["records"], "evals": defence["evals"],
                                        "clients": self._split.clients},
                "dense_eval": defence["dense_eval"],
            },
        }

    # -- membership at realistic sizes (target privacy_membership_scale) ------------------------

    def scale(self) -> dict:
        return self.of("run", "membership_scale")

    def scale_population(self, seqlen: int) -> str:
        return self.pool(self._calib.dataset, self.scale()["population"], int(seqlen))

    def scale_json(self, samples: int, seqlen: int, seed: int) -> str:
        return f"{self.base}/membership_scale/{samples}x{seqlen}/seed{seed}.json"

    def membership_scale_spec(self) -> dict:
        sc = self.scale()
        return {
            "context": self.catalog.report_context(self.calib, self.split, self.prune),
            "out_dir": self.catalog.reports, "dataset": self._calib.dataset,
            "sizes": [{"samples": int(n), "seqlen": int(t),
                       "results": [self.scale_json(n, t, seed) for seed in sc["seeds"]]} for n, t in sc["sizes"]],
        }

    # -- membership with shared shadows (target privacy_membership_shared) -------------------------

    def shared(self) -> dict:
        return self.of("run", "membership_shared")

    def shared_population(self, population: int, seqlen: int) -> str:
        return self.pool(self._calib.dataset, int(population), int(seqlen))

    def shared_json(self, size: dict, seed) -> str:
        return f"{self.base}/membership_shared/{shared_size_name(size)}/seed{seed}.json"

    def shared_sizes(self) -> dict[str, dict]:
        """Size name (a file-name part) -> the size's settings."""
        return {shared_size_name(size): size for size in self.shared()["sizes"]}

    def membership_shared_spec(self) -> dict:
        sh = self.shared()
        return {
            "context": self.catalog.report_context(self.calib, self.split, self.prune),
            "out_dir": self.catalog.reports, "dataset": self._calib.dataset,
            "sizes": [{**size, "results": [self.shared_json(size, seed) for seed in sh["seeds"]]}
                      for size in sh["sizes"]],
        }

    # -- attribute inference (target privacy_attribute) --------------------------------------------

    def attribute(self) -> dict:
        return self.of("run", "attribute")

    def attribute_properties(self) -> dict[str, dict]:
        """Property name (a file-name part) -> the game's property arguments and the table's label."""
        at = self.attribute()
        props = {}
        if at["domain"]:
            pool = self.pool(at["domain"], at["domain_population"], at["seqlen"])
            props[f"domain-{at['domain']}"] = {"args": f"--domain-pool {pool}", "inputs": [pool],
                                               "label": f"domain: {DATASET_TITLES.get(at['domain'], at['domain'])}"}
        for term in at["terms"]:
            props[f"term-{term}"] = {"args": f"--term {term}", "inputs": [], "label": f"term: '{term}'"}
        return props

    def attribute_population(self) -> str:
        at = self.attribute()
        return self.pool(self._calib.dataset, at["population"], at["seqlen"])

    def attribute_json(self, prop: str, seed) -> str:
        at = self.attribute()
        return f"{self.base}/attribute/{at['samples']}x{at['seqlen']}/{prop}/seed{seed}.json"

    def attribute_spec(self) -> dict:
        return {
            "context": self.catalog.report_context(self.calib, self.split, self.prune),
            "out_dir": self.catalog.reports, "dataset": self._calib.dataset,
            "properties": [{"label": p["label"], "results": [self.attribute_json(name, seed)
                                                             for seed in self.attribute()["seeds"]]}
                           for name, p in self.attribute_properties().items()],
        }

    # -- inversion of clients' whole calibration sets (target privacy_inversion_client) -------------

    def inversion_client(self) -> dict:
        return self.of("run", "inversion_client")

    def inversion_clients(self) -> list[int]:
        """The clients whose uploads the server inverts (default: every client of the setting)."""
        clients = self.inversion_client()["clients"]
        return list(range(self._split.clients)) if clients is None else [int(c) for c in clients]

    def heldout_text(self, windows: int | None = None) -> str:
        """Evaluation windows of the calibration dataset's held-out text (evenly spaced; all when
        ``windows`` is None): public in-domain text."""
        return f"{self.results}/privacy/public/{self._calib.dataset}-heldout-{windows or 'all'}.safetensors"

    def inversion_client_priors(self) -> dict[str, dict]:
        """Prior name -> {"file", "label"}: the public texts of the unigram guesses (the first is the
        attack's start)."""
        dataset = DATASET_TITLES.get(self._calib.dataset, self._calib.dataset)
        wikitext = self.pool("wikitext2", self.inversion_client()["prior_samples"], self._calib.seqlen)
        return {"heldout": {"file": self.heldout_text(), "label": f"{dataset} held-out text"},
                "wikitext2": {"file": wikitext, "label": "WikiText-2"}}

    def inversion_client_json(self, client) -> str:
        return f"{self.base}/inversion_client/client_{client}.json"

    def inversion_client_spec(self) -> dict:
        return {
            "context": self.catalog.report_context(self.calib, self.split, self.prune),
            "out_dir": self.catalog.reports,
            "priors": {name: p["label"] for name, p in self.inversion_client_priors().items()},
            "results": [self.inversion_client_json(c) for c in self.inversion_clients()],
        }

    # -- membership against the aggregate (target privacy_secagg) ---------------------------------

    def secagg(self) -> dict:
        return self.of("run", "secagg")

    def secagg_args(self) -> str:
        """``fedlib privacy secagg``'s sizes (its population and client size are the membership analysis's)."""
        sa = self.secagg()
        return (f"--targets {sa['targets']} --pairs {sa['pairs']} --pool {sa['pool']} --draws {sa['draws']} "
                f"--blocks {sa['blocks']} --cohorts {' '.join(str(m) for m in sa['cohorts'])} "
                f"--server-group {sa['server_group']}")

    def secagg_json(self) -> str:
        return f"{self.base}/secagg.json"

    def secagg_spec(self) -> dict:
        return {"context": self.catalog.report_context(self.calib, self.split, self.prune),
                "out_dir": self.catalog.reports, "secagg": self.secagg_json()}

    def audit_spec(self, size: str) -> dict:
        """The bundled audit's report spec (every analysis without a target of its own)."""
        return {
            "context": self.catalog.report_context(self.calib, self.split, self.prune),
            "out_dir": self.catalog.reports, "suffix": "" if size == "run" else "_full", "size": size,
            **{a.name: self.json(size, a.name) for a in BUNDLED if a.name != "defence"},
            "defence": self.defence_spec(size),
        }

    # -- every report, from the registry ---------------------------------------------------------

    def report_spec(self, target: str, size: str = "run") -> dict:
        """The spec the report of ``target`` (``privacy``: the bundled audit) writes its tables from:
        :meth:`audit_spec`, or ``<name>_spec`` of the target's analysis."""
        if target == AUDIT:
            return self.audit_spec(size)
        [analysis] = [a for a in ANALYSES if a.target == target]
        build = getattr(self, f"{analysis.name}_spec")
        return build(size) if len(analysis.sizes) > 1 else build()

    def report_inputs(self, target: str, size: str = "run") -> list[str]:
        """The result files the report of ``target`` reads: every file of its spec under results/."""
        found: set[str] = set()

        def walk(value) -> None:
            if isinstance(value, dict):
                for item in value.values():
                    walk(item)
            elif isinstance(value, list):
                for item in value:
                    walk(item)
            elif isinstance(value, str) and value.startswith(f"{self.results}/"):
                found.add(value)

        walk(self.report_spec(target, size))
        return sorted(found)

    def report_outputs(self, target: str, size: str = "run") -> list[str]:
        """The files the report of ``target`` writes (the bundled audit's: every bundled analysis's)."""
        return [f for a in ANALYSES if a.target == target for f in a.files(self.catalog.reports, size)]
