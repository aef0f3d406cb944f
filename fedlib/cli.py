"""`fedlib` command line: the verbs of the federated pruning protocol and the workflow's steps.

Practitioners: each site runs ``fedlib client-mask`` on its own data and sends the mask
file; the coordinator runs ``fedlib aggregate`` and ``fedlib export``. The workflow calls
the same verbs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

from fedlib import __version__
from fedlib.cli_args import (
    add_c4_docs_argument,
    add_dp_arguments,
    add_group_argument,
    add_method_argument,
    add_placement_arguments,
    add_previous_global_argument,
    add_threads_argument,
    client_id_argument,
    comparison_group,
    dp_target_from_args,
    input_file,
    old_values,
    parse_data_dir,
    renamed,
    set_threads,
    verb_parser,
)
from fedlib.protocol import CALIBRATION_FREE, METHODS
from fedlib.strategy_options import STRATEGY_OPTIONS


def _write_json(path: Path, payload: dict) -> None:
    from fedlib.io import write_text_atomic

    write_text_atomic(Path(path), json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _print_round_times(rounds) -> None:
    """Seconds per round, for the job's log: records hold only what was computed (same inputs,
    same bytes), so timings go to the log and to the rule's benchmark file."""
    for r in rounds:
        print(f"round {r.round}: clients {r.seconds_clients:.1f}s, server {r.seconds_server:.1f}s")


def open_placed(args):
    """(model handle, placement) from ``--model``, ``--device``, ``--dtype`` (and ``--threads``)."""
    from fedlib.models import open_model
    from fedlib.runner import Placement

    set_threads(args)
    placement = Placement.resolve(args.device, args.dtype)
    return open_model(args.model, placement.dtype), placement


def pruning_from_args(args, placement):
    """The local pruning of a verb that prunes (:class:`fedlib.client.Pruning`): ``--method``,
    ``--sparsity``, ``--local-group``, ``--seed``, ``--method-options`` (JSON), ``--batch-size``,
    on ``placement``."""
    from fedlib.client import Pruning

    options = json.loads(args.method_options) if args.method_options else None
    return Pruning(args.method, args.sparsity, args.local_group, args.seed, options, args.batch_size, placement)


# --------------------------------------------------------------------------- verbs


def cmd_materialize_model(args) -> None:
    from fedlib.models import materialize

    out = materialize(args.model, Path(args.out))
    print(f"wrote {out}")


def cmd_calibration_pool(args) -> None:
    from fedlib.data import (
        MIXTURE_DATASETS,
        DataError,
        calibration_split,
        calibration_windows,
        mixture_pool,
        save_tokens,
        unit_windows,
    )
    from fedlib.models import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    data_dir = parse_data_dir(args.data_dir)
    docs = tuple(args.c4_docs) if args.c4_docs else None
    labels, cut = None, {}
    if args.unit is not None:  # disjoint windows for a DP release, each window's unit recorded
        if args.dataset == "mix":
            raise DataError("--unit: the mix pool draws windows at random offsets; cut one dataset by unit")
        ids, units = unit_windows(tokenizer, args.dataset, data_dir, args.nsamples, args.seqlen, args.seed, args.unit,
                                  args.windows_per_unit, docs)
        cut = {"unit": args.unit, "windows_per_unit": args.windows_per_unit, "units": units}
        splits = {args.dataset: calibration_split(args.dataset, data_dir)}
    elif args.dataset == "mix":  # the non-IID pool: --nsamples windows from each dataset
        ids, labels = mixture_pool(tokenizer, data_dir, args.nsamples, args.seqlen, args.seed, c4_docs=docs)
        splits = {d: calibration_split(d, data_dir) for d in MIXTURE_DATASETS}
    else:
        ids = calibration_windows(tokenizer, args.dataset, data_dir, args.nsamples, args.seqlen, args.seed, docs)
        splits = {args.dataset: calibration_split(args.dataset, data_dir)}
    save_tokens(Path(args.out), ids, dataset=args.dataset, seed=args.seed, docs=args.c4_docs,
                data_dir=str(args.data_dir), labels=labels, splits=splits, **cut)
    print(f"wrote {args.out}: {tuple(ids.shape)} tokens from {args.dataset}")


