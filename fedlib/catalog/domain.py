"""The domain-shift study's sizes, files and report spec (target ``domain``; issue 29): when does
a federation's private in-domain text beat public text, and what does DP keep of that?

The clients hold in-domain text the public text lacks (``domain.private``: PTB train), the server
public text (``domain.public``: C4 documents ``public_docs``). Every row is evaluated on the whole
in-domain test split and on a few windows of two guards. A negative control gives the clients
C4 text (documents ``control_docs``) instead. Results under {results}/domain/, the table in
{reports}/domain.{md,csv,png}.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fedlib.catalog.privacy import eps_name
from fedlib.catalog.tables import Catalog

DEFAULTS = {
    "private": "ptb", "public": "c4", "public_docs": [0, 400], "control_docs": [400, 800],
    "clients": 4, "samples": 8, "public_samples": 32,
    "sparsities": [0.5, 0.6, 0.7], "detail_sparsities": [0.7], "seeds": [0, 1, 2],
    "epsilons": [1, 4, 8, 64], "delta": 1e-5, "clip": 2.0, "basis": 16,
    "mechanisms": ["normalised", "lowdim", "distributed"],
    "control": {"sparsities": [0.7], "seeds": [0]},
    "evaluation": {"dtype": "bfloat16", "windows": None, "guards": ["c4", "wikitext2"], "guard_windows": 8},
    "membership": {"targets": 32, "pairs": 4, "blocks": 1, "seqlen": 64, "population": 128},
    "headroom": None,
    # how the clients' windows are cut: disjoint, by unit (PTB: spans; C4, WikiText-2: documents), at most
    # windows_per_unit per unit (fedlib.dp.unit); random = Wanda's random offsets (refused with DP rows)
    "sampling": "disjoint", "windows_per_unit": 1,
    # replicates of every DP release per data seed (the interval covers them): draw 0 is seeded by the data
    # seed, as before draws existed, each further draw by a seed derived from the data seed and the draw
    "noise_draws": 1,
}
#: the unit a dataset's text is cut by for DP (fedlib.dp.unit)
DATASET_UNITS = {"ptb": "span", "wikitext2": "document", "c4": "document"}
@dataclass(frozen=True)
class StudyMechanism:
    """A DP row family of the study: the x_dp mechanism, whether it releases in the public basis,
    its estimator (:mod:`fedlib.dp.public`), its title and the non-private row whose gain
    it is measured against (FedPrLLM for per-client masks, Centralized for the secure sum)."""

    mechanism: str
    in_basis: bool
    estimator: str
    title: str
    #: "client": each client's contribution clipped once (None: the windows' unit)
    unit: str | None = None

    @property
    def reference(self) -> str:
        return "central" if self.mechanism == "distributed" else "fedprllm"


#: the study's DP mechanisms. The distributed sum is released per channel: with its low noise a
#: large correction passes, and a large correction in the public token basis smears a domain's
#: deviation over the channels the basis mixes (in a trial at 70 % it made the mask worse than
#: public text at ε = 8 and 64).
MECHANISMS = {
    "normalised": StudyMechanism("normalised", False, "threshold", "DP normalised (per client, every channel)"),
    "lowdim": StudyMechanism("normalised", True, "threshold", "DP normalised, public basis (per client)"),
    "distributed": StudyMechanism("distributed", False, "threshold", "DP distributed (SecAgg sum, every channel)"),
    "normalised_posterior": StudyMechanism("normalised", False, "posterior",
                                           "DP normalised, posterior estimate (per client)"),
    "distributed_posterior": StudyMechanism("distributed", False, "posterior",
                                            "DP distributed, posterior estimate (SecAgg sum)"),
    "distributed_client": StudyMechanism("distributed", False, "posterior",
                                         "DP distributed, client-level (each site's whole contribution)", "client"),
}
KINDS = ("private", "control")


def settings(config) -> dict:
    given = dict(config.get("domain") or {})
    merged = {**DEFAULTS, **given}
    for key in ("control", "evaluation", "membership"):
        merged[key] = {**DEFAULTS[key], **(given.get(key) or {})}
    return merged


class DomainCatalog:
    """Files, CLI arguments and the report spec of the study (module docstring)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.config = catalog.config
        self.d = settings(self.config)
        self.base = f"{catalog.results}/domain"
        self.seqlen = int(self.config["calibration"]["seqlen"])

    # -- data ------------------------------------------------------------------------------------

    def pool(self, role: str, seed) -> str:
        """A token file of role ``private`` (the clients' in-domain pool), ``control`` (their C4
        pool), ``public`` (the server's text) or ``population`` (the membership game's)."""
        return f"{self.base}/pools/{role}-s{seed}.safetensors"

    def pool_args(self, role: str, seed) -> str:
        d = self.d
        if role == "population":
            m = d["membership"]
            return f"--dataset {d['private']} --nsamples {m['population']} --seqlen {m['seqlen']} --seed {seed}"
        if role == "public_membership":
            m = d["membership"]
            return (f"--dataset {d['public']} --nsamples {d['public_samples']} --seqlen {m['seqlen']} --seed {seed} "
                    f"--c4-docs {d['public_docs'][0]} {d['public_docs'][1]}")
        dataset = {"private": d["private"], "control": "c4", "public": d["public"]}[role]
        n = d["public_samples"] if role == "public" else d["clients"] * d["samples"]
        docs = {"control": d["control_docs"], "public": d["public_docs"]}.get(role)
        docs_arg = f" --c4-docs {docs[0]} {docs[1]}" if docs and dataset == "c4" else ""
        # the clients' private text is cut by unit for the DP rows; the public text needs no protection
        unit_arg = (f" --unit {DATASET_UNITS[dataset]} --windows-per-unit {d['windows_per_unit']}"
                    if role != "public" and d["sampling"] == "disjoint" else "")
        return f"--dataset {dataset} --nsamples {n} --seqlen {self.seqlen} --seed {seed}{docs_arg}{unit_arg}"

    def shard(self, kind: str, seed, client: int) -> str:
        return f"{self.base}/{kind}/s{seed}/shards/client_{client}.safetensors"

    def mask_calib(self, kind: str, seed, which: str) -> list[str]:
        """The calibration files of a plain Wanda mask of the study: Centralized (the pool), the
        public + private mix (the pool and the public text) or ``client_<i>`` (its shard)."""
        if which == "central":
            return [self.pool(kind, seed)]
        if which == "mix":
            return [self.pool(kind, seed), self.pool("public", seed)]
        return [self.shard(kind, seed, int(which.removeprefix("client_")))]

    def eval_windows(self, dataset: str) -> str:
        return f"{self.base}/eval_windows/{dataset}.safetensors"

    def eval_window_args(self, dataset: str) -> str:
        """The in-domain test split (whole by default); a guard's evenly spaced windows (C4: the
        evaluation documents)."""
        ev = self.d["evaluation"]
        if dataset == self.d["private"]:
            return f"--windows {ev['windows']}" if ev["windows"] else ""
        args = f"--windows {ev['guard_windows']}"
        c4 = self.config["evaluation"].get("c4_docs")
        return f"{args} --c4-docs {c4[0]} {c4[1]}" if dataset == "c4" and c4 else args

    def eval_datasets(self) -> list[str]:
        return [self.d["private"], *self.d["evaluation"]["guards"]]

    # -- masks -----------------------------------------------------------------------------------

    def setting(self, kind: str, sparsity, seed) -> str:
        return f"{self.base}/{kind}/s{seed}/sp{sparsity:g}"

    def public_mask(self, sparsity, seed) -> str:
        return f"{self.base}/public/s{seed}/sp{float(sparsity):g}/public.mask.safetensors"

    def mask(self, kind: str, sparsity, seed, which: str) -> str:
        """``central``, ``mix``, ``client_<i>`` or ``fedprllm`` of a setting."""
        return f"{self.setting(kind, float(sparsity), seed)}/{which}.mask.safetensors"

    def labels(self) -> list[str]:
        return [f"{m}-{eps_name(e)}" for m in self.d["mechanisms"] for e in self.d["epsilons"]]

    def releases(self) -> list[dict]:
        """The dp-federation's releases: one per mechanism and ε."""
        d, out = self.d, []
        for m in d["mechanisms"]:
            study = MECHANISMS[m]
            for e in d["epsilons"]:
                out.append({"label": f"{m}-{eps_name(e)}", "mechanism": study.mechanism, "epsilon": float(e),
                            "delta": float(d["delta"]), "clip": float(d["clip"]),
                            "basis": int(d["basis"]) if study.in_basis else 0, "estimator": study.estimator,
                            **({"unit": study.unit} if study.unit else {})})
        return out

    def draws(self) -> range:
        """The noise draws of every DP release (``domain.noise_draws``)."""
        return range(int(self.d["noise_draws"]))

    @staticmethod
    def dp_name(draw) -> str:
        """The folder of a noise draw's releases in a setting: ``dp`` (draw 0), ``dp-n<draw>``."""
        return "dp" if int(draw) == 0 else f"dp-n{int(draw)}"

    @staticmethod
    def draw_of(dp_name: str) -> int:
        """The noise draw of a :meth:`dp_name` folder."""
        return int(dp_name.removeprefix("dp").removeprefix("-n") or 0)

    @staticmethod
    def noise_seed(seed, draw) -> int:
        """The simulation's noise seed of a data seed's noise draw: the data seed itself for draw 0
        (the study's files before draws existed), else 63 bits of a hash of both, so that no two
        (data seed, draw) pairs share noise."""
        if int(draw) == 0:
            return int(seed)
        digest = hashlib.sha256(f"fedlib domain noise draw {int(seed)} {int(draw)}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1

    def dp_dir(self, kind: str, sparsity, seed, draw=0) -> str:
        return f"{self.setting(kind, float(sparsity), seed)}/{self.dp_name(draw)}"

    def dp_file_patterns(self) -> list[str]:
        """Every mask a setting's dp-federation writes, with the rule's wildcards {kind}, {dseed},
        {dsp}, {dpdir} (:meth:`dp_name`): the names of
        :func:`fedlib.privacy.stages.dp_federation.mask_paths` (a test checks that they agree),
        spelled here because the Snakefile reads them and must not import torch."""
        folder = f"{self.base}/{{kind}}/s{{dseed}}/sp{{dsp}}/{{dpdir}}"
        out = []
        for spec in self.releases():
            if spec["mechanism"] == "distributed":
                out.append(f"{folder}/{spec['label']}/secagg.mask.safetensors")
            else:
                out += [f"{folder}/{spec['label']}/client_{c}.mask.safetensors" for c in range(self.d["clients"])]
        return out

    def dp_client_masks(self, kind: str, sparsity, seed, label: str, draw=0) -> list[str]:
        return [f"{self.dp_dir(kind, sparsity, seed, draw)}/{label}/client_{c}.mask.safetensors"
                for c in range(self.d["clients"])]

    def dp_mask(self, kind: str, sparsity, seed, label: str, draw=0) -> str:
        """The mask a DP row evaluates: FedPrLLM over the clients' DP masks, or the secure sum's."""
        leaf = "secagg" if MECHANISMS[label.rsplit("-", 1)[0]].mechanism == "distributed" else "fedprllm"
        return f"{self.dp_dir(kind, sparsity, seed, draw)}/{label}/{leaf}.mask.safetensors"

    def membership_json(self, label: str) -> str:
        return f"{self.base}/membership/{label}.json"

    def membership_args(self, label: str) -> str:
        name, eps = label.rsplit("-", 1)
        study = MECHANISMS[name]
        d, m = self.d, self.d["membership"]
        distributed = study.mechanism == "distributed"
        clients = d["clients"] if distributed else 1
        args = (f"--targets {m['targets']} --pairs {m['pairs']} --blocks {m['blocks']} "
                f"--samples {d['samples'] * clients} --dp-mechanism {study.mechanism} --dp-epsilon {eps} "
                f"--dp-delta {float(d['delta'])!r} --dp-clip {float(d['clip'])!r} "
                f"--dp-basis {int(d['basis']) if study.in_basis else 0} --dp-estimator {study.estimator}")
        return args + (f" --dp-clients {clients}" if distributed else "")

    def membership_sparsity(self) -> float:
        """The audit's sparsity: the middle one of those with DP rows."""
        detail = self.d["detail_sparsities"]
        return float(detail[len(detail) // 2])

    # -- the DP headroom analysis (target domain_headroom) ------------------------------------------

    def headroom_setting(self) -> tuple[float, int]:
        """(sparsity, data seed) the analysis runs on: the first detail sparsity and ``domain.headroom.seed``
        (default: the first data seed). A seed the study does not score is a world of its own to choose in,
        whose pool alone the analysis's exact statistics spend."""
        return float(self.d["detail_sparsities"][0]), int((self.d["headroom"] or {}).get("seed", self.d["seeds"][0]))

    def headroom_json(self) -> str:
        return f"{self.setting('private', *self.headroom_setting())}/headroom.json"

    def headroom_split(self) -> str:
        """The in-domain split the analysis scores on: ``test`` (the study's windows) or
        ``validation`` (held out from them, to choose an estimator where the study does not score)."""
        return (self.d["headroom"] or {}).get("split", "test")

    def headroom_windows(self) -> str:
        if self.headroom_split() == "test":
            return self.eval_windows(self.d["private"])
        return self.validation_windows(self.d["private"])

    def validation_windows(self, dataset: str) -> str:
        return f"{self.base}/eval_windows/{dataset}-validation.safetensors"

    @staticmethod
    def validation_json(mask: str) -> str:
        return mask.removesuffix(".mask.safetensors") + ".validation.json"

    def headroom_evals(self) -> dict[str, str]:
        """The public-only and Centralized evaluations the analysis is paired against, on its windows."""
        sparsity, seed = self.headroom_setting()
        scored = self.eval_json if self.headroom_split() == "test" else self.validation_json
        return {"public": scored(self.public_mask(sparsity, seed)),
                "central": scored(self.mask("private", sparsity, seed, "central"))}

    def headroom(self) -> dict:
        """``domain.headroom`` (its variants and noise seeds; its split: :meth:`headroom_split`), or a clear
        error where it is not set."""
        if not self.d["headroom"]:
            raise ValueError("target domain_headroom: the config has no domain.headroom (its variants and noise seeds; "
                             "see config/domain_samples.yaml)")
        return {"noise_seeds": [0], **self.d["headroom"]}

    def choice(self) -> dict | None:
        """Where the report picks its claim row (``domain.headroom.split: validation``): the headroom
        analysis on validation windows and the two evaluations it pairs with, and which study
        mechanism releases each of its estimators; None otherwise (every DP row gets a goal line)."""
        if not self.d["headroom"] or self.headroom_split() != "validation":
            return None
        released = {MECHANISMS[m].estimator: m for m in self.d["mechanisms"]
                    if MECHANISMS[m].mechanism == "distributed" and not MECHANISMS[m].unit}
        sparsity, seed = self.headroom_setting()
        return {"headroom": self.headroom_json(), **self.headroom_evals(), "sparsity": sparsity, "seed": seed,
                "mechanisms": released}

    def headroom_outputs(self) -> dict[str, str]:
        return {ext: f"{self.catalog.reports}/headroom.{ext}" for ext in ("md", "csv")}

    # -- evaluation and report -------------------------------------------------------------------

    @staticmethod
    def eval_json(mask: str) -> str:
        return mask.removesuffix(".mask.safetensors") + ".eval.json"

    def dense_eval(self, dtype: str) -> str:
        return f"{self.base}/dense-{dtype}.eval.json"

    def grid(self, kind: str) -> list[tuple[float, int]]:
        if kind == "control":
            c = self.d["control"]
            return [(float(sp), int(s)) for sp in c["sparsities"] for s in c["seeds"]]
        return [(float(sp), int(s)) for sp in self.d["sparsities"] for s in self.d["seeds"]]

    def detailed(self, kind: str, sparsity: float) -> bool:
        """Whether a setting has every row: Local-only, the mix and the DP rows beside public,
        Centralized and FedPrLLM (the control: FedPrLLM and the DP rows; in-domain: at
        ``detail_sparsities``)."""
        return kind == "control" or float(sparsity) in {float(x) for x in self.d["detail_sparsities"]}

    def row_masks(self, kind: str, sparsity: float, seed: int) -> dict[str, str]:
        """Row key -> the mask it evaluates, in table order."""
        rows = {"public": self.public_mask(sparsity, seed)}
        detailed = self.detailed(kind, sparsity)
        wanted = {"private": ("central", "client_0", "fedprllm", "mix") if detailed else ("central", "fedprllm"),
                  "control": ("fedprllm",)}[kind]
        rows.update({which: self.mask(kind, sparsity, seed, which) for which in wanted})
        if detailed:
            rows.update({label: self.dp_mask(kind, sparsity, seed, label) for label in self.labels()})
        return rows

    def spec(self) -> dict:
        d = self.d
        evals = {kind: [{"sparsity": sp, "seed": seed,
                         "rows": {row: self.eval_json(mask) for row, mask in self.row_masks(kind, sp, seed).items()},
                         "record": f"{self.dp_dir(kind, sp, seed)}/pass.json" if self.detailed(kind, sp) else None,
                         # noise draws after the first: each DP row's evaluation and the pass that released it
                         "draws": [{"rows": {label: self.eval_json(self.dp_mask(kind, sp, seed, label, draw))
                                             for label in self.labels()},
                                    "record": f"{self.dp_dir(kind, sp, seed, draw)}/pass.json"}
                                   for draw in self.draws()[1:]] if self.detailed(kind, sp) else []}
                        for sp, seed in self.grid(kind)] for kind in KINDS}
        return {
            "out_dir": self.catalog.reports,
            "model": self.config["model"]["name"], "config": self.catalog.config_files,
            "private": d["private"], "public": d["public"], "public_docs": d["public_docs"],
            "control_docs": d["control_docs"], "clients": d["clients"], "samples": d["samples"],
            "public_samples": d["public_samples"], "seqlen": self.seqlen, "delta": d["delta"], "clip": d["clip"],
            "basis": d["basis"], "epsilons": d["epsilons"], "mechanisms": d["mechanisms"],
            "titles": {name: m.title for name, m in MECHANISMS.items()},
            "references": {name: m.reference for name, m in MECHANISMS.items()}, "evaluation": d["evaluation"], "eval_c4_docs": self.config["evaluation"].get("c4_docs"),
            "dense": {dtype: self.dense_eval(dtype) for dtype in (d["evaluation"]["dtype"], "float32")},
            "evals": evals,
            # the membership game replaces a window: a client-level row has no audit
            "membership": {label: self.membership_json(label) for label in self.labels()
                           if not MECHANISMS[label.rsplit("-", 1)[0]].unit},
            "sampling": d["sampling"], "unit": DATASET_UNITS[d["private"]], "windows_per_unit": d["windows_per_unit"],
            # non-private diagnostics on a pool (target domain_headroom, run apart): the report lists one
            # in its pool's ledger where its file exists, without making the study wait for it
            "diagnostics": [{"kind": "private", "seed": self.headroom_setting()[1], "path": self.headroom_json(),
                             "label": "headroom analysis", "reads": "the clients' exact channel energies"}],
            "membership_sizes": {**d["membership"], "sparsity": self.membership_sparsity()},
            "choice": self.choice(),
        }

    def inputs(self) -> list[str]:
        spec = self.spec()
        files = list(spec["dense"].values()) + list(spec["membership"].values())
        for cells in spec["evals"].values():
            for cell in cells:
                files += list(cell["rows"].values()) + ([cell["record"]] if cell["record"] else [])
                for draw in cell["draws"]:
                    files += [*draw["rows"].values(), draw["record"]]
        if spec["choice"]:
            files += [spec["choice"][k] for k in ("headroom", "public", "central")]
        return sorted(set(files))

    def outputs(self) -> list[str]:
        return [f"{self.catalog.reports}/domain.{ext}" for ext in ("md", "csv", "png")]
