"""``fedlib privacy <analysis>``: the privacy audit's command line (arguments and handlers).

The arguments import nothing heavy: the handlers import their stage
(:mod:`fedlib.privacy.stages`) and torch only when they run.

    fedlib privacy entropy      --model M --out X.json CLIENT_MASKS...
    fedlib privacy similarity   --model M --out X.json [--seeds 1 2 ...] CLIENT_MASKS...
    fedlib privacy sensitivity  --model M --calib D.safetensors --replacements R.safetensors... --out X.json
    fedlib privacy membership   --model M --population P.safetensors --targets T --blocks B --out X.json
    fedlib privacy membership-shared --model M --population P.safetensors --samples N --shadows S --n-clients C --out X.json
    fedlib privacy secagg       --model M --population P.safetensors --cohorts 1 2 4 8 16 --out X.json
    fedlib privacy attribute    --model M --population P.safetensors (--term WORD | --domain-pool D.safetensors) --out X.json
    fedlib privacy inversion    --model M --texts T16.safetensors ... --out X.json
    fedlib privacy inversion-client --model M --mask CLIENT.mask.safetensors --shard S.safetensors --prior NAME=P.safetensors ... --out X.json
    fedlib privacy rr-aggregate --model M --epsilon E --server-group layer --out G.mask.safetensors --record X.json MASKS...
    fedlib privacy dp-federation --model M --public P.safetensors --calib C0 C1 ... --releases JSON [--noise-seed S] --out-dir D --record X.json
    fedlib privacy dp-headroom  --model M --public P --calib C0 C1 ... --windows W --variants JSON --out X.json
    fedlib privacy headroom-report --headroom X.json --public-eval E --central-eval E --out R.md
    fedlib privacy report       --spec JSON
    fedlib privacy scale-report --spec JSON
    fedlib privacy shared-report --spec JSON
    fedlib privacy attribute-report --spec JSON
    fedlib privacy inversion-client-report --spec JSON

The verbs that compute masks (similarity, sensitivity, membership, membership-shared, secagg, attribute) take
the clients' pruning options, ``--method-options`` included (JSON, as ``fedlib client-mask --method-options``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fedlib.cli_args import (
    add_c4_docs_argument,
    add_dp_arguments,
    add_group_argument,
    add_method_argument,
    add_placement_arguments,
    add_threads_argument,
    dp_target_from_args,
    parse_data_dir,
    renamed,
    set_threads,
    verb_parser,
)
from fedlib.privacy_analyses import ANALYSES, BY_NAME, REPORT

HELP = "privacy audit of shared masks: entropy, similarity, sensitivity, membership, inversion, defence"

#: the report verbs (fedlib.privacy_analyses): verb -> (the function that writes the tables from --spec,
#: as "module:function"; the analyses whose tables it writes). The bundled report's is the assembly of
#: fedlib.privacy.audit_report, a named target's its table module's writer.
REPORTS: dict[str, tuple[str, list]] = {}
for _analysis in ANALYSES:
    _writer = ("fedlib.privacy.audit_report:write_reports" if _analysis.report == REPORT
               else f"{_analysis.table_module}:{_analysis.writer}")
    REPORTS.setdefault(_analysis.report, (_writer, []))[1].append(_analysis)


def _claimed_epsilon(value: str) -> float:
    """A finite ε > 0: what a DP mechanism claims (the release audit has no ε = 0 or ∞ row)."""
    eps = _epsilon(value)
    if not 0 < eps < math.inf:
        raise argparse.ArgumentTypeError(f"a claimed ε must be a finite number > 0, got {value!r}")
    return eps


def _epsilon(value: str) -> float:
    if value.lower() in ("inf", "infinity", "none"):
        return math.inf
    try:
        eps = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"ε must be a number >= 0 or inf, got {value!r}") from None
    if not eps >= 0:
        raise argparse.ArgumentTypeError(f"ε must be >= 0 or inf, got {value}")
    return eps


def _blocks(value: str) -> int | None:
    if value.lower() in ("none", "null", "all"):
        return None
    blocks = int(value)
    if blocks < 1:
        raise argparse.ArgumentTypeError(f"--blocks must be >= 1 or 'all', got {value}")
    return blocks


def _named_file(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, got {value!r}")
    return name, path


def _method_options(value: str) -> dict:
    try:
        options = json.loads(value)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"--method-options must be a JSON object, got {value!r}: {err}") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"--method-options must be a JSON object, got {value!r}")
    return options


def _shadow_game_args(p, data_set: str) -> None:
    """The membership game's sizes (membership, secagg)."""
    _model_arg(p)
    _pruning_args(p, blocks=True)
    p.add_argument("--population", required=True, help="token file: targets are its first rows, the rest fill data sets")
    p.add_argument("--targets", type=int, default=32, help="target samples of the game")
    p.add_argument("--samples", type=int, default=2, help=f"samples in {data_set}")
    p.add_argument("--pairs", type=int, default=4, help="shadow (in, out) pairs per target: half direction, half fit")