def cmd_client_data(args) -> None:
    from fedlib.data import DataError, dirichlet_partition, iid_partition, load_tokens, save_tokens, unit_partition

    ids, meta = load_tokens(Path(args.pool))
    units = meta.get("units")
    if units is not None and (not isinstance(units, list) or len(units) != ids.shape[0]
                              or not all(type(u) is int for u in units)):
        raise DataError(f"{args.pool}: field 'units': expected one integer per window ({ids.shape[0]})")
    if args.partition == "iid" and units is not None:  # a pool cut for DP: whole units to one client
        parts = unit_partition(units, args.n_clients, args.seed)
    elif args.partition == "iid":
        parts = iid_partition(ids.shape[0], args.n_clients, args.seed)
    elif args.partition.startswith("dir"):  # dir<alpha>: Dirichlet(alpha) over the pool's sources
        if not meta.get("labels"):
            raise DataError(f"{args.pool}: field 'labels' missing; a Dirichlet split needs a mixture pool (dataset mix)")
        parts = dirichlet_partition(meta["labels"], args.n_clients, float(args.partition[3:]), args.seed)
    else:
        raise ValueError(f"--partition {args.partition!r}: expected iid or dir<alpha>")
    if not 0 <= args.client < args.n_clients:
        raise ValueError(f"--client must be in 0..{args.n_clients - 1}, got {args.client}")
    rows = parts[args.client]
    if units is not None:
        meta["units"] = [units[r] for r in rows]
    save_tokens(Path(args.out), ids[rows], pool=str(args.pool), rows=rows,
                client=args.client, n_clients=args.n_clients, partition=args.partition, **meta)
    print(f"wrote {args.out}: client {args.client} has samples {rows}")


def _dp_unit(args, tokens):
    """The unit a site's DP release protects: ``--dp-unit client``, or the unit its calibration
    files' windows were cut by (refused when they were drawn at random offsets)."""
    from fedlib.dp.unit import ProtectedUnit, common_unit, unit_of_tokens

    if args.dp_epsilon is None or not math.isfinite(args.dp_epsilon):
        return None
    if args.dp_unit is not None:
        return ProtectedUnit(args.dp_unit)
    return common_unit(unit_of_tokens(meta, path) for path, _, meta in tokens)


