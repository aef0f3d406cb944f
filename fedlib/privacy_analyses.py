"""The privacy audit's analyses, one registry entry each.

An entry holds what the rest of fedlib reads about an analysis: its name (the config's
``privacy.<name>``), its default sizes (the config overrides them key by key; ``privacy.full``
again for the full audit), the workflow target that runs it (:data:`AUDIT`, ``privacy``: the
bundled audit of ``make run``), the ``fedlib privacy`` report verb, its table module
(:mod:`fedlib.privacy.tables`) and the writer there, and the files that writer makes under
``reports/``. From these the catalog (:class:`fedlib.catalog.privacy.PrivacyCatalog`: sizes, the
report rules' inputs and outputs), the command line (:mod:`fedlib.privacy_cli`: the report verbs),
the rules (``workflow/rules/privacy.smk``: a report rule and a target per analysis with a target)
and the README's figure blocks (``tools/readme_figures.py``) are built. A new analysis is its
stage (:mod:`fedlib.privacy.stages`), its verb and table module, its catalog spec
(``PrivacyCatalog.<name>_spec``, with the paths of its results), its schema entry, and one entry here.

Pure data, beside :mod:`fedlib.privacy` rather than in it: importing it imports nothing (not the
analyses' code), so the command line's parser and the workflow's parse stay light.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


#: the target of the bundled audit (part of `make run`): the analyses without a target of their own
AUDIT = "privacy"
#: the report verb of the bundled audit (and of secagg), assembled by fedlib.privacy.audit_report.write_reports
REPORT = "report"


@dataclass(frozen=True)
class Analysis:
    """One privacy analysis (module docstring). ``outputs``: its files under ``reports/``, with
    ``{s}`` for the size's suffix (``""`` for the reduced sizes, ``_full`` for the full audit's);
    ``sizes``: the size sets it is run at (``full`` only for analyses of the full audit);
    ``writer``: the function of its :attr:`table_module` that writes its tables (``write(spec,
    results)`` for the analyses of the ``report`` verb, else the report verb's ``writer(spec)``)."""

    name: str
    summary: str
    defaults: Mapping = field(default_factory=dict)
    target: str = AUDIT
    report: str = REPORT
    writer: str = "write"
    outputs: tuple[str, ...] = ()
    sizes: tuple[str, ...] = ("run",)

    @property
    def table_module(self) -> str:
        """The module that renders its tables (its ``writer`` there)."""
        return f"fedlib.privacy.tables.{self.name}"

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables it writes (``reports/<table>.csv``), at the reduced sizes."""
        return tuple(o.format(s="").removesuffix(".csv") for o in self.outputs if o.endswith(".csv"))

    def files(self, reports: str, size: str = "run") -> list[str]:
        """Its files under ``reports`` at ``size``."""
        suffix = "" if size == "run" else f"_{size}"
        return [f"{reports}/{o.format(s=suffix)}" for o in self.outputs]

    def report_rule(self, size: str = "run") -> str:
        """The workflow rule that writes its tables (the bundled audit's: ``privacy_report_<size>``)."""
        if self.target == AUDIT:
            return f"privacy_report_{size}"
        return f"{self.target}_report" + (f"_{size}" if len(self.sizes) > 1 else "")


def _tables(*names: str) -> tuple[str, ...]:
    return tuple(f"{name}{{s}}.{ext}" for name in names for ext in ("md", "csv", "html"))


ANALYSES: tuple[Analysis, ...] = (
    # the bundled audit of `make run` (one report, `fedlib privacy report`): reduced and full sizes
    Analysis("entropy", "bits per entry of client masks vs fp16 weights",
             outputs=(*_tables("privacy_entropy"), "privacy_entropy_layers{s}.csv"), sizes=("run", "full")),
    Analysis("similarity", "Hamming distances between masks from disjoint calibration sets",
             {"seeds": [], "seed_samples": 32}, outputs=_tables("privacy_similarity"), sizes=("run", "full")),
    Analysis("sensitivity", "Hamming distance between masks of data sets differing in one sample",
             {"neighbours": 2, "blocks": None}, outputs=_tables("privacy_sensitivity"), sizes=("run", "full")),
    Analysis("membership", "LiRA membership inference on shadow masks; AUC, TPR@FPR, ε lower bound",
             {"targets": 32, "pairs": 4, "blocks": 1, "seqlen": 64, "samples": None, "population": 256,
              "epsilons": [0.01, 0.1, 1]},
             outputs=(*_tables("privacy_membership"), "privacy_membership_roc{s}.png"), sizes=("run", "full")),
    Analysis("inversion", "reconstruct calibration tokens from block-0 q_proj masks",
             {"tokens": [16], "texts": 1, "steps": 300, "prior": False, "prior_samples": 32, "tiny": [1, 2, 3]},
             outputs=_tables("privacy_inversion"), sizes=("run", "full")),
    Analysis("defence", "randomized response on mask bits, FedPrLLM top-k on the noisy votes",
             {"epsilons": [1, 4], "group": "layer", "datasets": ["wikitext2"]},
             outputs=(*_tables("privacy_defence"), "privacy_defence{s}.png"), sizes=("run", "full")),
    # named targets, not part of `make run`
    Analysis("dp", "the DP client mechanism's table: proven vs audited ε, and perplexity",
             {"epsilons": [8, 64, 512], "delta": 1e-5, "clip": 1.0, "clients": 4, "samples": [32],
              "release_audit": {"epsilons": [1, 2], "trials": 100_000, "factor": 10.0, "population": 64}},
             target="privacy_dp", report="dp-report", writer="dp_table",
             outputs=(*_tables("privacy_dp", "privacy_dp_release", "privacy_dp_utility"), "privacy_dp_utility{s}.png"),
             sizes=("run", "full")),
    Analysis("membership_scale", "the membership attack on the whole mask at realistic sizes, per seed and pooled",
             {"sizes": [[2, 512]], "seeds": [0, 1, 2], "targets": 16, "pairs": 4, "population": 64},
             target="privacy_membership_scale", report="scale-report", writer="membership_scale_table",
             outputs=_tables("privacy_membership_scale")),
    Analysis("membership_shared", "the shared-shadow membership games, per size and seed, and pooled",
             {"sizes": [{"samples": 2, "seqlen": 512, "population": 8, "shadows": 8, "clients": 8}],
              "seeds": [0, 1, 2]},
             target="privacy_membership_shared", report="shared-report", writer="membership_shared_table",
             outputs=_tables("privacy_membership_shared")),
    Analysis("attribute", "the attribute inference games, per property and seed, and pooled",
             {"domain": "wikitext2", "terms": ["water"], "samples": 2, "seqlen": 512, "seeds": [0, 1, 2],
              "trials": 16, "pairs": 16, "population": 512, "domain_population": 64},
             target="privacy_attribute", report="attribute-report", writer="attribute_table",
             outputs=_tables("privacy_attribute")),
    Analysis("inversion_client", "the inversion of clients' whole calibration sets, per client and over clients",
             {"clients": None, "steps": 300, "refine_moves": 200, "candidates": 2048, "prior_samples": 32},
             target="privacy_inversion_client", report="inversion-client-report", writer="inversion_client_table",
             outputs=_tables("privacy_inversion_client")),
    Analysis("secagg", "membership inference on the sum of m client masks (what secure aggregation shows the "
                       "server) and on its global mask, per m",
             {"targets": 16, "pairs": 4, "pool": 32, "draws": 2, "blocks": 1, "cohorts": [1, 2, 4, 8, 16, 32],
              "server_group": "layer"},
             target="privacy_secagg", outputs=_tables("privacy_secagg")),
)

BY_NAME: dict[str, Analysis] = {analysis.name: analysis for analysis in ANALYSES}
#: the bundled audit of `make run` (rule privacy; privacy_full at the full sizes)
BUNDLED: tuple[Analysis, ...] = tuple(a for a in ANALYSES if a.target == AUDIT)
#: the analyses with a named target of their own, each with its own report
TARGETS: tuple[Analysis, ...] = tuple(a for a in ANALYSES if a.target != AUDIT)