def _model_arg(p) -> None:
    p.add_argument("--model", required=True, help="the public base model (folder, embedded alias or hub id)")


def _out_arg(p, what: str = "the JSON result to write") -> None:
    p.add_argument("--out", required=True, help=what)


def _game_args(p) -> None:
    """What every inference game reports: TPR at these FPRs, intervals at this confidence."""
    p.add_argument("--fprs", type=float, nargs="+", default=[0.01, 0.001], help="false positive rates of the TPRs")
    p.add_argument("--confidence", type=float, default=0.95, help="the intervals' confidence")


def _pruning_args(p, blocks: bool = False) -> None:
    add_method_argument(p, "wanda")
    p.add_argument("--method-options", type=_method_options, default=None,
                   help="JSON of the local method's options, as fedlib client-mask --method-options")
    p.add_argument("--sparsity", type=float, default=0.5, help="the fraction of each layer's weights pruned")
    add_group_argument(p, "local", "row", "--group")
    p.add_argument("--seed", type=int, default=0, help="the seed of the tie-breaks (and of the game's draws)")
    p.add_argument("--batch-size", type=int, default=8, help="calibration samples per forward pass")
    add_threads_argument(p)
    add_placement_arguments(p)
    if blocks:
        p.add_argument("--blocks", type=_blocks, default=None,
                       help="masks of decoder blocks 0..B-1 only ('all' = the whole model)")