def cmd_client_mask(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.uploads import write_client_mask

    if not args.calib and args.method not in CALIBRATION_FREE:
        raise ValueError(f"--calib: method {args.method} computes the mask on this client's calibration samples; "
                         "give their token file(s)")
    start = time.perf_counter()
    handle, placement = open_placed(args)
    ids, tokens = None, []
    if args.calib:  # several files: calibrate on their union (a public + private mix)
        import torch

        tokens = [(path, *load_tokens(Path(path))) for path in args.calib]
        ids = torch.cat([t for _, t, _ in tokens])
    opened = time.perf_counter()
    blocks = write_client_mask(
        handle, ids, Path(args.out), pruning_from_args(args, placement), client_id=args.client_id,
        format_version=args.format_version, round_index=args.round, global_masks=args.previous_global,
        scale=args.scale, dp=dp_target_from_args(args, _dp_unit(args, tokens)), dp_noise_seed=args.dp_noise_seed,
        allow_seeded_noise=args.dp_allow_seeded_noise, dtype=args.dtype)
    done = time.perf_counter()
    device_peak = ""
    if placement.device.type == "cuda":
        import torch

        device_peak = f", device peak {torch.cuda.max_memory_allocated(placement.device) / 2**30:.2f} GiB"
    print(f"wrote {args.out} ({args.method}, {args.local_group}, {args.sparsity}) on {placement.label} "
          f"in {done - start:.1f}s ({(done - opened) / blocks:.2f}s per block, opened in {opened - start:.1f}s"
          f"{device_peak})")


def strategy_from_args(args):
    """The server strategy ``--strategy`` names, with the settings given on the command line
    (each must be one of that strategy's :attr:`~fedlib.server.strategy.Strategy.options`:
    ``--rounds`` means nothing to FedPrLLM)."""
    from fedlib.server import STRATEGIES

    own = {option.field for option in STRATEGY_OPTIONS[args.strategy]}
    settings = {"group": args.server_group, "sparsity": args.sparsity, "seed": args.seed}
    for option in {option.field: option for options in STRATEGY_OPTIONS.values() for option in options}.values():
        value = getattr(args, option.field, None)
        if value is None:
            continue
        if option.field not in own:
            raise ValueError(f"--{option.flag or option.field} is not an option of the {args.strategy} strategy")
        settings[option.field] = tuple(value) if option.many else value
    return STRATEGIES[args.strategy](**settings)


def add_strategy_arguments(p, aggregation: bool) -> None:
    """``--strategy`` (:data:`fedlib.strategy_options.STRATEGY_OPTIONS`: the registered
    strategies' settings, torch-free), the settings every strategy has, and each strategy's own options
    (``aggregation``: also those that change only the aggregation)."""
    p.add_argument("--strategy", default="fedprllm", choices=sorted(STRATEGY_OPTIONS), help="server strategy")
    add_group_argument(p, "server", "layer", "--group")
    p.add_argument("--sparsity", type=float, default=0.5, help="the fraction of each layer's weights pruned")
    p.add_argument("--seed", type=int, default=0, help="the seed of the tie-breaks between equal votes")
    for name, options in STRATEGY_OPTIONS.items():
        for option in options:
            if aggregation or not option.aggregation_only:
                kind = old_values(dict(option.old_values), option.type or str) if option.old_values else option.type
                renamed(p, f"--{option.flag or option.field}", *option.old, dest=option.field, type=kind,
                        choices=option.choices, nargs="+" if option.many else None, help=f"{name}: {option.help}")


def cmd_configure(args) -> None:
    from fedlib.models import open_model

    strategy = strategy_from_args(args)
    n_blocks = open_model(args.model, weights=False).n_blocks
    plan = strategy.configure_round(args.round, args.n_clients, n_blocks)
    payload = {"strategy": strategy.name, "n_rounds": strategy.n_rounds(n_blocks), **plan.as_dict()}
    if args.out:
        _write_json(Path(args.out), payload)
    print(json.dumps(payload))


def cmd_aggregate(args) -> None:
    from fedlib.models import open_model

    strategy = strategy_from_args(args)
    handle = open_model(args.model, weights=False)  # only its fingerprint and layer list: nothing is read
    options = {}
    if args.previous_global is not None:
        options["previous"] = Path(args.previous_global)
    if args.round is not None:
        options["round_index"] = args.round
    cohort = {name: getattr(args, f"client_{name}") for name in ("method", "group", "sparsity")}
    options["cohort"] = {name: value for name, value in cohort.items() if value is not None}
    if strategy.send == "mask":  # decodes version 2 uploads; reads the model's weights only for those
        from fedlib.maskcode import MagnitudeReference

        options["reference"] = MagnitudeReference.of_model(handle)
    summary = strategy.aggregate([Path(p) for p in args.masks], handle.fingerprint(), handle.layers(),
                                 Path(args.out), **options)
    report = summary.pop("clients")
    if report is not None:  # written only once the global file is
        _write_json(aggregation_report_path(args), {"global": args.out, "strategy": strategy.name, **report})
        summary["flagged"] = [c["client_id"] for c in report["clients"] if c["flagged"]]
    print(f"wrote {args.out}: {summary}")


def aggregation_report_path(args) -> Path:
    """``--report``, by default the global file's name with ``.clients.json`` for ``.safetensors``."""
    if args.report:
        return Path(args.report)
    out = Path(args.out)
    return out.with_name(out.name.removesuffix(".safetensors") + ".clients.json")


def cmd_client_weights(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.uploads import write_client_weights

    start = time.perf_counter()
    handle, placement = open_placed(args)
    blocks = write_client_weights(
        handle, load_tokens(Path(args.calib))[0], Path(args.out), pruning_from_args(args, placement),
        blocks=args.blocks, client_id=args.client_id, round_index=args.round, weight_dtype=args.weight_dtype,
        global_weights=Path(args.previous_global) if args.previous_global else None)
    print(f"wrote {args.out}: blocks {blocks}, round {args.round}, in {time.perf_counter() - start:.1f}s")


def cmd_iterative(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.federation import iterative_prune
    from fedlib.maskfile import MaskWriter
    from fedlib.methods import method_allocation
    from fedlib.server.fedprllm import FedPrLLM

    start = time.perf_counter()
    handle, placement = open_placed(args)
    clients = [load_tokens(Path(p))[0] for p in args.calib]
    with MaskWriter(
        Path(args.out), handle.layers(), fingerprint=handle.fingerprint(), role="global", client_id="server",
        method=FedPrLLM(mode="iterative").global_method(args.method), group=args.server_group, sparsity=args.sparsity,
        allocation=method_allocation(args.method), n_samples=sum(c.shape[0] for c in clients),
        seed=args.seed, n_clients=len(clients), votes=True,
    ) as writer:
        def write_round(_record, global_masks, votes):
            for name, mask in global_masks.items():
                writer.add(name, mask, votes[name])

        result = iterative_prune(handle, clients, pruning_from_args(args, placement),
                                 args.server_group, scale=args.scale, keep=False, on_round=write_round)
    _write_json(Path(args.record), {
        "n_clients": len(clients), "rounds": len(result.rounds), "scale": args.scale,
        "bytes_up": result.bytes_up, "bytes_down": result.bytes_down,
        "per_round": [{"round": r.round, "bytes_up": r.bytes_up, "bytes_down": r.bytes_down}
                      for r in result.rounds],
    })
    _print_round_times(result.rounds)
    print(f"wrote {args.out}: {len(result.rounds)} rounds, {result.bytes_up} bytes up, {result.bytes_down} down "
          f"in {time.perf_counter() - start:.1f}s")


def cmd_fedspallm(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.federation import fedspallm_prune
    from fedlib.server.fedspallm import FedSpaLLM
    from fedlib.weightfile import WeightFileWriter, write_weight_file

    standalone = list(args.standalone_out or [])
    if standalone and args.resources:
        raise ValueError("--standalone-out needs every client to prune every block (no --resources)")
    start = time.perf_counter()
    handle, placement = open_placed(args)
    layers, base = handle.layers(), handle.fingerprint()
    clients = [load_tokens(Path(p))[0] for p in args.calib]
    strategy = FedSpaLLM(group=args.server_group, sparsity=args.sparsity, seed=args.seed, rounds=args.rounds,
                         resources=tuple(args.resources) if args.resources else None,
                         weight_dtype=args.weight_dtype)
    with contextlib.ExitStack() as stack:
        # a client's uploads in round 0 of an all-blocks run are its Standalone model, streamed
        writers = [stack.enter_context(WeightFileWriter(
            Path(path), layers, fingerprint=base, role="client", client_id=str(client),
            method=strategy.method, group=args.server_group, sparsity=args.sparsity,
            n_samples=clients[client].shape[0], seed=args.seed, weight_dtype=args.weight_dtype))
            for client, path in enumerate(standalone)]

        def keep_standalone(round_index, client, _index, upload):
            if round_index == 0 and client < len(writers):
                for name, mask in upload.masks.items():
                    writers[client].add_layer(name, mask, upload.weights[name])

        options = json.loads(args.method_options) if args.method_options else None
        result = fedspallm_prune(handle, clients, strategy, batch_size=args.batch_size, method_options=options,
                                 placement=placement, on_upload=keep_standalone if writers else None)
    pruned = [info for info in layers if info.name in result.weights]
    write_weight_file(Path(args.out), result.masks, result.weights, pruned, fingerprint=base,
                      role="global", client_id="server", method="fedspallm", group=args.server_group,
                      sparsity=args.sparsity, n_samples=sum(c.shape[0] for c in clients), seed=args.seed,
                      n_clients=len(clients), weight_dtype=args.weight_dtype, votes=result.votes,
                      extra={"uncovered_blocks": json.dumps(result.uncovered)})
    _write_json(Path(args.record), {
        "n_clients": len(clients), "rounds": [
            {"round": r.round, "bytes_up": r.bytes_up, "bytes_down": r.bytes_down} for r in result.rounds],
        "uncovered_blocks": result.uncovered,
    })
    _print_round_times(result.rounds)
    print(f"wrote {args.out}: {len(pruned)} layers aggregated over {len(clients)} clients "
          f"in {time.perf_counter() - start:.1f}s")


def cmd_random_mask(args) -> None:
    from fedlib.maskfile import write_mask_file
    from fedlib.models import open_model
    from fedlib.baselines import random_masks

    handle = open_model(args.model, weights=False)  # fingerprint and layers only
    layers = handle.layers()
    write_mask_file(Path(args.out), random_masks(layers, args.sparsity, args.seed, args.server_group), layers,
                    fingerprint=handle.fingerprint(), role="global", client_id="random", method="random",
                    group=args.server_group, sparsity=args.sparsity, seed=args.seed)
    print(f"wrote {args.out}")


def cmd_eval_windows(args) -> None:
    from fedlib.data import C4_HELDOUT_NOTE, evaluation_windows, save_tokens
    from fedlib.models import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    data_dir = parse_data_dir(args.data_dir)
    c4_docs = tuple(args.c4_docs) if args.c4_docs else None
    windows, total = evaluation_windows(tokenizer, args.dataset, data_dir, args.seqlen,
                                        args.windows, c4_docs, args.split)
    note = C4_HELDOUT_NOTE if args.dataset == "c4" and data_dir is not None else ""
    # the split only when asked for: the evaluation split's files keep their bytes
    save_tokens(Path(args.out), windows, dataset=args.dataset, total_windows=total,
                c4_docs=args.c4_docs, note=note, data_dir=str(args.data_dir),
                **({"split": args.split} if args.split else {}))
    print(f"wrote {args.out}: {windows.shape[0]} of {total} windows of {args.seqlen} tokens")


def cmd_evaluate(args) -> None:
    from fedlib.data import load_tokens
    from fedlib.evaluate.perplexity import perplexities
    from fedlib.pruned import PrunedModel

    start = time.perf_counter()
    handle, placement = open_placed(args)
    variant = PrunedModel(handle, args.mask, args.scale, args.weights, device=placement.device)
    loaded = [load_tokens(Path(path)) for path in args.windows]
    rows, sparsity = perplexities(handle, [ids for ids, _ in loaded], args.batch_size, placement=placement,
                                  variant=variant.decision)
    results = {}
    for (ids, meta), row in zip(loaded, rows):
        row.update(total_windows=meta.get("total_windows"), seqlen=int(ids.shape[1]), note=meta.get("note", ""),
                   **({"split": meta["split"]} if "split" in meta else {}))
        results[meta["dataset"]] = row
        print(f"{args.label} {meta['dataset']}: ppl {row['ppl']:.3f} on {row['windows']} windows")
    _write_json(Path(args.out), {
        "label": args.label, "mask": args.mask, "model_fingerprint": handle.fingerprint(), "scale": bool(args.scale),
        "applied": variant.summary(), "measured_sparsity": sparsity, "perplexity": results,
        "device": str(placement.device), "dtype": args.dtype,
    })
    print(f"wrote {args.out} in {time.perf_counter() - start:.1f}s")


def cmd_export(args) -> None:
    from fedlib.models import open_model
    from fedlib.pruned import PrunedModel, export_checkpoint

    handle = open_model(args.model)
    record = export_checkpoint(handle, PrunedModel(handle, args.mask, args.scale), Path(args.out), args.model)
    print(f"wrote {args.out}: {record}")


def cmd_inspect(args) -> None:
    from fedlib.maskfile import read_header

    header = read_header(Path(args.mask))
    print(json.dumps({
        "role": header.role, "client_id": header.client_id, "method": header.method,
        "group": header.group, "sparsity": header.sparsity, "allocation": header.allocation,
        "n_samples": header.n_samples, "n_clients": header.n_clients, "seed": header.seed,
        "model_fingerprint": header.fingerprint, "layers": len(header.layers),
        "weights": header.total_weights, "pruned": header.total_pruned,
        "bits_per_weight": 8 * Path(args.mask).stat().st_size / header.total_weights,
    }, indent=2))


def cmd_report(args) -> None:
    from fedlib.report import write_spec_table

    write_spec_table(json.loads(args.spec), Path(args.out_md), Path(args.out_csv),
                     Path(args.out_html) if args.out_html else None)


def cmd_cost(args) -> None:
    from fedlib import cost

    outputs = (Path(args.out_md), Path(args.out_csv), Path(args.out_html) if args.out_html else None)
    context = json.loads(args.context)
    if args.model:  # the context line names the model's fingerprint, as the other tables do
        from fedlib.models import open_model

        context["model_fingerprint"] = open_model(args.model, weights=False).fingerprint()
    if args.table == "time":
        if not args.spec:
            raise ValueError("fedlib cost time: give --spec (JSON: columns, rows of benchmark files)")
        cost.write_time_table(json.loads(args.spec), context, *outputs)
    elif args.table == "transfer":
        if not (args.model and args.client_masks and args.global_file and args.record):
            raise ValueError("fedlib cost transfer: give --model, --client-masks, --global and --record")
        strategies = cost.fedprllm_transfer(Path(args.model), [Path(p) for p in args.client_masks],
                                            Path(args.global_file))
        if args.fedspallm:
            strategies.append(cost.fedspallm_transfer(Path(args.fedspallm)))
        cost.write_transfer_table(strategies, context, *outputs, record=Path(args.record))
    else:  # network: over the bytes a transfer run recorded
        if not args.record:
            raise ValueError("fedlib cost network: give --record (the JSON `fedlib cost transfer` wrote)")
        cost.write_network_table(json.loads(Path(args.record).read_text())["strategies"], context, *outputs)
    print(f"wrote {args.out_md}")


# --------------------------------------------------------------------------- parser

#: how ``fedlib --help`` groups the verbs
SITE, COORDINATOR, INTERNAL = ("site protocol (what a site runs on its own data)", "coordinator (the server)",
                               "workflow internals (simulations, data preparation, tables, audits)")

MODEL_HELP = "the public base model: a folder, an embedded alias (smollm2-135m, gemma3-270m) or a hub id"


def add_model_argument(p, help_text: str = MODEL_HELP) -> None:
    p.add_argument("--model", required=True, help=help_text)


def add_pruning_arguments(p, method: str, local_group: str) -> None:
    """What a verb that prunes locally reads (:func:`pruning_from_args`)."""
    add_method_argument(p, method)
    p.add_argument("--method-options", help='JSON of the method\'s options, e.g. \'{"lam": 0.08}\' for OWL')
    p.add_argument("--sparsity", type=float, default=0.5, help="the fraction of each layer's weights pruned")
    add_group_argument(p, "local", local_group, "--group")
    p.add_argument("--seed", type=int, default=0, help="the seed of the tie-breaks between equal scores")
    p.add_argument("--batch-size", type=int, default=8, help="calibration samples per forward pass")
    add_threads_argument(p)
    add_placement_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedlib", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Federated pruning of LLMs: each site runs `fedlib client-mask` on its own data and sends the "
                    "mask file;\nthe coordinator runs `fedlib aggregate` and `fedlib export`. The workflow calls the "
                    "same verbs.")
    parser.add_argument("--version", action="version", version=f"fedlib {__version__}")
    parser.add_argument("--debug", action="store_true", help="on an error, the traceback instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB", help=argparse.SUPPRESS)
    listing: dict[str, list[str]] = {SITE: [], COORDINATOR: [], INTERNAL: []}

    def verb(name, func, help_text, group=INTERNAL):
        p = verb_parser(sub.add_parser(name, description=help_text))
        p.set_defaults(func=func)
        listing[group].append(f"  {name:<18} {help_text}")
        return p

    # -- site protocol

    p = verb("calibration-pool", cmd_calibration_pool, "sample calibration token windows (seeded)", SITE)
    add_model_argument(p, "model folder (for its tokenizer)")
    p.add_argument("--dataset", default="c4", choices=["c4", "wikitext2", "ptb", "mix"],
                   help="mix: --nsamples windows from each of WikiText-2, C4 and PTB (the non-IID pool)")
    p.add_argument("--data-dir", default=None, help="offline mirror folder (auto: ../shared/data, else resources/data); omit for the hub")
    p.add_argument("--nsamples", type=int, required=True, help="windows to draw")
    p.add_argument("--seqlen", type=int, required=True, help="tokens per window")
    p.add_argument("--seed", type=int, default=0, help="the draw's seed")
    add_c4_docs_argument(p, "C4 documents to draw from (default: all)")
    p.add_argument("--unit", choices=["document", "span"],
                   help="cut the windows for a DP release (fedlib.dp.unit): disjoint, at most --windows-per-unit "
                        "per document (C4, WikiText-2 articles) or span (PTB); default: random offsets, with "
                        "replacement (Wanda's sampling; refused by a DP release)")
    p.add_argument("--windows-per-unit", type=int, default=1, help="k: the most windows one unit contributes")
    p.add_argument("--out", required=True, help="the token file to write")

    p = verb("client-mask", cmd_client_mask, "compute this client's pruning mask file on its private data", SITE)
    add_model_argument(p)
    p.add_argument("--calib", nargs="+", type=input_file, help="token file(s) of this client's calibration samples "
                   "(several: their union, e.g. public + private text); needed by every method but magnitude")
    add_pruning_arguments(p, method="wanda", local_group="row")
    p.add_argument("--client-id", default="0", type=client_id_argument, help="this client's name in its mask file")
    p.add_argument("--round", type=int,
                   help="iterative FedPrLLM: mask only this block, its input through the global masks of the "
                        "blocks before it (--previous-global); default: every block (one-shot)")
    add_previous_global_argument(p, "iterative FedPrLLM: the server's global file of rounds 0..round-1",
                                 "--global-masks")
    p.add_argument("--scale", action="store_true",
                   help="iterative FedPrLLM: the federation scales weights, so continue from the scaled blocks")
    p.add_argument("--format-version", type=int, default=1, choices=[1, 2],
                   help="mask file format: 1 = packed bits; 2 = coded against the public model's weight "
                        "magnitudes (smaller; measured sizes: docs/reference/mask-format.md)")
    add_dp_arguments(p)
    p.add_argument("--out", required=True, help="the mask file to write (what the site sends)")

    p = verb("client-weights", cmd_client_weights,
             "FedSpaLLM client: prune the blocks the server assigned, upload weights and masks", SITE)
    add_model_argument(p)
    p.add_argument("--calib", required=True, type=input_file, help="token file of this client's calibration samples")
    p.add_argument("--blocks", type=int, nargs="+", required=True, help="decoder blocks assigned this round")
    add_previous_global_argument(p, "the server's current global weight file (none in round 0)", "--global-weights")
    p.add_argument("--round", type=int, default=0, help="the round this upload belongs to")
    add_pruning_arguments(p, method="sparsegpt_update", local_group="layer")
    p.add_argument("--client-id", default="0", type=client_id_argument,
                   help="this client's name in its weight file")
    p.add_argument("--weight-dtype", default="float16", choices=["float16", "float32"], help="dtype of the uploaded weights")
    p.add_argument("--out", required=True, help="the weight file to write (what the site sends)")

    p = verb("inspect", cmd_inspect, "print a mask file's header (checked)", SITE)
    p.add_argument("mask", type=input_file, help="a client or global mask file")

    # -- coordinator

    p = verb("configure", cmd_configure,
             "server: what each client prunes and sends in a round (JSON: blocks per client)", COORDINATOR)
    add_model_argument(p, "model folder (only its number of blocks is read)")
    add_strategy_arguments(p, aggregation=False)
    renamed(p, "--n-clients", "--clients", type=int, required=True, help="clients in the federation")
    p.add_argument("--round", type=int, default=0, help="the round to plan")
    p.add_argument("--out", help="also write the plan here")

    p = verb("aggregate", cmd_aggregate,
             "server: aggregate one round's client files (fedprllm: mask files; fedspallm: weight files)", COORDINATOR)
    add_model_argument(p)
    add_strategy_arguments(p, aggregation=True)
    p.add_argument("--report", help="the outlier report (JSON: per client its distance to the consensus, "
                                    "robust z-score, flagged, used); default: OUT with .clients.json "
                                    "for .safetensors")
    add_previous_global_argument(p, "the global file of the earlier rounds (fedspallm: its weight file, for layers "
                                    "no upload covers; fedprllm iterative: the masks of blocks < round)", "--previous")
    p.add_argument("--round", type=int,
                   help="the round aggregated (fedspallm: every upload must say it; fedprllm iterative: the block)")
    p.add_argument("--client-method", choices=METHODS, help="the clients' local method: every file must say it "
                                                            "(default: the majority of the files defines the cohort)")
    p.add_argument("--client-group", type=comparison_group,
                   help="the clients' local comparison group (as --client-method)")
    p.add_argument("--client-sparsity", type=float, help="the clients' target sparsity (as --client-method)")
    p.add_argument("--out", required=True, help="the global file to write")
    p.add_argument("masks", nargs="+", type=input_file, help="the clients' files")

    p = verb("export", cmd_export, "write a normal Hugging Face checkpoint with the mask applied", COORDINATOR)
    add_model_argument(p)
    p.add_argument("--mask", required=True, type=input_file, help="the global mask file to apply")
    p.add_argument("--scale", action="store_true", help="scale survivors by (m - votes)/m")
    p.add_argument("--out", required=True, help="the checkpoint folder to write")

    p = verb("evaluate", cmd_evaluate, "perplexity of the base model, optionally with a mask applied", COORDINATOR)
    add_model_argument(p)
    p.add_argument("--mask", type=input_file, help="a client or global mask file to apply")
    p.add_argument("--scale", action="store_true", help="scale survivors by (m - votes)/m")
    p.add_argument("--weights", type=input_file,
                   help="a FedSpaLLM weight file (global or a client's) to load instead of a mask")
    p.add_argument("--windows", nargs="+", required=True, type=input_file, help="token files from eval-windows")
    p.add_argument("--label", default="model", help="the variant's name in the result")
    p.add_argument("--batch-size", type=int, default=1, help="windows per forward pass")
    add_threads_argument(p)
    add_placement_arguments(p)
    p.add_argument("--out", required=True, help="the JSON result to write")

    from fedlib.evaluate import zeroshot_cli

    p = verb("zeroshot", zeroshot_cli.run, zeroshot_cli.HELP, COORDINATOR)
    zeroshot_cli.add_arguments(p)

    # -- workflow internals

    p = verb("materialize-model", cmd_materialize_model,
             "convert a model (e.g. an embedded alias: smollm2-135m, gemma3-270m) to a float32 safetensors folder")
    add_model_argument(p)
    p.add_argument("--out", required=True, help="the folder to write")

    p = verb("client-data", cmd_client_data, "one client's share of a calibration pool")
    p.add_argument("--pool", required=True, type=input_file, help="the pool's token file (calibration-pool)")
    p.add_argument("--n-clients", type=int, required=True, help="clients the pool is split between")
    p.add_argument("--client", type=int, required=True, help="which client's share (0 .. n-clients - 1)")
    p.add_argument("--partition", default="iid", help="iid, or dir<alpha> (Dirichlet over a mixture pool's sources)")
    p.add_argument("--seed", type=int, default=0, help="the split's seed")
    p.add_argument("--out", required=True, help="the client's token file to write")

    p = verb("iterative", cmd_iterative,
             "simulate iterative FedPrLLM (one round per decoder block) over client token files")
    add_model_argument(p)
    p.add_argument("--calib", nargs="+", required=True, type=input_file, help="one token file per client")
    add_pruning_arguments(p, method="wanda", local_group="row")
    add_group_argument(p, "server", "layer")
    p.add_argument("--scale", action="store_true", help="clients continue from the scaled global block")
    p.add_argument("--out", required=True, help="global mask file (with vote counts)")
    p.add_argument("--record", required=True, help="JSON: bytes per round (seconds go to stdout)")

    p = verb("fedspallm", cmd_fedspallm,
             "simulate FedSpaLLM (SparseGPT clients, l0 aggregation, mask expansion, layer sampling)")
    add_model_argument(p)
    p.add_argument("--calib", nargs="+", required=True, type=input_file, help="one token file per client")
    p.add_argument("--sparsity", type=float, default=0.5, help="the fraction of each layer's weights pruned")
    add_group_argument(p, "server", "layer", "--group")
    p.add_argument("--rounds", type=int, default=1, help="number of rounds T")
    p.add_argument("--resources", type=float, nargs="*", help="per client: fraction of blocks per round "
                                                              "(default: every block)")
    p.add_argument("--weight-dtype", default="float16", choices=["float16", "float32"], help="dtype of the uploads")
    p.add_argument("--method-options", help="JSON of the clients' method options (as client-mask)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the tie-breaks and the layer sampling")
    p.add_argument("--batch-size", type=int, default=8, help="calibration samples per forward pass")
    add_threads_argument(p)
    add_placement_arguments(p)
    p.add_argument("--standalone-out", nargs="*", help="weight files for the first clients' own models")
    p.add_argument("--out", required=True, help="global weight file")
    p.add_argument("--record", required=True, help="JSON: bytes per round (seconds go to stdout)")

    p = verb("random-mask", cmd_random_mask, "a random global mask at the target sparsity (baseline)")
    add_model_argument(p)
    p.add_argument("--sparsity", type=float, default=0.5, help="the fraction of each layer's weights pruned")
    add_group_argument(p, "server", "layer", "--group")
    p.add_argument("--seed", type=int, default=0, help="the mask's seed")
    p.add_argument("--out", required=True, help="the mask file to write")

    p = verb("eval-windows", cmd_eval_windows, "tokenize an evaluation set into non-overlapping windows")
    add_model_argument(p, "model folder (for its tokenizer)")
    p.add_argument("--dataset", required=True, choices=["wikitext2", "c4", "ptb"], help="the evaluation set")
    p.add_argument("--data-dir", default=None, help="offline mirror folder (auto: ../shared/data, else resources/data); omit for the hub")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per window")
    p.add_argument("--windows", type=int, default=None, help="evenly spaced subset; all when omitted")
    p.add_argument("--split", choices=["validation"], default=None,
                   help="another split than the dataset's evaluation split (ptb, wikitext2): validation, to "
                        "choose settings apart from the test windows")
    add_c4_docs_argument(p, "C4 validation documents to tokenize (default: all)")
    p.add_argument("--out", required=True, help="the token file to write")

    from fedlib import privacy_cli

    p = verb("privacy", privacy_cli.run, privacy_cli.HELP)
    privacy_cli.add_arguments(p)

    p = verb("report", cmd_report,
             "write a table (Markdown + CSV, optionally HTML) from perplexity or zero-shot results")
    p.add_argument("--spec", required=True,
                   help="JSON: title, context, columns, rows -> result files, measure (perplexity|zeroshot)")
    p.add_argument("--out-md", required=True, help="the Markdown table to write")
    p.add_argument("--out-csv", required=True, help="the CSV table to write")
    p.add_argument("--out-html", help="also a self-contained HTML page of the table")

    p = verb("cost", cmd_cost,
             "cost tables: transfer (bytes per client from real files), network (time under network profiles "
             "and stragglers, over those bytes), time (client/server seconds and peak memory from benchmark files)")
    p.add_argument("table", choices=["transfer", "network", "time"], help="which table")
    p.add_argument("--model", help="the model folder (transfer: its layers; all: its fingerprint in the header)")
    renamed(p, "--client-masks", "--clients", nargs="+", help="transfer: the one-shot client mask files")
    p.add_argument("--global", dest="global_file", help="transfer: a one-shot global mask file (with votes)")
    p.add_argument("--fedspallm", help="transfer: also FedSpaLLM, from its rounds.json")
    p.add_argument("--record", help="transfer: JSON of the measured bytes it writes; network: the one it reads")
    p.add_argument("--spec", help="time: JSON with columns, rows (cells, client and server benchmark files)")
    p.add_argument("--context", required=True,
                   help="JSON: the tables' context (model, config, config_hash, seed, lines)")
    p.add_argument("--out-md", required=True, help="the Markdown table to write")
    p.add_argument("--out-csv", required=True, help="the CSV table to write")
    p.add_argument("--out-html", help="also a self-contained HTML page of the table")

    from fedlib import plots

    p = verb("plot", plots.run, plots.HELP)
    plots.add_arguments(p)

    from fedlib import datafetch

    p = verb("data", datafetch.run, datafetch.HELP)
    datafetch.add_arguments(p)

    parser.epilog = "\n\n".join(f"{group}:\n" + "\n".join(lines) for group, lines in listing.items() if lines)
    parser.epilog += "\n\nfedlib VERB --help: the verb's options"
    return parser


#: verbs that walk a whole model block by block (or a file layer by layer) a few times: they
#: report each step (fedlib.progress); the other privacy verbs run such walks by the hundred and do not
PROGRESS_VERBS = ("client-mask", "client-weights", "iterative", "fedspallm", "aggregate", "evaluate",
                  "privacy dp-federation", "privacy dp-headroom")

#: failures that come from what the user gave (files, values): exit status 2, as argparse's
INPUT_ERRORS = ("MaskFileError", "DataError", "FileNotFoundError", "ValueError")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from fedlib import progress

    verb = f"privacy {args.analysis}" if args.command == "privacy" else args.command
    try:
        with progress.reporting(verb) if verb in PROGRESS_VERBS else contextlib.nullcontext():
            args.func(args)
    except Exception as err:  # one line per failure; --debug for the traceback
        if args.debug:
            raise
        kind = type(err).__name__
        known = any(cls.__name__ in INPUT_ERRORS for cls in type(err).__mro__)
        print(f"fedlib {args.command}: error: {err if known else f'{kind}: {err}'}", file=sys.stderr)
        return 2 if known else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
