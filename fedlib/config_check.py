"""The workflow configuration checked as a whole before any job runs (``snakemake -n`` included).

fedlib/schemas/config.schema.yaml checks each key on its own (types, ranges, names from the
registries); :func:`validate_config` checks what a schema cannot: values against each other
(clients against calibration samples, one study's pool against its clients, held-out C4
documents against calibration's), against the files they name (the data mirror, the model
folder, the Hugging Face cache when offline) and against the model (sequence lengths within
its context, N:M groups that fit its layers). Every target the configuration defines is
checked, the named studies with their schema defaults, because any of them may be asked for.

It raises one :class:`ConfigError` listing every problem, one line each naming the key (dotted
path), its value and what is allowed: a dry run costs seconds, so a user fixes all at once.
A check whose basis is itself wrong is skipped (no sequence-length check without the model's
config, no document range check without the C4 file).

Cheap by design: no model weights are read, only config.json or the GGUF header of an
embedded model; torch is imported only when pruning.method_options are given (the methods'
constructors judge their options) or a method is combined with an N:M local group.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from fedlib.catalog import Catalog, PrivacyCatalog
from fedlib.catalog.privacy import sizes
from fedlib.embedded import EMBEDDED
from fedlib.evaluate.zeroshot import task_file
from fedlib.mirror import CALIBRATION_SPLIT, EVALUATION_SPLIT, MIXTURE_DATASETS, mirror_path, resolve_data_dir

SCHEMA = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"  # package data
UNSTRUCTURED = ("layer", "row", "column")
NM = re.compile(r"([1-9][0-9]*):([1-9][0-9]*)")
GROUPS_ALLOWED = "layer, row, column or N:M with 0 < N < M (e.g. 2:4)"


class ConfigError(ValueError):
    """The configuration cannot run; the message lists every problem, one per line."""


class _Problems(list):
    def add(self, key: str, value, expected: str, why: str = "") -> None:
        line = f"{key} = {_show(value)}: expected {expected}" + (f" ({why})" if why else "")
        if line not in self:
            self.append(line)


def _show(value) -> str:
    return json.dumps(value, default=str)


def materialized_dir(name: str) -> str:
    """Where the workflow materializes an embedded alias or hub id (relative to its working
    directory): rule materialize_model writes it, and model jobs load it from there."""
    return f"resources/models/{'--'.join(name.split('/'))}"


def validate_config(config: Mapping, workdir: Path) -> None:
    """Raise :class:`ConfigError` unless every target of ``config`` (validated against the
    schema, its defaults filled in) can run from ``workdir``, the workflow's working directory
    (relative paths in the config are relative to it). ``config`` is not changed."""
    cfg = with_schema_defaults(config)
    workdir = Path(workdir)
    try:
        cfg["data_dir"] = resolve_data_dir(cfg["data_dir"], workdir)
    except FileNotFoundError as err:  # no data at all: the one thing to fix first
        raise ConfigError(f"invalid configuration; nothing was run:\n  - {err}") from None
    problems = _Problems()
    _check_clients(cfg, problems)
    _check_groups(cfg, problems)
    _check_methods(cfg, problems)
    _check_server(cfg, problems)
    _check_data(cfg, workdir, problems)
    model = _model_config(cfg["model"]["name"], workdir, problems)
    if model is not None:
        _check_model_sizes(cfg, model, problems)
    _check_privacy(cfg, problems)
    _check_domain(cfg, workdir, problems)
    if problems:
        raise ConfigError(f"invalid configuration, {len(problems)} problem(s); nothing was run:\n"
                          + "\n".join(f"  - {p}" for p in problems))


def with_schema_defaults(config: Mapping) -> dict:
    """A copy of ``config`` with the schema's defaults filled in, absent optional sections
    included: Snakemake fills only the sections a config has, the workflow's catalogue
    (fedlib.catalog) falls back to the same values for the rest (tests/test_config_check.py)."""
    schema = yaml.safe_load(SCHEMA.read_text())
    filled = copy.deepcopy(dict(config))
    _fill(filled, schema)
    return filled


def _fill(instance: dict, schema: Mapping) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in instance:
            if "default" in sub:
                instance[key] = copy.deepcopy(sub["default"])
            elif sub.get("type") == "object" and not sub.get("required"):
                instance[key] = {}
        if isinstance(instance.get(key), dict):
            _fill(instance[key], sub)


# -- clients and the pools they split ------------------------------------------------------------


def _check_clients(cfg: dict, problems: _Problems) -> None:
    nsamples = cfg["calibration"]["nsamples"]
    n = cfg["clients"]["n"]
    studies = cfg["studies"]
    if n > nsamples:
        problems.add("clients.n", n, f"at most calibration.nsamples = {nsamples}",
                     "every client needs at least one calibration sample")
    local_only = cfg["baselines"]["local_only_clients"]
    if local_only > n:
        problems.add("baselines.local_only_clients", local_only, f"at most clients.n = {n}",
                     "Local-only evaluates that many clients' own masks")
    sweep = studies["clients_sweep"]
    if sweep and min(sweep) > nsamples:
        problems.add("studies.clients_sweep", sweep, f"at least one value <= calibration.nsamples = {nsamples}",
                     "figure2 leaves out larger client counts and would have no rows")
    noniid = studies["noniid"]
    pool = len(MIXTURE_DATASETS) * noniid["per_dataset"]
    if noniid["clients"] > pool:
        problems.add("studies.noniid.clients", noniid["clients"],
                     f"at most {len(MIXTURE_DATASETS)} x studies.noniid.per_dataset = {pool}",
                     "the non-IID pool has that many samples and every client needs one")
    fedspallm = studies["fedspallm"]
    clients = fedspallm["clients"]
    if fedspallm["samples_per_client"] is None:
        too_many = [c for c in clients if c > nsamples]
        if too_many:
            problems.add("studies.fedspallm.clients", clients, f"each at most calibration.nsamples = {nsamples}",
                         "samples_per_client is null: the calibration pool is split over the clients")
    standalone = fedspallm["standalone_clients"]
    if fedspallm.get("resources") is None and clients and standalone > min(clients):
        problems.add("studies.fedspallm.standalone_clients", standalone,
                     f"at most the fewest studies.fedspallm.clients = {min(clients)}",
                     "each Standalone model is one client's own")


# -- comparison groups and methods ---------------------------------------------------------------


def _nm(group: str) -> tuple[int, int] | None:
    match = NM.fullmatch(group)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _groups(cfg: dict) -> list[tuple[str, str]]:
    """(key, group) of every comparison group the config names that may be N:M."""
    return [("pruning.local_group", cfg["pruning"]["local_group"])] + [
        (f"server.groups[{i}]", g) for i, g in enumerate(cfg["server"]["groups"])]


def _check_groups(cfg: dict, problems: _Problems) -> None:
    for key, group in _groups(cfg):
        nm = _nm(group)
        if group not in UNSTRUCTURED and (nm is None or not nm[0] < nm[1]):
            problems.add(key, group, GROUPS_ALLOWED)


def _check_server(cfg: dict, problems: _Problems) -> None:
    """A robust server screens the clients of one round: FedPrLLM one-shot only."""
    robust, schedules = cfg["server"].get("robust"), cfg["server"]["schedules"]
    if robust is not None and "iterative" in schedules:
        problems.add("server.robust", robust, "null with iterative in server.schedules",
                     "each round of iterative FedPrLLM would exclude its own clients")


def _check_methods(cfg: dict, problems: _Problems) -> None:
    """Method names are the schema's (an enum kept equal to fedlib.methods.METHODS by a test);
    here: options the method's constructor accepts, and N:M local groups only for methods
    that prune every layer at the same sparsity."""
    options = cfg["pruning"].get("method_options") or {}
    local = cfg["pruning"]["local_group"]
    nm = _nm(local)
    nm_local = nm is not None and nm[0] < nm[1]
    if not options and not nm_local:
        return
    import inspect

    import torch

    from fedlib.methods import METHODS

    for name, given in options.items():
        cls = METHODS[name]
        try:
            cls(torch.nn.Linear(8, 8), "config-check", **given)
        except (TypeError, ValueError) as err:
            params = list(inspect.signature(cls.__init__).parameters.values())[3:]
            named = [p.name for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD]
            accepted = ", ".join(named) or "none"
            if any(p.kind is p.VAR_KEYWORD for p in params):
                accepted = "the options its documentation lists"
            problems.add(f"pruning.method_options.{name}", given, f"options {name} accepts: {accepted}", str(err))
    if nm_local:
        for key, method in [("pruning.method", cfg["pruning"]["method"])] + [
                (f"studies.methods[{i}]", m) for i, m in enumerate(cfg["studies"]["methods"])]:
            if METHODS[method].allocation == "nonuniform":
                problems.add(key, method, f"a method that prunes every layer alike with pruning.local_group = {local}",
                             f"{method} allocates a sparsity per layer, which an N:M pattern fixes")


# -- the data mirror -------------------------------------------------------------------------------


def _check_data(cfg: dict, workdir: Path, problems: _Problems) -> None:
    data_dir = cfg["data_dir"]
    ranges = {key: cfg[section].get("c4_docs") for key, section in
              (("calibration.c4_docs", "calibration"), ("evaluation.c4_docs", "evaluation"))}
    for key, span in ranges.items():
        if span is not None and not span[0] < span[1]:
            problems.add(key, span, "[start, stop) with start < stop")
    if data_dir is None:
        return  # the Hugging Face hub: nothing local to check
    root = workdir / data_dir
    if not root.is_dir():
        problems.add("data_dir", data_dir, "a folder laid out like shared/data (relative to the working "
                     "directory; `make data` fetches one into resources/data), auto, or null for the Hugging Face "
                     "hub", f"{root} is not a folder")
        return
    needed: dict[Path, list[tuple[str, object]]] = {}  # file -> the (key, value) pairs that need it

    def need(path: Path, key: str, value) -> None:
        if key not in (k for k, _ in needed.setdefault(path, [])):
            needed[path].append((key, value))

    dataset = cfg["calibration"]["dataset"]
    need(mirror_path(root, dataset, CALIBRATION_SPLIT[dataset]), "calibration.dataset", dataset)
    for name in cfg["evaluation"]["datasets"]:
        need(mirror_path(root, name, EVALUATION_SPLIT[name]), "evaluation.datasets", name)
    for name in MIXTURE_DATASETS:  # the non-IID pool mixes them
        need(mirror_path(root, name, CALIBRATION_SPLIT[name]), "studies.noniid", name)
    for size, by_analysis in sizes(cfg).items():
        prior = by_analysis["inversion"]["prior_samples"]
        if prior:  # the attacker's prior: WikiText-2 calibration windows
            need(mirror_path(root, "wikitext2", CALIBRATION_SPLIT["wikitext2"]),
                 _privacy_key(cfg, size, "inversion", "prior_samples"), prior)
    for task in cfg["zeroshot"]["tasks"]:
        try:
            need(task_file(root, task), "zeroshot.tasks", task)
        except FileNotFoundError as err:
            problems.add("zeroshot.tasks", task, f"a data file {root / 'zeroshot' / task}.jsonl", str(err))
    for path, [(key, value), *others] in needed.items():
        also = "; also needed by " + ", ".join(k for k, _ in others) if others else ""
        if not path.is_file():
            problems.add(key, value, f"the data file {path} (data_dir = {data_dir})", f"it does not exist{also}")
        elif path.stat().st_size == 0:
            problems.add(key, value, f"a non-empty data file {path} (data_dir = {data_dir})", f"it is empty{also}")
    c4 = mirror_path(root, "c4", "train")
    if c4.is_file() and c4.stat().st_size:
        _check_c4_ranges(cfg, ranges, c4, problems)


def _check_c4_ranges(cfg: dict, ranges: dict, c4: Path, problems: _Problems) -> None:
    """Offline, C4 evaluation is held-out documents of the file calibration draws from: the
    ranges must fit the file and must not overlap (an overlap leaks calibration text into the
    evaluation). Calibration always draws from C4 here (the non-IID pool mixes it in)."""
    with c4.open("rb") as handle:
        count = sum(1 for _ in handle)
    valid = {}
    for key, span in ranges.items():
        if span is None or not span[0] < span[1]:
            continue
        if span[1] > count:
            problems.add(key, span, f"a range within the {count} documents of {c4}")
        else:
            valid[key] = span
    if "c4" not in cfg["evaluation"]["datasets"]:
        return
    calib, held_out = ranges["calibration.c4_docs"], ranges["evaluation.c4_docs"]
    if calib is None:
        problems.add("calibration.c4_docs", calib, "a [start, stop) range of C4 documents (data_dir is set and "
                     "evaluation.datasets has c4)", "null draws calibration samples from every document, the "
                     "held-out ones included")
    if held_out is None:
        problems.add("evaluation.c4_docs", held_out, "a [start, stop) range of held-out C4 documents (data_dir is "
                     "set and evaluation.datasets has c4)", "null evaluates on every document, calibration's included")
    if len(valid) == 2 and calib[0] < held_out[1] and held_out[0] < calib[1]:
        problems.add("evaluation.c4_docs", held_out, f"documents disjoint from calibration.c4_docs = {_show(calib)}",
                     "held-out documents: an overlap leaks calibration text into the evaluation")


def _overlap(a, b) -> tuple[int, int] | None:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def _check_domain(cfg: dict, workdir: Path, problems: _Problems) -> None:
    """The domain study's texts (target domain): the public text and the control clients' C4 text are
    disjoint ranges of C4 documents, and neither is an evaluation set (offline, C4 evaluation is
    evaluation.c4_docs of the same file; the other evaluation sets are test splits, which no
    calibration draws from). The membership game needs a population larger than a data set."""
    from fedlib.catalog.domain import settings

    d = settings(cfg)
    ranges = {"domain.public_docs": d["public_docs"], "domain.control_docs": d["control_docs"]}
    valid = {}
    for key, span in ranges.items():
        if not span[0] < span[1]:
            problems.add(key, span, "[start, stop) with start < stop")
        else:
            valid[key] = span
    evaluation = cfg["evaluation"].get("c4_docs")
    uses_c4_eval = "c4" in d["evaluation"]["guards"] or d["private"] == "c4"
    if cfg["data_dir"] is not None and uses_c4_eval and evaluation is None:
        problems.add("evaluation.c4_docs", evaluation, "a range of held-out C4 documents (domain.evaluation.guards has "
                     "c4)", "null evaluates on every document, the public text's included")
    for key, span in valid.items():
        if evaluation is not None and cfg["data_dir"] is not None and (shared := _overlap(span, evaluation)):
            problems.add(key, span, f"C4 documents disjoint from evaluation.c4_docs = {_show(evaluation)}",
                         f"C4 documents {shared[0]}–{shared[1] - 1} are the C4 evaluation documents")
    if len(valid) == 2 and (shared := _overlap(*valid.values())):
        problems.add("domain.control_docs", d["control_docs"],
                     f"C4 documents disjoint from domain.public_docs = {_show(d['public_docs'])}",
                     f"C4 documents {shared[0]}–{shared[1] - 1} would be both public and the control clients' private text")
    if cfg["data_dir"] is not None:
        c4 = mirror_path(workdir / cfg["data_dir"], "c4", "train")
        if c4.is_file():
            with c4.open("rb") as handle:
                count = sum(1 for _ in handle)
            for key, span in valid.items():
                if span[1] > count:
                    problems.add(key, span, f"a range within the {count} documents of {c4}")
    control = valid.get("domain.control_docs")
    wanted = d["clients"] * d["samples"]
    if control and d["control"]["sparsities"] and d["sampling"] == "disjoint" \
            and (control[1] - control[0]) * d["windows_per_unit"] < wanted:
        # necessary, not sufficient: a document shorter than a window gives none (the pool job counts those)
        problems.add("domain.control_docs", control, f"at least {wanted} documents / domain.windows_per_unit = "
                     f"{d['windows_per_unit']} (the control clients' {d['clients']} x {d['samples']} windows, at most "
                     "windows_per_unit from a document), or domain.control.sparsities: [] (no negative control)",
                     f"{control[1] - control[0]} documents give at most {(control[1] - control[0]) * d['windows_per_unit']}")
    extra = sorted(set(map(float, d["detail_sparsities"])) - set(map(float, d["sparsities"])))
    if extra:
        problems.add("domain.detail_sparsities", d["detail_sparsities"], f"a subset of domain.sparsities = {d['sparsities']}",
                     f"{extra} would have DP rows without the rows they are compared with")
    m = d["membership"]
    largest = d["samples"] * (d["clients"] if "distributed" in d["mechanisms"] else 1)
    if m["targets"] > m["population"]:
        problems.add("domain.membership.targets", m["targets"], f"at most domain.membership.population = "
                     f"{m['population']}", "the targets are the population's first rows")
    if largest >= m["population"]:
        problems.add("domain.membership.population", m["population"], f"more than {largest} (the largest audited "
                     "data set: domain.samples, times domain.clients for the distributed mechanism)")
    if d["mechanisms"] and d["sampling"] != "disjoint":
        problems.add("domain.sampling", d["sampling"], "disjoint (windows cut by document or span) while "
                     "domain.mechanisms has DP rows", "random offsets with replacement put a token in several windows "
                     "of one release: a sentence in m windows is protected at about m times the budget")
    if "distributed" in d["mechanisms"] and d["clients"] < 2:
        problems.add("domain.clients", d["clients"], "at least 2 (the distributed mechanism splits the noise over them)")


# -- the model -----------------------------------------------------------------------------------


def _model_config(name: str, workdir: Path, problems: _Problems) -> dict | None:
    """The model's config.json (or, for an embedded alias not yet materialized, the same sizes
    from its GGUF header); None when the model cannot be found (a problem) or its config is
    not at hand (a hub id not cached while online: it is downloaded by the first job)."""
    key, allowed = "model.name", (f"an embedded alias ({', '.join(EMBEDDED)}), a model folder with config.json "
                                  "(relative to the working directory) or a Hugging Face hub id (owner/name)")
    materialized = workdir / materialized_dir(name) / "config.json"
    if name in EMBEDDED:
        if materialized.is_file():
            return _read_json(materialized, key, name, allowed, problems)
        try:
            return EMBEDDED[name].config()
        except FileNotFoundError as err:
            problems.add(key, name, allowed, str(err))
            return None
    folder = workdir / name
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            problems.add(key, name, allowed, f"{folder} has no config.json")
            return None
        return _read_json(folder / "config.json", key, name, allowed, problems)
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        problems.add(key, name, allowed, f"no folder {folder}, and not a hub id")
        return None
    if materialized.is_file():
        return _read_json(materialized, key, name, allowed, problems)
    cached = try_to_load_from_cache(name, "config.json")
    weights = [try_to_load_from_cache(name, f) for f in ("model.safetensors", "model.safetensors.index.json")]
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ENV_VARS_TRUE_VALUES
    if offline and not (isinstance(cached, str) and any(isinstance(w, str) for w in weights)):
        problems.add(key, name, allowed, f"no folder {folder}, and HF_HUB_OFFLINE is set but the local Hugging "
                     "Face cache has no config.json and safetensors weights of this hub id")
        return None
    return _read_json(Path(cached), key, name, allowed, problems) if isinstance(cached, str) else None


def _read_json(path: Path, key: str, name: str, allowed: str, problems: _Problems) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        problems.add(key, name, allowed, f"{path} is not readable JSON ({err})")
        return None


def _check_model_sizes(cfg: dict, model: dict, problems: _Problems) -> None:
    """Sequence lengths within the model's context; N:M groups whose M divides the input width
    of every linear of a decoder block (attention in and out, MLP in and out)."""
    name = cfg["model"]["name"]
    context = model.get("max_position_embeddings")
    if isinstance(context, int):
        lengths = [("calibration.seqlen", cfg["calibration"]["seqlen"]), ("evaluation.seqlen", cfg["evaluation"]["seqlen"])]
        for size, by_analysis in sizes(cfg).items():
            lengths.append((_privacy_key(cfg, size, "membership", "seqlen"), by_analysis["membership"]["seqlen"]))
            key = _privacy_key(cfg, size, "inversion", "tokens")
            lengths += [(key, t) for t in by_analysis["inversion"]["tokens"]]
        lengths += [("privacy.membership_scale.sizes", t) for _, t in sizes(cfg)["run"]["membership_scale"]["sizes"]]
        lengths += [("privacy.membership_shared.sizes.seqlen", sz["seqlen"])
                    for sz in sizes(cfg)["run"]["membership_shared"]["sizes"]]
        lengths.append(("privacy.attribute.seqlen", sizes(cfg)["run"]["attribute"]["seqlen"]))
        for key, length in lengths:
            if length > context:
                problems.add(key, length, f"at most {context} tokens, the context of {name} "
                             "(its max_position_embeddings)")
    try:
        heads = model["num_attention_heads"]
        widths = {model["hidden_size"], model["intermediate_size"],
                  heads * model.get("head_dim", model["hidden_size"] // heads)}
    except (KeyError, TypeError, ZeroDivisionError):
        return  # not the sizes of a supported decoder (loading the model says which)
    for key, group in _groups(cfg):
        nm = _nm(group)
        if nm is not None and nm[0] < nm[1] and any(w % nm[1] for w in widths):
            problems.add(key, group, f"an N:M group whose M divides the input width of every linear of {name} "
                         f"({', '.join(str(w) for w in sorted(widths))})")


# -- the privacy audit ---------------------------------------------------------------------------


def _privacy_key(cfg: dict, size: str, analysis: str, name: str) -> str:
    """The key a privacy size comes from: privacy.full.<analysis>.<name> when the full audit
    overrides it, else privacy.<analysis>.<name>."""
    full = ((cfg.get("privacy") or {}).get("full") or {}).get(analysis) or {}
    return f"privacy.full.{analysis}.{name}" if size == "full" and name in full else f"privacy.{analysis}.{name}"


def _check_membership_scale(sc: dict, problems: _Problems) -> None:
    """A game draws data sets of ``samples`` rows besides the target from the population."""
    population = f"privacy.membership_scale.population = {sc['population']}"
    if sc["targets"] > sc["population"]:
        problems.add("privacy.membership_scale.targets", sc["targets"], f"at most {population}",
                     "the targets are the population's first rows")
    for samples, seqlen in sc["sizes"]:
        if samples >= sc["population"]:
            problems.add("privacy.membership_scale.sizes", [samples, seqlen], f"samples less than {population}")


def _check_secagg(privacy, problems: _Problems) -> None:
    """The cohorts are filled from the pool; targets and the other clients' rows come from the
    membership analysis's population."""
    sa, population = privacy.secagg(), privacy.of("run", "membership")["population"]
    if sa["pool"] < max(sa["cohorts"]) - 1:
        problems.add("privacy.secagg.pool", sa["pool"], f"at least the largest cohort - 1 = {max(sa['cohorts']) - 1}",
                     "the other m - 1 clients of a cohort come from the pool")
    samples = privacy.membership_samples("run")
    if sa["targets"] + samples > population:
        problems.add("privacy.secagg.targets", sa["targets"],
                     f"at most privacy.membership.population - {samples} (a client's samples) = {population - samples}",
                     "the targets are the population's first rows, the clients' rows the others")