def _dp_federation_args(p) -> None:
    """What a simulated DP federation reads (:func:`_dp_federation_inputs`)."""
    _model_arg(p)
    _pruning_args(p)
    p.add_argument("--public", required=True, help="token file of the public text")
    renamed(p, "--calib", "--clients", nargs="+", required=True, help="one token file per client")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="analysis", required=True)

    p = sub.add_parser("entropy", help=BY_NAME["entropy"].summary)
    _model_arg(p)
    add_threads_argument(p)
    _out_arg(p)
    p.add_argument("masks", nargs="+", help="client mask files (the first is 'the' client mask)")

    p = sub.add_parser("similarity", help=BY_NAME["similarity"].summary)
    _model_arg(p)
    _pruning_args(p)
    p.add_argument("--seeds", type=int, nargs="*", help="also compute masks from calibration draws with these seeds")
    p.add_argument("--seed-samples", type=int, default=32, help="samples per seeded draw")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per sample of the seeded draws")
    p.add_argument("--dataset", default="c4", choices=["c4", "wikitext2", "ptb"], help="the seeded draws' data set")
    p.add_argument("--data-dir", default=None, help="offline mirror folder (auto: ../shared/data, else resources/data); omit for the hub")
    add_c4_docs_argument(p, "C4 documents the seeded draws come from (default: all)")
    _out_arg(p)
    p.add_argument("masks", nargs="*", help="client mask files to compare pairwise")

    p = sub.add_parser("sensitivity", help=BY_NAME["sensitivity"].summary)
    _model_arg(p)
    _pruning_args(p, blocks=True)
    p.add_argument("--calib", required=True, help="token file of the data set D (e.g. a client's shard)")
    p.add_argument("--replacements", nargs="+", required=True, help="token files of samples not in D")
    p.add_argument("--neighbours", type=int, default=2, help="neighbouring data sets (one sample replaced) per file")
    p.add_argument("--base-mask", help="the client's shared mask file for D (checked), instead of recomputing it")
    _out_arg(p)

    p = sub.add_parser("membership", help=BY_NAME["membership"].summary)
    _shadow_game_args(p, "the client's data set")
    p.add_argument("--epsilons", type=_epsilon, nargs="*", default=[],
                   help="also attack masks under randomized response with these per-bit ε")
    add_dp_arguments(p, noise_seed=False)  # every mask its own noise seed, drawn from --seed
    _game_args(p)
    _out_arg(p)

    p = sub.add_parser("membership-shared", help="membership inference against the whole mask with shadow masks "
                       "shared by every target (fedlib.privacy.stages.membership_shared)")
    _model_arg(p)
    _pruning_args(p)
    p.add_argument("--population", required=True, help="token file: every row is a target of every mask")
    p.add_argument("--samples", type=int, required=True, help="rows in a client's data set")
    p.add_argument("--shadows", type=int, required=True,
                   help="the attacker's masks (a multiple of population rows / samples)")
    renamed(p, "--n-clients", "--clients", type=int, required=True,
            help="observed client masks, one designated target each")
    _game_args(p)
    _out_arg(p)

    p = sub.add_parser("release-audit", help="the white-box audit of one release of the DP client mechanism, with "
                       "its positive controls (fedlib.privacy.stages.dp_release)")
    _model_arg(p)
    p.add_argument("--population", required=True, help="token file: the auditor picks the farthest pair of its rows")
    p.add_argument("--epsilons", type=_claimed_epsilon, nargs="+", required=True, help="claimed ε to audit")
    p.add_argument("--delta", type=float, required=True, help="the mechanism's δ")
    p.add_argument("--clip", type=float, required=True, help="the mechanism's clip")
    p.add_argument("--trials", type=int, default=100_000, help="releases drawn per world (the game's size)")
    p.add_argument("--factor", type=float, default=10.0,
                   help="the broken control's sensitivity understatement (its noise std divided by this)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the audit's noise draws")
    p.add_argument("--confidence", type=float, default=0.95, help="the bounds' confidence")
    add_threads_argument(p)
    _out_arg(p)

    p = sub.add_parser("secagg", help=BY_NAME["secagg"].summary)
    _shadow_game_args(p, "each client's data set")
    p.add_argument("--cohorts", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="numbers of clients m summed")
    p.add_argument("--pool", type=int, default=32, help="other clients' masks in each pool (real / attacker's)")
    p.add_argument("--draws", type=int, default=2, help="sums per fitting shadow mask")
    add_group_argument(p, "server", "layer")
    _game_args(p)
    _out_arg(p)

    p = sub.add_parser("attribute", help="attribute inference: does the client hold a window of a domain, or one "
                       "containing a term? AUC, TPR@FPR, ε lower bound")
    _model_arg(p)
    _pruning_args(p, blocks=True)
    p.add_argument("--population", required=True, help="token file: the rows without the property (with --term: "
                                                       "split by the term)")
    prop = p.add_mutually_exclusive_group(required=True)
    prop.add_argument("--term", help="the property: a row contains this word (whole word, any case)")
    prop.add_argument("--domain-pool", help="the property: a row of this token file (another domain)")
    p.add_argument("--trials", type=int, default=16, help="client data sets with the property, and as many without")
    p.add_argument("--samples", type=int, default=2, help="samples in the client's data set")
    p.add_argument("--pairs", type=int, default=16, help="shadow pairs: half direction, half fit")
    _game_args(p)
    _out_arg(p)

    p = sub.add_parser("inversion", help=BY_NAME["inversion"].summary)
    _model_arg(p)
    p.add_argument("--texts", nargs="+", required=True, help="token files; rows of T tokens are the private texts")
    p.add_argument("--per-length", type=int, default=1, help="texts per token file")
    p.add_argument("--sparsity", type=float, default=0.5, help="the fraction of each layer's weights pruned")
    add_group_argument(p, "local", "row", "--group")
    p.add_argument("--seed", type=int, default=0, help="the seed of the tie-breaks and the attack")
    p.add_argument("--steps", type=int, default=300, help="gradient steps of the attack")
    p.add_argument("--restarts", type=int, default=1, help="restarts of the attack per text")
    p.add_argument("--prior-tokens", nargs="*", help="public token files: unigram baseline (and prior)")
    p.add_argument("--use-prior", action="store_true", help="initialise the attack's logits at the unigram prior")
    p.add_argument("--tiny-lengths", type=int, nargs="*", default=[1, 2, 3],
                   help="text lengths also attacked by exhaustive search")
    p.add_argument("--tiny-steps", type=int, default=200, help="gradient steps of the tiny lengths")
    p.add_argument("--time-limit", type=float, default=None, help="seconds per text for the gradient stage")
    add_threads_argument(p)
    _out_arg(p)

    p = sub.add_parser("inversion-client", help="the server inverts a client's uploaded block-0 q/k/v masks to the "
                       "bag of all its calibration tokens")
    _model_arg(p)
    p.add_argument("--mask", required=True, help="the client's mask file as uploaded (fedlib client-mask)")
    p.add_argument("--shard", required=True, help="the client's calibration token file: only to score the attack")
    p.add_argument("--prior", nargs="+", required=True, type=_named_file, metavar="NAME=TOKENS",
                   help="public token files: one unigram-guess baseline each")
    p.add_argument("--init-prior", help="the prior (NAME) the attack starts from; default: the first")
    p.add_argument("--steps", type=int, default=300, help="gradient steps of the attack")
    p.add_argument("--refine-moves", type=int, default=0, help="at most this many exact one-count moves")
    p.add_argument("--candidates", type=int, default=2048, help="tokens a move may add: the highest soft probability")
    add_threads_argument(p)
    _out_arg(p)

    p = sub.add_parser("rr-aggregate",
                       help="defence: randomized response on client mask bits, FedPrLLM top-k on the noisy votes")
    _model_arg(p)
    p.add_argument("--epsilon", type=_epsilon, required=True, help="per-bit ε ('inf' = no noise)")
    add_group_argument(p, "server", "layer", "--group")
    p.add_argument("--sparsity", type=float, default=0.5, help="the global mask's sparsity")
    p.add_argument("--seed", type=int, default=0, help="the noise's and the tie-breaks' seed")
    p.add_argument("--per-client", action="store_true",
                   help="flip every client's bits (slow) instead of sampling the noisy counts exactly")
    p.add_argument("--clean-global", help="the noise-free global mask file (fedlib aggregate) to compare with")
    add_threads_argument(p)
    _out_arg(p, "global mask file")
    p.add_argument("--record", required=True, help="JSON: flip rates, distance to the noise-free global mask")
    p.add_argument("masks", nargs="+", help="the clients' mask files")

    for verb, (writer, analyses) in REPORTS.items():
        p = sub.add_parser(verb, help="write the tables (Markdown + CSV + HTML) and plots of " + "; ".join(
            f"{a.name} ({a.summary})" for a in analyses))
        p.add_argument("--spec", required=True, help=f"JSON: context, output folder, the result files "
                                                     f"(fedlib.catalog.privacy.PrivacyCatalog.report_spec; "
                                                     f"{writer})")

    p = sub.add_parser("dp-federation", help="a simulated DP federation: every client's normalised DP mask and the "
                       "distributed mechanism's, per release, from one pass (fedlib.privacy.stages.dp_federation)")
    _dp_federation_args(p)
    p.add_argument("--releases", required=True, help='JSON list of {"label", "mechanism" (normalised or distributed), '
                                                     '"epsilon", "delta", "clip", "basis", "estimator" '
                                                     '(threshold or posterior; default threshold), "unit" '
                                                     '("client": each client\'s contribution clipped once; default: '
                                                     'the clients\' token files\' unit)}')
    p.add_argument("--noise-seed", type=int,
                   help="seed the noise (a simulation: x_dp noise 'seeded', reported as not private); default: the "
                        "OS's cryptographic generator")
    p.add_argument("--out-dir", required=True, help="writes <label>/client_<i>.mask.safetensors or "
                                                    "<label>/secagg.mask.safetensors")
    p.add_argument("--record", required=True, help="JSON: the guarantees, files and the pass's time")

    p = sub.add_parser("dp-headroom", help="what limits the distributed DP masks: the exact private energies, the "
                       "threshold and posterior estimators at emulated data sizes, an oracle reference "
                       "(fedlib.privacy.dp_headroom)")
    _dp_federation_args(p)
    p.add_argument("--windows", required=True, help="token file of the in-domain evaluation windows")
    p.add_argument("--variants", required=True, help='JSON list of {"estimator" (threshold, posterior or oracle), "epsilon", '
                                                     '"delta" (1e-5), "multipliers" ([1])}; the exact row is added')
    p.add_argument("--noise-seeds", type=int, nargs="+", default=[0], help="the noise draws, one row each")
    p.add_argument("--clip", type=float, default=2.0, help="x the public samples' rms deviation (as the study's)")
    p.add_argument("--eval-dtype", default="bfloat16", help="dtype of the evaluation (the study's: bfloat16)")
    p.add_argument("--eval-threads", type=int, default=1,
                   help="CPU threads of the evaluation: as many as the paired evaluations had (bfloat16 sums on "
                        "the CPU depend on it; the domain study evaluates on 1)")
    p.add_argument("--out", required=True, help="JSON: every row's per-window NLL")

    p = sub.add_parser("headroom-report", help="the DP headroom table (fedlib.studies.headroom)")
    p.add_argument("--headroom", required=True, help="fedlib privacy dp-headroom's JSON")
    p.add_argument("--public-eval", required=True, help="fedlib evaluate's JSON of public-only on the same windows")
    p.add_argument("--central-eval", required=True, help="fedlib evaluate's JSON of Centralized on the same windows")
    p.add_argument("--dataset", default="ptb", help="the in-domain evaluation set, as the table names it")
    p.add_argument("--model-name", required=True, help="the model, as the provenance line names it")
    p.add_argument("--config", required=True, help="the config files, as the provenance line names them")
    p.add_argument("--out", required=True, help="writes OUT (markdown) and OUT with .csv")

    p = sub.add_parser("domain-report", help="the domain-shift study: private in-domain vs public text, DP rows, "
                       "paired intervals (fedlib.studies.domain)")
    p.add_argument("--spec", required=True, help="JSON: the study's files (fedlib.catalog.domain.DomainCatalog.spec)")
    for analysis in sub.choices.values():
        verb_parser(analysis)


# --------------------------------------------------------------------------- handlers


def _write_json(path: Path, payload: dict) -> None:
    from fedlib.io import write_text_atomic

    write_text_atomic(Path(path), json.dumps(payload, indent=1, sort_keys=True, default=_json_default) + "\n")


def _json_default(x):
    import numpy as np

    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    raise TypeError(f"not JSON serializable: {type(x)}")


def _open(args, pruned: bool = True, many_masks: bool = False):
    """(model handle, the clients' pruning) of an analysis. One that computes masks prunes as its
    pruning arguments say (``_pruning_args``), on the placement from ``--device`` / ``--dtype``;
    the others open the model on the CPU (pruning None). ``many_masks``: the analysis computes
    dozens of whole-model masks in this process (:func:`fedlib.jobsize.unmap_freed_tensors`)."""
    from fedlib.client import Pruning
    from fedlib.jobsize import unmap_freed_tensors
    from fedlib.models import open_model
    from fedlib.runner import CPU, Placement

    if many_masks:
        unmap_freed_tensors()
    set_threads(args)
    if not pruned:
        return open_model(args.model, CPU.dtype), None
    placement = Placement.resolve(args.device, args.dtype)
    pruning = Pruning(args.method, args.sparsity, args.local_group, args.seed, args.method_options, args.batch_size,
                      placement)
    return open_model(args.model, placement.dtype), pruning