def _check_membership_shared(sh: dict, problems: _Problems) -> None:
    """Shadow data sets are partitions of the population into data sets (every row in as many)."""
    for size in sh["sizes"]:
        samples, population = size["samples"], size["population"]
        if samples >= population or population % samples:
            problems.add("privacy.membership_shared.sizes.population", population,
                         f"a multiple of samples ({samples}) above it", "shadow data sets partition the population")
        elif size["shadows"] % (population // samples):
            problems.add("privacy.membership_shared.sizes.shadows", size["shadows"],
                         f"a multiple of population / samples = {population // samples}",
                         "every population row is in as many shadow data sets")


def _check_attribute(cfg: dict, at: dict, problems: _Problems) -> None:
    """Each half of the windows without the property fills a data set; the domain differs from the
    calibration data it is told apart from."""
    if at["population"] < 2 * at["samples"] + 2:
        problems.add("privacy.attribute.population", at["population"],
                     f"at least 2 x privacy.attribute.samples + 2 = {2 * at['samples'] + 2}",
                     "the attacker's and the client's halves each fill a data set, and each term needs windows with it")
    if at["domain"] is not None and at["domain"] == cfg["calibration"]["dataset"]:
        problems.add("privacy.attribute.domain", at["domain"],
                     f"another dataset than calibration.dataset ({cfg['calibration']['dataset']}), or null")


def _check_inversion_client(cfg: dict, inv: dict, problems: _Problems) -> None:
    n = cfg["clients"]["n"]
    outside = [c for c in inv["clients"] or [] if c >= n]
    if outside:
        problems.add("privacy.inversion_client.clients", inv["clients"], f"clients of the default setting, 0..{n - 1}")


def _check_privacy(cfg: dict, problems: _Problems) -> None:
    """The audit runs on the default setting (part of rule all): client 0's neighbours take
    replacement samples from the other clients; the membership game draws data sets of the
    client's size from its population. The catalog's own checks (resources, defence datasets)
    are reported here too."""
    try:
        privacy = PrivacyCatalog(Catalog(cfg))
    except ValueError as err:
        problems.append(str(err))
        return
    nsamples, n = cfg["calibration"]["nsamples"], cfg["clients"]["n"]
    if n < 2:
        problems.add("clients.n", n, "at least 2 (the privacy audit, part of rule all, replaces client 0's "
                     "samples with other clients')")
    elif n <= nsamples:
        others = nsamples - math.ceil(nsamples / n)  # client 0 holds the largest share (an IID deal)
        for size, by_analysis in privacy.sizes.items():
            neighbours = by_analysis["sensitivity"]["neighbours"]
            if neighbours > others:
                problems.add(_privacy_key(cfg, size, "sensitivity", "neighbours"), neighbours,
                             f"at most {others}, the calibration samples of clients 1..{n - 1}")
    _check_membership_scale(privacy.scale(), problems)
    _check_membership_shared(privacy.shared(), problems)
    _check_attribute(cfg, privacy.attribute(), problems)
    _check_inversion_client(cfg, privacy.inversion_client(), problems)
    _check_secagg(privacy, problems)
    for size, by_analysis in privacy.sizes.items():
        eps = by_analysis["dp"]["epsilons"]
        if not all(math.isfinite(e) for e in eps) or len(set(eps)) != len(eps):
            problems.add(_privacy_key(cfg, size, "dp", "epsilons"), eps, "distinct finite ε (the table adds ∞, no DP)")
        m = by_analysis["membership"]
        samples = privacy.membership_samples(size)
        population = f"{_privacy_key(cfg, size, 'membership', 'population')} = {m['population']}"
        if m["targets"] > m["population"]:
            problems.add(_privacy_key(cfg, size, "membership", "targets"), m["targets"], f"at most {population}",
                         "the targets are the population's first rows")
        if samples >= m["population"]:  # a data set: the target plus samples - 1 other rows
            if m["samples"] is None:
                problems.add(_privacy_key(cfg, size, "membership", "population"), m["population"],
                             f"more than the client's {samples} samples (privacy.membership.samples = null: "
                             "calibration.nsamples / clients.n)")
            else:
                problems.add(_privacy_key(cfg, size, "membership", "samples"), samples, f"less than {population}")