def _cmd_entropy(args) -> None:
    from fedlib.privacy.stages.entropy import entropy_audit

    handle, _ = _open(args, pruned=False)
    _write_json(args.out, entropy_audit(handle, [Path(p) for p in args.masks]))


def _cmd_similarity(args) -> None:
    from fedlib.privacy.stages.similarity import similarity_audit

    model, pruning = _open(args)
    windows = []
    if args.seeds:
        from fedlib.data import calibration_windows
        from fedlib.models import load_tokenizer

        tokenizer = load_tokenizer(args.model)
        docs = tuple(args.c4_docs) if args.c4_docs else None
        windows = [calibration_windows(tokenizer, args.dataset, parse_data_dir(args.data_dir), args.seed_samples,
                                       args.seqlen, s, docs)
                   for s in args.seeds]
    result = similarity_audit(model, [Path(p) for p in args.masks], windows, args.seeds or [], pruning)
    _write_json(args.out, result)


def _cmd_sensitivity(args) -> None:
    import torch

    from fedlib.data import load_tokens
    from fedlib.privacy.stages.sensitivity import sensitivity_audit

    model, pruning = _open(args)
    ids, _ = load_tokens(Path(args.calib))
    reps = torch.cat([load_tokens(Path(p))[0] for p in args.replacements])
    base = _base_masks(model, args, ids) if args.base_mask else None
    result = sensitivity_audit(model, ids, reps, args.neighbours, pruning, args.blocks, base)
    result["calib"] = str(args.calib)
    result["base_mask"] = args.base_mask
    _write_json(args.out, result)


def _base_masks(model, args, ids) -> dict:
    """D's masks from the client's shared mask file, after checking it was computed the
    way this analysis computes masks (else the comparison would mix two computations)."""
    from fedlib.maskcode import MagnitudeReference
    from fedlib.maskfile import MaskFile
    from fedlib.models import ModelHandle
    from fedlib.privacy.bits import block_of

    handle = ModelHandle.of(model)
    mf = MaskFile(Path(args.base_mask), handle.fingerprint(), handle.layers(),
                  reference=MagnitudeReference.of_model(handle))
    h = mf.header
    wanted = {"method": args.method, "group": args.local_group, "sparsity": args.sparsity, "seed": args.seed,
              "n_samples": int(ids.shape[0]), "method_options": args.method_options or {}}
    # fedlib client-mask records the method options as JSON; a file without the field used none
    found = {"method": h.method, "group": h.group, "sparsity": h.sparsity, "seed": h.seed, "n_samples": h.n_samples,
             "method_options": json.loads(h.extra.get("method_options", "{}"))}
    if found != wanted:
        raise ValueError(f"{args.base_mask}: computed with {found}, not {wanted}; omit --base-mask to recompute")
    masks = mf.masks()
    if args.blocks is not None:
        masks = {n: m for n, m in masks.items() if block_of(n) < args.blocks}
    return masks


def _cmd_membership(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.privacy.stages.membership import membership_audit

    model, pruning = _open(args)
    pop, _ = load_tokens(Path(args.population))
    result = membership_audit(model, pop, args.targets, args.samples, args.pairs, args.blocks, pruning,
                              args.epsilons, args.fprs, args.confidence, dp=dp_target_from_args(args))
    result["population_file"] = str(args.population)
    _write_json(args.out, result)


def _cmd_release_audit(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.privacy.stages.dp_release import release_audit_with_controls

    handle, _ = _open(args, pruned=False)
    population, _ = load_tokens(Path(args.population))
    result = release_audit_with_controls(handle.load_all(), population, args.epsilons, args.delta, args.clip,
                                         args.trials, args.factor, args.seed, args.confidence)
    result["population_file"] = str(args.population)
    _write_json(args.out, result)
    for row in result["rows"]:
        print(f"ε={row['claimed']['epsilon']:g} {row['mechanism']}: bound {row['audit']['epsilon_lb']:.2f}, "
              f"ceiling {row['ceiling']:.2f}: {row['verdict']}")


def _dp_federation_inputs(args):
    """(model, pruning, public ids, each client's ids) of a simulated DP federation (plain Wanda)."""
    from fedlib.data import load_tokens

    if args.method != "wanda" or args.method_options:
        raise ValueError(f"DP masks are plain Wanda's, not {args.method!r} with options {args.method_options}")
    model, pruning = _open(args)
    public, _ = load_tokens(Path(args.public))
    return model, pruning, public, [load_tokens(Path(p))[0] for p in args.calib]


def _cmd_dp_federation(args) -> None:
    from fedlib.privacy.stages.dp_federation import simulate

    from fedlib.data import load_tokens
    from fedlib.dp.unit import common_unit, unit_of_tokens

    model, pruning, public, clients = _dp_federation_inputs(args)
    unit = common_unit(unit_of_tokens(load_tokens(Path(path))[1], path) for path in args.calib)
    record = simulate(model, public, clients, json.loads(args.releases), Path(args.out_dir), pruning, args.noise_seed,
                      unit)
    _write_json(args.record, record)
    print(f"wrote {len(record['releases'])} releases in {record['seconds']:.1f}s")


def _cmd_dp_headroom(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.models import open_model, prunable_layers
    from fedlib.privacy.dp_headroom import headroom, variants_from_spec
    from fedlib.dp.public import tokens_digest
    from fedlib.runner import Placement

    model, pruning, public, clients = _dp_federation_inputs(args)
    windows, windows_meta = load_tokens(Path(args.windows))
    names = [info.name for info in prunable_layers(model)]
    digest = tokens_digest(public)
    variants = variants_from_spec(json.loads(args.variants), args.noise_seeds, args.clip, names, len(clients), digest)
    eval_placement = Placement.resolve(args.device, args.eval_dtype)
    record = headroom(model, open_model(args.model, eval_placement.dtype), public, clients, windows, pruning,
                      eval_placement, variants, args.eval_threads)
    record.update(public=digest, clip=args.clip, windows_file=str(args.windows), eval_dtype=args.eval_dtype,
                  **({"split": windows_meta["split"]} if "split" in windows_meta else {}))
    _write_json(args.out, record)
    print(f"wrote {args.out}: {len(record['rows'])} rows")


def _cmd_headroom_report(args) -> None:
    from fedlib.studies.headroom import headroom_table

    for path in headroom_table(Path(args.headroom), Path(args.public_eval), Path(args.central_eval), args.dataset,
                               Path(args.out), f"Model: {args.model_name}; config {args.config}"):
        print(f"wrote {path}")


def _cmd_membership_shared(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.privacy.stages.membership_shared import membership_shared_audit

    model, pruning = _open(args, many_masks=True)
    pop, _ = load_tokens(Path(args.population))
    result = membership_shared_audit(model, pop, args.samples, args.shadows, args.n_clients, pruning, args.fprs,
                                     args.confidence)
    result["population_file"] = str(args.population)
    _write_json(args.out, result)
    print(f"membership-shared: AUC over {result['pairs']['masks']} client masks x {pop.shape[0]} targets "
          f"{result['pairs']['auc']:.3f} ({result['seconds']:.0f}s)")


def _cmd_attribute(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.privacy.stages.attribute import attribute_audit, term_rows

    model, pruning = _open(args, many_masks=True)
    pop, _ = load_tokens(Path(args.population))
    if args.term is not None:
        from fedlib.models import load_tokenizer

        tokenizer = load_tokenizer(args.model)
        has = term_rows(tokenizer.batch_decode(pop.tolist()), args.term)
        if int(has.sum()) < 2:
            raise ValueError(f"{args.population}: {int(has.sum())} of its {pop.shape[0]} windows contain "
                             f"'{args.term}'; the game needs at least 2 (the attacker's half and the client's)")
        with_rows, without_rows = pop[has], pop[~has]
        prop = {"kind": "term", "term": args.term}
    else:
        with_rows, _ = load_tokens(Path(args.domain_pool))
        without_rows = pop
        if with_rows.shape[1] != pop.shape[1]:
            raise ValueError(f"{args.domain_pool}: rows of {with_rows.shape[1]} tokens, {args.population} has "
                             f"{pop.shape[1]}; the two kinds of rows must be equally long")
        prop = {"kind": "domain", "domain_pool": str(args.domain_pool)}
    result = attribute_audit(model, with_rows, without_rows, args.trials, args.samples, args.pairs, args.blocks,
                             pruning, args.fprs, args.confidence)
    result["property"] = prop
    result["population_file"] = str(args.population)
    _write_json(args.out, result)


def _cmd_secagg(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.privacy.stages.secagg import secagg_membership_audit

    if args.blocks is None:
        raise ValueError("--blocks must be a number (sums of whole-model masks of every "
                         "pool client do not fit the audit's memory plan)")
    model, pruning = _open(args)
    pop, _ = load_tokens(Path(args.population))
    result = secagg_membership_audit(model, pop, args.targets, args.samples, args.pairs, args.blocks, args.cohorts,
                                     args.pool, args.draws, pruning, args.server_group, args.fprs, args.confidence)
    result["population_file"] = str(args.population)
    _write_json(args.out, result)


def _cmd_inversion(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.models import load_tokenizer
    from fedlib.privacy.stages.inversion import inversion_audit, unigram_distribution

    model, _ = _open(args, pruned=False)
    tokenizer = load_tokenizer(args.model)
    texts = {}
    for path in args.texts:
        ids, _ = load_tokens(Path(path))
        texts[int(ids.shape[1])] = ids[: args.per_length]
    vocab = model.model.get_input_embeddings().weight.shape[0]
    prior = unigram_distribution(args.prior_tokens, vocab) if args.prior_tokens else None
    result = inversion_audit(model, tokenizer, texts, args.sparsity, args.local_group, args.seed, args.steps,
                             args.restarts, prior, args.use_prior, args.tiny_lengths, args.tiny_steps,
                             args.time_limit)
    result["prior_tokens"] = [str(p) for p in args.prior_tokens or []]
    _write_json(args.out, result)


def _cmd_inversion_client(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.privacy.stages.inversion import client_inversion, unigram_distribution

    model, _ = _open(args, pruned=False)
    names = [name for name, _ in args.prior]
    if len(set(names)) != len(names):
        raise ValueError(f"--prior: the names {names} repeat")
    init = args.init_prior or names[0]
    if init not in names:
        raise ValueError(f"--init-prior {init!r}: not one of the --prior names {names}")
    shard, _ = load_tokens(Path(args.shard))
    vocab = model.model.get_input_embeddings().weight.shape[0]
    priors = {name: unigram_distribution([path], vocab) for name, path in args.prior}
    result = client_inversion(model, Path(args.mask), shard, priors, init, args.steps, args.refine_moves,
                              args.candidates)
    result.update(shard_file=str(args.shard), prior_tokens=dict(args.prior))
    _write_json(args.out, result)
    print(f"inversion of {args.mask}: bag {result['bag_overlap']:.3f} (gradient stage "
          f"{result['gradient_bag_overlap']:.3f}; unigram guess {result['unigram_bag_overlap']})")


def _cmd_rr_aggregate(args) -> None:
    from fedlib.privacy.stages.defence import rr_aggregate

    model, _ = _open(args, pruned=False)
    record = rr_aggregate(model, [Path(p) for p in args.masks], args.epsilon, args.server_group,
                          args.sparsity, args.seed, Path(args.out), args.per_client,
                          Path(args.clean_global) if args.clean_global else None)
    _write_json(args.record, record)
    print(f"wrote {args.out}: ε={args.epsilon}, global mask differs from the noise-free one in "
         f"{record['global_hamming_vs_clean']:.4%} of the weights")


def _cmd_domain_report(args) -> None:
    from fedlib.studies.domain import domain_table

    for path in domain_table(json.loads(args.spec)):
        print(f"wrote {path}")


def _cmd_report_tables(args) -> None:
    from importlib import import_module

    module, function = REPORTS[args.analysis][0].split(":")
    for path in getattr(import_module(module), function)(json.loads(args.spec)):
        print(f"wrote {path}")


COMMANDS = {
    "entropy": _cmd_entropy, "similarity": _cmd_similarity, "sensitivity": _cmd_sensitivity,
    "membership": _cmd_membership, "release-audit": _cmd_release_audit, "membership-shared": _cmd_membership_shared,
    "secagg": _cmd_secagg,
    "inversion": _cmd_inversion, "rr-aggregate": _cmd_rr_aggregate,
    "attribute": _cmd_attribute, "inversion-client": _cmd_inversion_client, "dp-federation": _cmd_dp_federation,
    "domain-report": _cmd_domain_report, "dp-headroom": _cmd_dp_headroom, "headroom-report": _cmd_headroom_report,
    **{verb: _cmd_report_tables for verb in REPORTS},
}


def run(args) -> None:
    COMMANDS[args.analysis](args)
