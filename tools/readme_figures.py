"""Figures in README.md and the docs come from result files, through this command, never by hand.

A generated block in a page (README.md, config/README.md, docs/**.md) sits between
``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->``; each NAME has its source files (a
benchmark's JSON, a report's CSV, the configuration schema, fedlib/maskfile.py) and a renderer
here. ``python tools/readme_figures.py`` rewrites every block whose source exists; ``--check``
only compares, and also flags a figure with a unit that a page's prose quotes outside its blocks
when none of the page's blocks holds it (the test suite runs it, so a committed figure cannot
drift from its committed source). The docs build dates each block with the commit that last
changed its sources (tools/mkdocs_hooks.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's fedlib (the privacy analyses' registry), as from tests

from fedlib.privacy_analyses import BUNDLED, TARGETS  # noqa: E402


def _machine(data: dict) -> str:
    m = data.get("machine", {})
    return f"{m.get('cpus', '?')} CPUs ({m.get('machine', '?')}), torch {m.get('torch', '?')}"


def _model_name(data: dict) -> str:
    """The model a benchmark ran, without the folder it was in on the measuring machine."""
    return Path(data["model"]).name


def precision(data: dict) -> str:
    """bfloat16 vs float32 client masks on the embedded model (benchmarks/bench_precision.py)."""
    cal, ev = data["calibration"], data["evaluation"]
    lines = [
        f"{_model_name(data)}, {cal['samples']} × {cal['seqlen']} {cal['dataset']} calibration tokens; perplexity on "
        f"{ev['windows']} {ev['dataset']} windows of {ev['seqlen']} tokens, evaluated in float32 so that only "
        f"the mask differs (dense: float32 {data['dense_ppl_float32']:.2f}, bfloat16 {data['dense_ppl_bfloat16']:.2f}). "
        f"Commit {data.get('commit', '?')}; {_machine(data)}.",
        "",
        "| method | group | sparsity | masks agree | weights that differ | ppl, float32 masks | ppl, bfloat16 masks | "
        "bfloat16 masks, bfloat16 evaluation | client time bf16 / fp32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["methods"]:
        lines.append(
            f"| {r['method']} | {r['group']} | {r['sparsity']:.0%} | {r['agreement']:.3%} | {r['differing_weights']:,} "
            f"| {r['ppl_float32_masks']:.2f} | {r['ppl_bfloat16_masks']:.2f} ({r['ppl_relative_difference']:+.2%}) "
            f"| {r['ppl_bfloat16_masks_bfloat16_eval']:.2f} | {r['seconds_bfloat16'] / r['seconds_float32']:.2f}× |")
    return "\n".join(lines)


def hessian_dtype(data: dict) -> str:
    """SparseGPT's Hessian and update in float32 vs float64 (benchmarks/bench_hessian_dtype.py)."""
    cal, ev = data["calibration"], data["evaluation"]
    lines = [
        f"{_model_name(data)}, {cal['samples']} × {cal['seqlen']} {cal['dataset']} calibration tokens; perplexity on "
        f"{ev['windows']} {ev['dataset']} windows of {ev['seqlen']} tokens, each model with its own run's mask and "
        f"updated weights (dense {data['dense_ppl']:.2f}). Commit {data.get('commit', '?')}; {_machine(data)}, "
        f"{data['threads']} thread(s).",
        "",
        "| method | group | sparsity | masks agree | weights that differ | ppl, float64 | ppl, float32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["methods"]:
        lines.append(
            f"| {r['method']} | {r['group']} | {r['sparsity']:.0%} | {r['agreement']:.3%} | {r['differing_weights']:,} "
            f"| {r['ppl_float64']:.2f} | {r['ppl_float32']:.2f} ({r['ppl_relative_difference']:+.2%}) |")
    return "\n".join(lines)


def scale(data: dict) -> str:
    """Client and server at the embedded model's and at LLaMA-2-7B's shape (benchmarks/bench_scale.py)."""
    load = data.get("load", {})
    lines = [
        f"Commit {data.get('commit', '?')} (jobsize estimates: {data.get('estimates_commit', data.get('commit', '?'))}); "
        f"{_machine(data)}; load average before/after "
        f"{load.get('loadavg_before', '?')} / {load.get('loadavg_after', '?')}. {data.get('note', '')[:1].upper()}{data.get('note', '')[1:]}.",
        "",
        "| model | params | stored | client dtype, threads | calibration | client peak RSS (estimate) "
        "| s per block | client | aggregate of (real) | aggregate peak RSS (estimate) | aggregate |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["records"]:
        agg = r["aggregate"]
        lines.append(
            f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['dtype']} | {r['compute_dtype']}, {r['threads']} "
            f"| {r['samples']} × {r['seqlen']} | {r['peak_rss_mib']:,.0f} MiB ({r['estimate_mib']:,}) "
            f"| {r['seconds_per_block']:.2f} s | {r['client_seconds']:,.0f} s "
            f"| {agg['n_clients']} ({agg['real_clients']}) | {agg['peak_rss_mib']:,.0f} MiB ({agg['estimate_mib']:,}) "
            f"| {agg['seconds']:,.0f} s |")
        for other in r.get("other_compute_dtypes", []):
            lines.append(f"| ↳ same model, {other['dtype']} client | | | {other['dtype']}, {other['threads']} | "
                         f"| {other['peak_rss_mib']:,.0f} MiB ({other['estimate_mib']:,}) | {other['seconds_per_block']:.2f} s "
                         f"| {other['seconds']:,.0f} s | | | |")
    runs = [(r, row) for r in data["records"] for row in [r, *r.get("other_compute_dtypes", [])]]
    over = [row for _, row in runs if row["peak_rss_mib"] > row["estimate_mib"]]
    over += [r["aggregate"] for r in data["records"] if r["aggregate"]["peak_rss_mib"] > r["aggregate"]["estimate_mib"]]
    big = [row["peak_rss_mib"] for r, row in runs if r.get("random_weights")]
    lines += ["", f"Goal ({data['goal']}): {'met' if big and max(big) <= 4096 else 'NOT met'} "
              f"(largest {max(big, default=0):,.0f} MiB). Every job within its jobsize estimate: "
              f"{'yes' if not over else f'NO ({len(over)} above)'}."]
    return "\n".join(lines)


def _provenance(data: dict) -> str:
    return f"Commit {data.get('commit', '?')}; {_machine(data)}."


def client_mask(data: dict) -> str:
    """Wanda client mask vs two dense passes (benchmarks/bench_client_mask.py)."""
    return (f"- Wanda client mask, {data['tokens']:,} calibration tokens, vs two dense passes through the blocks "
            f"(the floor of any layer-wise method): {data['wanda_median']:.1f} s vs {data['floor_median']:.1f} s, "
            f"**{data['wanda_over_floor']:.2f}×** (goal {data['goal']}; medians of {len(data['wanda_seconds'])} "
            f"interleaved repeats). {_provenance(data)}")


def server(data: dict) -> str:
    """Mask file size and aggregation cost vs clients (benchmarks/bench_server.py)."""
    rows = sorted(data["aggregate"].items(), key=lambda kv: int(kv[0]))
    (small, a), (large, b) = rows[0], rows[-1]
    return (f"- Mask file: **{data['mask_file_bits_per_weight']:.3f} bits per weight** "
            f"({data['weights']:,} weights). Server aggregation (`fedlib aggregate`, its own process), "
            f"{small} vs {large} clients: {a['seconds']:.0f} s / {a['peak_rss_mib']:,.0f} MiB vs "
            f"{b['seconds']:.0f} s / {b['peak_rss_mib']:,.0f} MiB: peak memory "
            f"**{data['peak_ratio_large_over_small']:.2f}×** for {int(large) // int(small)}× the clients. "
            f"{_provenance(data)}")


def secagg(data: dict) -> str:
    """Secure aggregation's overhead on the embedded model's shapes (benchmarks/bench_secagg.py)."""
    lines = [f"{data['model']}, {data['weights']:,} weights in {data['layers']} linears; {data['note']}. "
             f"{_provenance(data)}", "",
             "| clients n | k bits | client masking | server unmasking (one dropout) | plain vote counting "
             "| upload per client | vs packed mask |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['n_clients']} | {r['modulus_bits']} | {r['client_masking_seconds']:.1f} s "
              f"| {r['server_unmask_seconds']:.1f} s ({r['server_unmask_one_dropout_seconds']:.1f} s) "
              f"| {r['plain_vote_count_seconds']:.1f} s | {r['client_upload_bytes'] / 2**20:.1f} MiB "
              f"| {r['upload_vs_plain_packed']:.1f}× |" for r in data["records"]]
    return "\n".join(lines)


def flower(data: dict) -> str:
    """fedlib over Flower on localhost, embedded model, the default federation (benchmarks/bench_flower.py)."""
    mib = 2 ** 20
    lines = [f"{data['model']}, {data['clients']} sites x {data['samples_per_client']} x {data['seqlen']} C4 tokens, "
             f"{data['method']} {data['local_group']} {data['sparsity']:.0%}, server {data['mode']} "
             f"{data['server_group']}; at most {data['parallel']} sites computing at once, {data['threads_per_site']} "
             f"torch thread each; {data['note']}. {_provenance(data)}", "",
             "| uploads | rounds | s per round | payload down / up | Flower traffic in / out | coordinator peak "
             "| site ClientApp peak | SuperLink peak | SuperNode peak | global file equals |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['rounds']} | {r['seconds_per_round']:.0f} s "
              f"| {r['bytes_down'] / mib:.1f} / {r['bytes_up'] / mib:.1f} MiB "
              f"| {r['flower_inbound_bytes'] / mib:.1f} / {r['flower_outbound_bytes'] / mib:.1f} MiB "
              f"| {r['coordinator_peak_rss_mib']:,.0f} MiB | {r['client_peak_rss_mib']:,.0f} MiB "
              f"| {r['superlink_peak_rss_mib']:,.0f} MiB | {r['supernode_peak_rss_mib']:,.0f} MiB "
              f"| {r['same_bytes_as']} |" for r in data["records"]]
    grown = [r for r in data["records"] if "coordinator_replies_growth_in_uploads" in r]
    bound = [f"{r['variant']} "
             + (f"{r['coordinator_replies_growth_mib']:.0f} MiB, " if "coordinator_replies_growth_mib" in r else "")
             + f"{r['coordinator_replies_growth_in_uploads']:.1f} of its largest upload ({r['largest_upload_mib']:.1f} MiB)"
             for r in grown]
    if bound:
        chunks = {r.get("chunk_bytes") for r in grown}
        how = (f"each upload pulled in chunks of {chunks.pop() / mib:g} MiB" if None not in chunks and len(chunks) == 1
               else "each upload in one reply")
        lines += ["", f"- The coordinator's growth while it took the replies ({how}): " + "; ".join(bound)
                  + f". Goal, at most 2 uploads + a constant: {_growth_verdict(grown)}."]
    lost = [f"{r['variant']}: {', '.join(r['absent'])} ({'; '.join(r['refused'])})" for r in data["records"] if r.get("absent")]
    if lost:
        lines += ["- Sites that did not answer: " + "; ".join(lost) + "."]
    return "\n".join(lines)


def _growth_verdict(grown: list[dict]) -> str:
    """Met when the growth rises by at most 2 MiB per MiB of upload: the least-squares line through
    the rows' (largest upload, growth) when they have two upload sizes; with one, its growth against
    2 uploads and no constant (the strict reading)."""
    points = [(r["largest_upload_mib"], r["coordinator_replies_growth_mib"]) for r in grown
              if "coordinator_replies_growth_mib" in r]
    if len({x for x, _ in points}) < 2:
        return "; ".join(f"{'met' if r['coordinator_replies_growth_in_uploads'] <= 2 else 'not met'} for {r['variant']} "
                         "(one upload size: no constant measured)" for r in grown)
    mx, my = (sum(v) / len(points) for v in zip(*points))
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return (f"{'met' if slope <= 2 else 'not met'}, the growth is {my - slope * mx:.0f} MiB + {slope:.2f} × the upload "
            "(the line through the rows; the constant is what Flower holds to pull one chunk)")


def _status(goal: dict) -> str:
    """A benchmark goal's verdict: met, not met, or not measured (its ``met`` None)."""
    return "met" if goal["met"] else "not met" if goal["met"] is False else "not measured"


def gpu(data: dict, evaluate: dict) -> str:
    """Client masks and evaluation at the 7B shape on one GPU (benchmarks/bench_gpu.py), and
    `evaluate` against an earlier checkout on the same machine (benchmarks/bench_gpu_evaluate.py)."""
    def figure(value, unit=""):
        return "not measured" if value is None else f"{value:g}{unit}"

    lines = [f"{data['device']}, torch {data['torch']}, {data['shape']} shape in {data['compute_dtype']}, "
             f"client batch {data['batch_size']}; {data['note']}. Commit {data.get('commit', '?')}"
             + ("" if data.get("complete") else " (the run stopped at its time limit: the rows below are all it "
                                                 "measured)") + ".", "",
             "| run | s after the model is open | s per block | GPU busy | device peak | host peak |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {key} | {r['seconds_after_open']:.1f} | {r['seconds_per_block']:.2f} | {figure(r['busy_fraction'])} "
              f"| {figure(r['device_peak_gib'], ' GiB')} | {r['peak_rss_mib']:,.0f} MiB |"
              for key, r in data["runs"].items()]
    e, agree = data.get("evaluate"), data.get("block0_host_vs_device")
    if e:
        lines += ["", f"- `evaluate`, {e['windows']} × {e['seqlen']} windows with the Wanda 128 × 2048 mask: "
                      f"{e['seconds']:.1f} s for the process, GPU busy {figure(e['busy_fraction'])}."]
    if agree:
        lines += [f"- Block 0's masks from the same {agree['tokens']} tokens on the host and on the GPU "
                  f"({agree['dtype']}): {agree['differ']:,} of {agree['weights']:,} weights decided differently."]
    obs = data.get("obs_solve")
    if obs:
        layers = obs["layers"].values()
        lines += [f"- SparseGPT's OBS update of one block's linears ({obs['dtype']}, {obs['group']} groups at "
                  f"{obs['sparsity']:.0%}, random weights), side by side on the device: the reference's column loop "
                  f"{obs['seconds_per_block']['column']:.2f} s, batched triangular solves "
                  f"{obs['seconds_per_block']['block']:.2f} s (**{obs['speedup']:.2f}×**); "
                  f"{sum(r['masks_differ'] for r in layers)} mask entries differ, weights within "
                  f"{max(r['max_weight_difference'] for r in layers):.0e}."]
    lines += ["- Goals: " + "; ".join(f"{name} {figure(g['measured'])} (goal {g['goal']:g}: "
                                      f"{_status(g)})"
                                      for name, g in data["goals"].items()) + "."]
    rows = {side: [r for r in evaluate["rows"] if r["side"] == side] for side in ("baseline", "this")}
    base, this = rows["baseline"][0], rows["this"][0]
    lines += [f"- `evaluate` ({evaluate['windows']} windows, {evaluate['device']}), commit {evaluate.get('commit', '?')} "
              f"against {evaluate['baseline']} on the same machine: {base['seconds']:.1f} s → {this['seconds']:.1f} s "
              f"for the process (**{evaluate['baseline_over_this']:.2f}×**), {base['reported_seconds']:.1f} s → "
              f"{this['reported_seconds']:.1f} s as it reports itself, the same perplexity."]
    return "\n".join(lines)


def gpu_options(data: dict) -> str:
    """bench_gpu's rows of one run (``--name``), with its client batch size and SparseGPT options."""
    runs = "; ".join(f"{key} {r['seconds_after_open']:.1f} s after the model is open ({r['seconds_per_block']:.2f} s "
                     f"per block, GPU busy {r['busy_fraction']}, device peak {r['device_peak_gib']} GiB)"
                     for key, r in data["runs"].items())
    obs = data.get("obs_solve")
    return (f"- {data['device']}, torch {data['torch']}, commit {data.get('commit', '?')}, batch size "
            f"{data['batch_size']}, SparseGPT options `{json.dumps(data['sparsegpt_options'])}`: {runs}."
            + (f" OBS update of one block side by side there: column loop {obs['seconds_per_block']['column']:.2f} s, "
               f"batched solves {obs['seconds_per_block']['block']:.2f} s ({obs['speedup']:.2f}×)." if obs else ""))


#: what two bench_gpu runs side by side may differ in
GPU_SETTINGS = ("batch_size", "sparsegpt_options")


def gpu_side_by_side(base: dict, other: dict) -> str:
    """Two bench_gpu runs that differ in a setting, and the time ratio per run where they share a card."""
    lines = [gpu_options(base), gpu_options(other)]
    if (base["device"], base.get("commit")) != (other["device"], other.get("commit")):
        return "\n".join(lines + ["- Not side by side: different cards or commits, so no ratio."])
    differ = ", ".join(f"{k} {json.dumps(base[k])} over {json.dumps(other[k])}" for k in GPU_SETTINGS
                       if base[k] != other[k])
    ratios = "; ".join(f"{key} {r['seconds_after_open'] / other['runs'][key]['seconds_after_open']:.2f}×"
                       for key, r in base["runs"].items() if key in other["runs"])
    return "\n".join(lines + [f"- Same card and commit, {differ} (time after the model is open): {ratios}."])


def gpu_client_start(data: dict) -> str:
    """bench_gpu's Wanda rows of one run with the whole client process and the start-up floor under it."""
    runs = "; ".join(f"{key} {r['seconds']:.1f} s for the process, {r['seconds_to_open']:.1f} s of it to open the "
                     f"model, {r['seconds_after_open']:.1f} s after (GPU busy {r['busy_fraction']})"
                     for key, r in data["runs"].items())
    start = "; ".join(f"{step} {row['fastest']:.1f} s" for step, row in (data.get("startup") or {}).items())
    goals = "; ".join(f"{name} {g['measured']} (goal {g['goal']:g}: "
                      f"{_status(g)})"
                      for name, g in data["goals"].items() if g["measured"] is not None)
    return "\n".join([
        f"- {data['device']}, torch {data['torch']}, commit {data.get('commit', '?')}, batch size {data['batch_size']}: "
        f"{runs}.",
        f"- Processes that only start, each step adding to the one before (fastest of two): {start}.",
        f"- Goals: {goals}."])


def _profile_ms(table: str, operator: str) -> float:
    """The CUDA total of ``operator`` in a torch.profiler key_averages table, in ms."""
    header, *rows = [line for line in table.splitlines() if line.strip() and not line.startswith("-")]
    columns = [c.strip() for c in re.split(r"\s{2,}", header.strip())]
    for line in rows:
        cells = [c.strip() for c in re.split(r"\s{2,}", line.strip())]
        if cells[0] == operator:
            value = cells[columns.index("CUDA total")]
            return float(value[:-2]) if value.endswith("ms") else float(value[:-2]) / 1000
    return 0.0


def sparse_inference(data: dict, profiled: dict) -> str:
    """bench_sparse_inference at the 7B shape on one GPU: dense against 2:4 (and, where measured, 2:4
    with outputs copied row-major), side by side; and where a profiled run says the time went."""
    def sides(row: dict, unit: str, fmt: str = ",.0f") -> str:
        text = f"dense {row[f'dense_{unit}']:{fmt}}, 2:4 {row[f'sparse_{unit}']:{fmt}} ({row['speedup']:.2f}×)"
        if row.get("row_major_speedup") is not None:
            text += f", 2:4 outputs row-major {row[f'sparse_row_major_{unit}']:{fmt}} ({row['row_major_speedup']:.2f}×)"
        return text

    e2e = data["end_to_end"]
    lines = [f"- {data['device']}, torch {data['torch']}, {data['sparse_kernels'].get('backend')}, {data['shape']} shape "
             f"in {data['dtype']}, {e2e['blocks']} blocks, commit {data.get('commit', '?')}; {data['note']}.",
             f"- Block 0's MLP, {data['mlp']['tokens']:,} tokens, tokens/s: {sides(data['mlp'], 'tokens_per_s')}.",
             f"- Whole model prefill, {e2e['prefill']['tokens']:,} tokens, tokens/s: {sides(e2e['prefill'], 'tokens_per_s')}.",
             f"- Decode after a {e2e['decode']['prompt_tokens']}-token prompt, ms per token: "
             f"{sides(e2e['decode'], 'ms_per_token', '.1f')} (a ratio above 1 is faster).",
             f"- Masks identical on both sides: {e2e['masks_identical']}; logits within "
             f"{e2e.get('logits_relative_difference', float('nan')):.1e} (relative)."]
    tables = profiled["end_to_end"]["prefill"].get("profile", {})
    if tables:
        ms = {side: {op: _profile_ms(t, op) for op in ("aten::linear", "aten::scaled_dot_product_attention")}
              for side, t in tables.items()}
        lines += [f"- Where one whole-model prefill spends the GPU's time (torch.profiler, commit "
                  f"{profiled.get('commit', '?')}): linears dense {ms['dense']['aten::linear']:.0f} ms, 2:4 "
                  f"{ms['sparse']['aten::linear']:.0f} ms; attention dense {ms['dense']['aten::scaled_dot_product_attention']:.0f} ms, "
                  f"2:4 {ms['sparse']['aten::scaled_dot_product_attention']:.0f} ms."]
    lines += ["- Goals: " + "; ".join(
        f"{name} {'not measured' if g['measured'] is None else format(g['measured'], '.2f')} (goal {g['goal']:g}: "
        f"{_status(g)})"
        for name, g in data["goals"].items()) + "."]
    return "\n".join(lines)


def gram(data: dict) -> str:
    """SparseGPT's Gram sums of one 7B block by precision (benchmarks/bench_gram.py)."""
    differ = data["max_relative_diagonal_difference_from_float64"]
    parts = [f"{name} {sec:.2f} s ({data['tflops'][name]:g} TFLOP/s"
             + ("" if name == "float64" else f", diagonal within {differ[name]:.0e} of float64") + ")"
             for name, sec in data["seconds_per_block"].items()]
    return (f"- SparseGPT's Gram sums of one block ({data['tflop_per_block']:g} TFLOP over {data['tokens']:,} tokens, "
            f"{data['device']}, commit {data.get('commit', '?')}): " + "; ".join(parts) + ".")


def perplexity(data: dict) -> str:
    """`fedlib evaluate`'s perplexity path vs a bare forward (benchmarks/bench_perplexity.py)."""
    lines = []
    for r in data["records"]:
        lines.append(
            f"- Perplexity rate, {data['windows']} WikiText-2 test windows × {data['seqlen']} tokens, batch "
            f"{r['batch_size']}, {data['threads']} threads: fedlib {r['fedlib_tokens_per_s']:,.0f} tokens/s "
            f"(**{r['ratio']:.2f}×** a bare `model(input_ids)` forward at {r['bare_tokens_per_s']:,.0f} tokens/s; "
            f"{r['ratio_in_memory']:.2f}× with the model already in memory); ppl {r['fedlib_ppl']:.4f} vs "
            f"{r['bare_forward_ppl_float64_loss']:.4f} from the bare forward's logits (goal {data['goal']}; medians of "
            f"{data['repeats']} interleaved repeats, load average {data['load_average_before_after'][0]:.0f}).")
    return "\n".join(lines + [f"  {_provenance(data)}"])


def workflow(data: dict) -> str:
    """Where a `make run` spends its time (benchmarks/workflow_summary.py over its benchmark files),
    beside an earlier run's figures when the JSON keeps them (``before``)."""
    rules = sorted(data["rules"].items(), key=lambda kv: -kv[1]["seconds"])
    jobs = sum(r["jobs"] for _, r in rules)
    wall = f"wall time **{data['wall_seconds'] / 60:.1f} min**, " if data.get("wall_seconds") else ""
    lines = [f"`make run`: {jobs} jobs, {wall}{data['job_seconds_total'] / 60:.1f} min of job time. "
             f"{_provenance(data)}"]
    before = data.get("before")
    if before:
        old_wall = f"wall time {before['wall_seconds'] / 60:.1f} min, " if before.get("wall_seconds") else ""
        lines.append(f"Before (commit {before['commit']}, {before['machine']['cpus']} CPUs): "
                     f"{sum(r['jobs'] for r in before['rules'].values())} jobs, {old_wall}"
                     f"{before['job_seconds_total'] / 60:.1f} min of job time.")
        head = "| rule | jobs | seconds per job (before) | seconds per job | share of job time | peak RSS of a job |"
    else:
        head = "| rule | jobs | seconds per job | share of job time | peak RSS of a job |"
    lines += ["", head, "|" + "---|" * head.count(" | ") + "---|"]
    for rule, r in rules:
        cells = [rule, str(r["jobs"])]
        if before:
            old = before["rules"].get(rule)
            cells.append(f"{old['seconds'] / old['jobs']:.1f}" if old else "-")
        cells += [f"{r['seconds'] / r['jobs']:.1f}", f"{r['share']:.1%}", f"{r['max_rss_mib']:,.0f} MiB"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_csv(path: Path, after: tuple[str, ...] = ()) -> Callable[[dict], str]:
    """A report table (its CSV) with the provenance lines of its Markdown header, and below it
    the header lines that start with one of ``after`` (e.g. what Table 1 does not resolve)."""

    def render(rows: list[list[str]]) -> str:
        md = path.with_suffix(".md").read_text().splitlines()
        provenance = [line.removeprefix("- ").rstrip(".") for line in md
                      if line.startswith(("- Model:", "- Config:", "- Perplexity on ", "- Perplexity: "))]
        out = [f"From `{path.relative_to(REPO)}`: " + "; ".join(provenance) + ".", ""]
        out.append("| " + " | ".join(rows[0]) + " |")
        out.append("|" + "---|" * len(rows[0]))
        out += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        below = [line for line in md if after and line.startswith(after)]
        return "\n".join(out + ([""] + below if below else []))

    return render


def _records(rows: list[list[str]]) -> list[dict[str, str]]:
    return [dict(zip(rows[0], row)) for row in rows[1:]]


def _row(records: list[dict[str, str]], first: str) -> dict[str, str]:
    """The row whose first cell starts with ``first`` (report rows are labelled, not numbered)."""
    return next(r for r in records if next(iter(r.values())).strip().startswith(first))


#: the bundled audit of `make run` (fedlib.privacy_analyses: the analyses without a target of their own)
PRIVACY = tuple(analysis.name for analysis in BUNDLED)


def privacy(*tables: list[list[str]]) -> str:
    """The reduced privacy audit of `make run`, one line per analysis (reports/privacy_<analysis>.csv)."""
    t = {name: _records(rows) for name, rows in zip(PRIVACY, tables)}
    mds = {name: (REPO / f"reports/privacy_{name}.md").read_text() for name in PRIVACY}
    provenance = sorted({"; ".join(line.removeprefix("- ") for line in md.splitlines()
                                   if line.startswith(("- Model:", "- Config:"))) for md in mds.values()})
    ent, ent_paper = _row(t["entropy"], "Block 0 q_proj"), _row(t["entropy"], "Paper")
    sim, sim_paper = _row(t["similarity"], "16 client masks"), _row(t["similarity"], "Paper")
    sens, natural = _row(t["sensitivity"], "Mean over neighbours"), _row(t["sensitivity"], "Natural variation")
    mia = _row(t["membership"], "LiRA, no defence")
    # the 'signal strength' ratio is stated in the membership table's header, not a cell
    ratio, ratio_paper = re.search(r"ratio ([\d.]+) \(paper: ([^)]*)\)", mds["membership"]).groups()
    ceiling = re.search(r"could show is ([\d.]+) \(LR = 1\)", mds["membership"]).group(1)
    tpr = mia["TPR @ 0.01 FPR [95 % CI]"]
    tpr = f"{tpr.removesuffix(' †')} at FPR 0 (1 % not resolvable)" if tpr.endswith("†") else f"{tpr} at 1 % FPR"
    inv, inv_paper = _row(t["inversion"], "SmolLM2"), _row(t["inversion"], "Paper")
    no_noise = _row(t["defence"], "∞")
    rr = [r for r in t["defence"] if r["ε per bit"][:1].isdigit()]
    llr_auc = {re.search(r"ε = ([\d.]+) per bit", r["Attack"]).group(1): r["AUC [95 % CI]"].split()[0]
               for r in t["membership"] if r["Attack"].startswith("Per-bit likelihood ratio")}
    rr_auc = [(re.search(r"ε = ([\d.]+) per bit", r["Attack"]).group(1), r["AUC [95 % CI]"].split()[0])
              for r in t["membership"] if "randomized response" in r["Attack"]]
    rows = [
        ("privacy_entropy", "bits per entry: a client's mask vs the fp16 weights; how much of a mask varies across clients",
         f"{ent_paper['Mask bits/entry']} vs {ent_paper['fp16 bits/entry']} bits",
         f"{ent['Mask bits/entry']} vs {ent['fp16 bits/entry']} bits (block-0 `q_proj`); "
         f"{_row(t['entropy'], 'Whole model (')['Across clients bits/entry']} bits/entry vary across clients"),
        ("privacy_similarity", "Hamming distance between every pair of client masks (disjoint data)",
         f"{sim_paper['Mean Hamming']} ({sim_paper['Identical bits (mean)']} identical)",
         f"{sim['Mean Hamming']} ± {sim['Std']} over {sim['Pairs']} pairs"),
        ("privacy_sensitivity", "masks of data sets differing in one sample",
         _row(t["sensitivity"], "Paper")["Hamming (all layers)"],
         f"{sens['Hamming (all layers)']} ({sens['Changed bits']} bits) vs natural variation "
         f"{natural['Hamming (all layers)']}; no DP ε follows (the header says why)"),
        ("privacy_membership", "LiRA with shadow masks: AUC, TPR at 1 % FPR, empirical ε lower bound",
         f"signal ratio {ratio_paper}: \"attacks would fail\"",
         f"signal ratio {ratio}, yet AUC {mia['AUC [95 % CI]']}, TPR {tpr}, "
         f"ε ≥ {mia['ε lower bound, LR = 1 threshold'].split()[0]} (the most these counts can show: {ceiling})"),
        ("privacy_inversion", "the server reconstructs the text from the block-0 `q_proj` mask",
         f"{inv_paper['Bag-of-tokens recovery']} of tokens",
         f"{inv['Bag-of-tokens recovery']} of a {inv['T tokens']}-token text's bag of tokens "
         f"(unigram guess: {inv['Unigram guess (bag)']}; exact positions {inv['Exact-position recovery']})"),
        ("privacy_defence", "randomized response on mask bits (ε per bit), FedPrLLM top-k on noisy votes: "
         "perplexity and attack AUC (non-adaptive attacks: lower bounds on the leakage)", "–",
         f"WikiText-2 ppl {no_noise['WikiText-2 ppl']} without noise; "
         + "; ".join(f"ε = {r['ε per bit']}: ppl {r['WikiText-2 ppl']}, AUC {r['MIA AUC, LiRA (lower bound)']}"
                     for r in rr)
         + "; attack AUC by ε, LiRA / per-bit LR knowing the noise: "
         + ", ".join(f"{eps}: {auc} / {llr_auc.get(eps, '-')}" for eps, auc in rr_auc)),
    ]
    out = ["From `reports/privacy_<analysis>.csv`: " + " / ".join(provenance) + ".", "",
           "| table | what | paper (LLaMA-7B) | measured here |", "|---|---|---|---|"]
    out += [f"| `{name}` | {what} | {paper} | {here} |" for name, what, paper, here in rows]
    return "\n".join(out)


def byzantine(data: dict) -> str:
    """Byzantine clients against the plain and the robust FedPrLLM server (benchmarks/bench_byzantine.py)."""
    st, ev = data["settings"], data["settings"]["evaluation"]
    byz = st["byzantine_clients"]
    lines = [
        f"{data['model']}, the default federation ({st['clients']}; {st['local']} client masks), server "
        f"{st['server']}; n Byzantine clients replace the last n (n = 2: clients {' and '.join(byz['2'])}). "
        f"Perplexity on {ev['windows']} {ev['dataset']} windows of {ev['seqlen']} tokens (honest federation "
        f"{data['honest_perplexity']:.2f}); global bits that differ from the honest federation's; clients the "
        f"`mad` rule flags. {_provenance(data)}",
        "",
        "| attack | Byzantine clients | plain server: ppl (× honest) | global bits changed | robust server "
        "(`--robust mad`): ppl (× honest) | global bits changed | flagged Byzantine | flagged honest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = {(r["attack"], r["n_byzantine"], r["server"]): r for r in data["records"]}
    for attack, n, _ in [k for k in rows if k[2] == "plain"]:
        p, r = rows[(attack, n, "plain")], rows[(attack, n, "robust")]
        r_flagged = r["flagged_byzantine"]
        total = st["n_clients"]
        lines.append(
            f"| {attack} | {n} of {total} ({n / total:.1%}) | {p['perplexity']:.2f} ({p['ratio_to_honest']:.3f}×) "
            f"| {p['mask_difference_from_honest']:.2%} | {r['perplexity']:.2f} ({r['ratio_to_honest']:.3f}×) "
            f"| {r['mask_difference_from_honest']:.2%} | {f'{r_flagged} of {n}' if n else '–'} "
            f"| {r['flagged_honest']} of {total - n} |")
    lines += ["", f"Goal ({data['goal']}): {'met' if data['goal_met'] else 'NOT met'}."]
    return "\n".join(lines)


def peers(data: dict) -> str:
    """fedlib's client mask vs llmcompressor's oneshot on the same tokens (benchmarks/bench_peers.py)."""
    cal, ev, bs = data["calibration"], data["evaluation"], data["batch_size"]
    versions = ", ".join(f"{k} {v}" for k, v in data["peer_versions"].items())
    lines = [
        f"{data['model']}, {data['sparsity']:.0%} unstructured sparsity, the same {cal['samples']} × {cal['seqlen']} "
        f"{cal['dataset']} calibration token ids for both, {data['threads']} threads each, batch size fedlib "
        f"{bs['fedlib']} / llmcompressor {bs['peer']} (each tool's default); medians of {data['repeats']} interleaved "
        f"repeat{'s' * (data['repeats'] != 1)}, each side timed around its pruning call alone. Perplexity: fedlib's code on {ev['windows']} "
        f"{ev['dataset']} windows of {ev['seqlen']} tokens for both pruned weight sets (dense "
        f"{data['dense_ppl']:.2f}). Peer environment: {versions}. {_provenance(data)}"
        + (f" Machine shared with other jobs: 1-minute load average {min(load):.1f}–{max(load):.1f} at the repeats' "
           f"starts." if (load := data.get("load_average_1min")) else ""),
        "",
        f"The goal: {data['goal']}.",
        "",
        "| fedlib method (group) | llmcompressor modifier | time fedlib / llmcompressor | mask bits that agree "
        "| ppl fedlib | ppl llmcompressor | ppl fedlib / llmcompressor [95 % paired CI] | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["records"]:
        lo, hi = r["ppl_ratio_ci"]
        lines.append(
            f"| `{r['method']}` ({r['group']}) | {r['peer_method']} | **{r['ratio']:.2f}×** | {r['agreement']:.2%} "
            f"| {r['fedlib_ppl']:.2f} | {r['peer_ppl']:.2f} | {r['ppl_ratio'] - 1:+.2%} [{lo - 1:+.2%}, {hi - 1:+.2%}] "
            f"| {'met' if r['goal_met'] else 'NOT met'} |")
    return "\n".join(lines)


def eval_windows(data: dict) -> str:
    """Window noise of Table 1's comparisons and the cost of a window (benchmarks/bench_eval_windows.py)."""
    from fedlib.report import DATASET_TITLES

    shown = list(next(iter(data["comparisons"].values()))["FedPrLLM (layer) vs Local-only"]["half_width"])
    lines = [
        f"On `make run`'s masks ({data['setting']}), {data['windows_per_dataset']} windows × {data['seqlen']} tokens "
        f"per dataset, {data['threads']} thread: a window costs **{data['cpu_seconds_per_window']:.2f} CPU-seconds** "
        f"per variant (median over {len(data['cpu_seconds'])} variants); `make run` evaluates "
        f"{data['make_run_windows']} windows per dataset. {_provenance(data)}",
        "",
        "| dataset | comparison | mean log-ppl difference | sd per window | 95 % half-width at "
        + " / ".join(shown) + " windows (* resolved) |",
        "|---|---|---|---|---|",
    ]
    for dataset, comparisons in data["comparisons"].items():
        for name, c in comparisons.items():
            widths = " / ".join(f"±{c['half_width'][n]:.2%}" + ("*" if c["resolved_at"][n] else "") for n in shown)
            lines.append(f"| {DATASET_TITLES.get(dataset, dataset)} | {name} | {c['mean']:+.2%} | {c['sd']:.4f} "
                         f"| {widths} |")
    return "\n".join(lines)


def _variant_title(label: str) -> str:
    from fedlib.catalog import Variant

    variant = Variant.from_label(label)
    if variant.kind == "fedprllm":
        return variant.name
    return f"Local-only client {variant.client}" if variant.kind == "local" else variant.kind.capitalize()


def cpu_tolerance(data: dict) -> str:
    """Table 1's masks and perplexities under other CPU kernels (benchmarks/bench_cpu_tolerance.py)."""
    from fedlib.report import DATASET_TITLES

    kernels = data["kernels"]
    default = kernels["default"]
    ev = data["evaluation"]
    others = [k for k in kernels if k != "default"]
    datasets = list(default["perplexity"]["dense"])
    lines = [
        f"The workflow (`{data['config']}`, setting {data['setting']}, {data['threads']} thread, {ev['windows']} windows "
        f"× {ev['seqlen']} tokens per dataset) once per kernel setting, compared with the default kernels "
        f"(PyTorch capability {default['capability']}): "
        + "; ".join(f"`{k}` = {' '.join(f'{n}={v}' for n, v in kernels[k]['env'].items())} "
                    f"(capability {kernels[k]['capability']})" for k in others)
        + f". Calibration and window token ids identical under every setting: "
        f"{'yes' if all(kernels[k]['summary']['tokens_identical'] for k in others) else 'NO'}"
        + (f"; the default masks equal those of `make run` in another checkout: "
           f"{'yes' if data['default_equals_reference'] else 'NO'}" if "default_equals_reference" in data else "")
        + f". {_provenance(data)}",
        "",
        "| kernels | variant | mask bits that differ | blocks that differ (first) | "
        + " | ".join(f"{DATASET_TITLES.get(d, d)} ppl change" for d in datasets) + " |",
        "|---|---|---|---|" + "---|" * len(datasets),
    ]
    for k in others:
        record = kernels[k]
        for label in data["variants"]:
            m = record["masks_vs_default"].get(label)
            bits = "-" if m is None else f"{m['fraction']:.3%}"
            blocks = "-" if m is None else (f"{m['blocks_differing']} of {m['blocks']} ({m['first_block_differing']})"
                                           if m["blocks_differing"] else f"0 of {m['blocks']}")
            changes = " | ".join(f"{record['ppl_change_vs_default'][label][d]:+.2%}" for d in datasets)
            lines.append(f"| `{k}` | {_variant_title(label)} | {bits} | {blocks} | {changes} |")
    worst = max(others, key=lambda k: kernels[k]["summary"]["max_abs_ppl_change"])
    summary = kernels[worst]["summary"]
    lines += ["", f"Tolerance across these kernels: masks differ in up to "
                  f"{max(kernels[k]['summary']['max_mask_fraction'] for k in others):.2%} of the weights, and the pruned "
                  f"rows' perplexities move by up to {summary['max_abs_ppl_change']:.2%} (`{worst}`; Dense "
                  f"{max(kernels[k]['summary']['max_abs_dense_ppl_change'] for k in others):.2%})."]
    return "\n".join(lines)


def mask_compression(data: dict) -> str:
    """Mask file size, format version 1 vs 2 (benchmarks/bench_mask_compression.py)."""
    cal, records = data["calibration"], data["records"]
    commits = sorted({r["commit"] for r in records})
    lines = [
        f"{data['model']}, one client's masks ({cal['samples']} × {cal['seqlen']} {cal['dataset']} calibration "
        f"tokens, row groups) of the first *blocks* of its {data['model_blocks']} blocks, written and read back "
        f"through fedlib (lossless: decoded == the client's masks). Bits per weight = the whole file's bits "
        f"(header included) over those blocks' prunable weights; reference: {data['reference']}. Encode / decode: "
        f"the mask file's, with the reference's buckets computed once beforehand (*reference*: that cost). "
        f"Commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}; {_machine(data)}.",
        "",
        "| method | sparsity | blocks (weights) | version 1 | version 2 | v2 / v1 | ideal for v2's model "
        "| XOR with the magnitude mask + lzma | v2 encode | v2 decode | reference |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = {(r["method"], r["sparsity"], r["blocks"], r["format_version"]): r for r in records}
    for method, sparsity, blocks, _ in [k for k in rows if k[3] == 2]:
        one, two = rows[(method, sparsity, blocks, 1)], rows[(method, sparsity, blocks, 2)]
        xor = f"{two['xor_lzma_bits_per_weight']:.3f}" if "xor_lzma_bits_per_weight" in two else "–"
        ref = f"{two['reference_seconds']:.0f} s" if "reference_seconds" in two else "(in encode / decode)"
        lines.append(
            f"| {method} | {sparsity:.0%} | {blocks} ({two['weights']:,}) | {one['bits_per_weight']:.3f} "
            f"| **{two['bits_per_weight']:.3f}** | {two['bits_per_weight'] / one['bits_per_weight']:.1%} "
            f"| {two['ideal_context_bits_per_weight']:.3f} | {xor} | {two['encode_seconds']:.0f} s "
            f"| {two['decode_seconds']:.0f} s | {ref} |")
    goal = [r for r in records if (r["method"], r["sparsity"], r["format_version"]) == ("wanda", 0.5, 2)]
    met = bool(goal) and all(r["bits_per_weight"] <= 0.35 for r in goal)
    lines += ["", f"Goal ({data['goal']}): {'met' if met else 'NOT met'}."]
    return "\n".join(lines)


def domain(csv_path: str) -> Callable[[list[list[str]]], str]:
    """A domain-shift study's report (``csv_path`` and the Markdown beside it): every row without
    the guard columns, and the report's own verdict lines (its Markdown header)."""

    def render(rows: list[list[str]]) -> str:
        md = (REPO / csv_path).with_suffix(".md").read_text().splitlines()
        provenance = [line.removeprefix("- ") for line in md if line.startswith(("- Model:", "- Clients:"))]
        verdicts = [line for line in md if line.startswith(("- At ", "- Chosen", "- Goal", "- Worse", "- Audited"))]
        keep = [i for i, name in enumerate(rows[0]) if not name.endswith(" ppl") or name.startswith("PTB")]
        out = [f"From `{csv_path}` (guard columns: see the file): " + " ".join(provenance), ""]
        out += ["| " + " | ".join(rows[0][i] for i in keep) + " |", "|" + "---|" * len(keep)]
        out += ["| " + " | ".join(row[i] for i in keep) + " |" for row in rows[1:]]
        return "\n".join(out + [""] + verdicts)

    return render



def table1_abridged(rows: list[list[str]]) -> str:
    """Table 1 of `make run` cut to what a first reader needs: perplexity of the baselines and of
    FedPrLLM without weight scaling (the whole table: docs/results/table1.md)."""
    md = (REPO / "reports/table1.md").read_text().splitlines()
    windows = [line.removeprefix("- ") for line in md if line.startswith("- Perplexity on ")]
    keep = [i for i, name in enumerate(rows[0]) if name in ("Method", "Comparison group", "WikiText-2", "C4", "PTB")]
    weight_scaling = rows[0].index("Weight scaling")
    out = [f"From `reports/table1.csv`, the rows without weight scaling. {' '.join(windows)}", "",
           "| " + " | ".join(rows[0][i] for i in keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(row[i] for i in keep) + " |" for row in rows[1:] if row[weight_scaling] != "✓"]
    return "\n".join(out)


def run_time(data: dict) -> str:
    """How long `make run` took, in one line (benchmarks/results/workflow.json; per rule: docs)."""
    jobs = sum(r["jobs"] for r in data["rules"].values())
    wall = f"{data['wall_seconds'] / 60:.0f} min of wall time" if data.get("wall_seconds") else "wall time not recorded"
    return (f"`make run` measured: {jobs} jobs, {wall} ({data['job_seconds_total'] / 60:.0f} min of job time), "
            f"on {data['machine']['cpus']} CPUs (commit {data.get('commit', '?')}).")


def dense_wikitext2(table1: list[list[str]], dp_utility: list[list[str]], precision_: dict, hessian: dict,
                    peers_: dict, perplexity_: dict) -> str:
    """Every Dense WikiText-2 perplexity the docs quote, each with the windows it was measured on:
    a perplexity over a sample of windows depends on which windows, so the figures differ."""
    def md_line(path: str, start: str) -> str:
        return next(line.removeprefix("- ") for line in (REPO / path).read_text().splitlines() if line.startswith(start))

    dense = {row[0]: row for row in table1[1:]}["Dense"][table1[0].index("WikiText-2")]
    dp_dense = next(r for r in _records(dp_utility) if r["Mechanism"].startswith("Dense"))["WikiText-2 ppl"]

    def windows(data: dict) -> str:
        ev = data.get("evaluation", data)
        return f"{ev['windows']} {ev['dataset']} test windows × {ev['seqlen']} tokens"

    rows = [
        ("`make run`, Table 1 (reports/table1.csv)", md_line("reports/table1.md", "- Perplexity on ").split(";")[0]
         .removeprefix("Perplexity on "), dense),
        ("DP privacy–utility table (reports/privacy_dp_utility.csv)",
         md_line("reports/privacy_dp_utility.md", "- Perplexity: ").removeprefix("Perplexity: ").split(";")[0],
         dp_dense),
        ("bfloat16 vs float32 masks (benchmarks/results/precision.json)", windows(precision_),
         f"{precision_['dense_ppl_float32']:.2f}"),
        ("SparseGPT Hessian dtype (benchmarks/results/hessian_dtype.json)", windows(hessian), f"{hessian['dense_ppl']:.2f}"),
        ("fedlib vs llmcompressor (benchmarks/results/peers.json)", windows(peers_), f"{peers_['dense_ppl']:.2f}"),
        ("perplexity rate (benchmarks/results/perplexity.json)", windows(perplexity_),
         f"{perplexity_['records'][0]['fedlib_ppl']:.2f}"),
    ]
    out = ["| where | windows scored | Dense WikiText-2 ppl |", "|---|---|---|"]
    out += [f"| {where} | {scored} | {ppl} |" for where, scored, ppl in rows]
    return "\n".join(out)


def test_durations(data: dict) -> str:
    """The slowest tests of a recorded `make test` (tools/test_durations.py over its JUnit XML)."""
    lines = [f"{data['tests']} tests, {data['wall_seconds'] / 60:.1f} min of pytest; commit {data['commit']}, "
             f"{data['machine']['cpus']} CPUs ({data['machine']['machine']}).", "",
             "| test | seconds |", "|---|---|"]
    lines += [f"| `{r['test']}` | {r['seconds']:.1f} |" for r in data["slowest"]]
    return "\n".join(lines)


#: what each mask-file field means (the spec's prose); mask_fields() refuses to render when
#: fedlib.maskfile has a field this lacks, or this names one it lacks, so the spec cannot drift
MASK_FIELD_MEANINGS = {
    "format": "always `fedlib-mask`",
    "format_version": "1 (packed bits) or 2 (entropy-coded client masks)",
    "model_fingerprint": "sha256 over every parameter's name, shape, dtype and bytes of the public model",
    "role": "`client` (an upload) or `global` (the server's file)",
    "client_id": "the site's id (distinct within a cohort)",
    "method": "a registered local method; in a global file `<schedule>[<method>]<label>` or `random`",
    "group": "comparison group: `row`, `column`, `layer` or `N:M`",
    "sparsity": "the claimed target fraction, written as Python's `repr(float)`",
    "allocation": "`uniform` or `nonuniform` (per-layer sparsity chosen by the method: OWL, BESA)",
    "n_samples": "calibration samples behind the mask (plain decimal integer)",
    "seed": "tie-break seed (plain decimal integer)",
    "n_clients": "clients aggregated (1 in a client file)",
    "fedlib_version": "version of the fedlib that wrote the file",
    "layers": "JSON list of `{\"name\", \"shape\", \"pruned\"}` in model order",
    "reference": "version 2: the reference the mask is coded against (`magnitude`)",
    "reference_sha256": "version 2: sha256 of the reference's buckets for the file's layers",
    "method_options": "the method's constructor options (canonical JSON object)",
    "dtype": "the compute dtype the client ran in",
    "dp": "the DP guarantee of a DP client (ε, δ, clip, σ, accountant, neighbours, releases; compact JSON)",
    "dp_release": "SHA-256 of the noisy sums the mask was estimated from: equal in the masks that estimators of one noisy release made (one ε spent)",
    "rr_epsilon_per_bit": "randomized response on the votes: ε per bit",
    "votes": "what the `votes:` tensors count",
    "robust": "the robust rule that screened the clients (`mad`)",
    "excluded_clients": "clients whose votes the robust rule did not count (JSON list)",
    "absent_clients": "clients of a networked round without an accepted upload (JSON list)",
    "payload": "`weights` in a weight file (FedSpaLLM)",
    "weight_dtype": "dtype of the `weight:` tensors (`float16` or `float32`)",
    "round": "the round the file belongs to",
    "uncovered_blocks": "blocks no upload covered, kept from the previous round (JSON list)",
    "rounding": "the expansion rounding `fedlib aggregate` used",
}


def mask_fields(_source: str) -> str:
    """The mask file's fields, kinds and versions as fedlib.maskfile reads them (the versioned spec)."""
    from fedlib import maskfile

    names = set(maskfile.METADATA_FIELDS) | set(maskfile.CODED_FIELDS)
    names |= {name for always, optional in maskfile.EXTRAS.values() for name in (*always, *optional)}
    missing, unknown = names - set(MASK_FIELD_MEANINGS), set(MASK_FIELD_MEANINGS) - names
    if missing or unknown:
        raise ValueError(f"fedlib/maskfile.py and MASK_FIELD_MEANINGS differ: undocumented {sorted(missing)}, "
                         f"no longer read {sorted(unknown)}")
    out = [f"Format `{maskfile.FORMAT}`, versions {', '.join(map(str, maskfile.FORMAT_VERSIONS))} "
           f"(the writer's default: {maskfile.FORMAT_VERSION}).", "",
           "**Metadata every file carries** (safetensors string metadata, exact key set):", "",
           "| field | meaning |", "|---|---|"]
    out += [f"| `{name}` | {MASK_FIELD_MEANINGS[name]} |" for name in maskfile.METADATA_FIELDS]
    out += ["", "**Format version 2 adds** (client mask files only):", "", "| field | meaning |", "|---|---|"]
    out += [f"| `{name}` | {MASK_FIELD_MEANINGS[name]} |" for name in maskfile.CODED_FIELDS]
    out += ["", "**`x_` fields by kind of file** (required / optional; any other `x_` key is refused):", "",
            "| role | payload | field | required | meaning |", "|---|---|---|---|---|"]
    for (role, payload), (always, optional) in maskfile.EXTRAS.items():
        out += [f"| {role} | {payload} | `x_{name}` | {'yes' if name in always else 'no'} | {MASK_FIELD_MEANINGS[name]} |"
                for name in (*always, *optional)]
    out += ["", "Written together or not at all: " + "; ".join(
        " and ".join(f"`x_{name}`" for name in names_) for names_ in maskfile.PAIRED_EXTRAS) + ".",
        "", f"Tensors: `mask:<layer>` (`uint8`) per prunable linear; in a global file `votes:<layer>` "
        f"(`uint8`, `int16` beyond 255 clients); in a weight file `{maskfile.WEIGHT_PREFIX}<layer>` "
        f"({', '.join(f'`{d}`' for d in maskfile.WEIGHT_DTYPES)})."]
    return "\n".join(out)


def _schema_type(spec: dict) -> str:
    if "enum" in spec:
        return " or ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    for key in ("oneOf", "anyOf"):
        if key in spec:
            return " or ".join(dict.fromkeys(_schema_type(option) for option in spec[key]))
    kind = spec.get("type", "")
    return " or ".join(kind) if isinstance(kind, list) else kind


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def config_reference(schema_text: str, config_text: str) -> str:
    """Every configuration key: its type, the schema's default, the value in config.yaml and what it means."""
    import yaml

    schema, config = yaml.safe_load(schema_text), yaml.safe_load(config_text)
    out = [f"From `{SCHEMA.relative_to(REPO)}` (type, default, meaning) and `config.yaml` (its value).", "",
           "| key | type | default | `config.yaml` | meaning |", "|---|---|---|---|---|"]

    def walk(props: dict, values, prefix: str) -> None:
        for key, spec in props.items():
            name = f"{prefix}{key}"
            value = values.get(key, "–") if isinstance(values, dict) else "–"
            nested = spec.get("properties")
            shown = "(below)" if nested and isinstance(value, dict) else f"`{json.dumps(value)}`" if value != "–" else "–"
            if len(shown) > 60:
                shown = shown[:57] + "…`"
            default = f"`{json.dumps(spec['default'])}`" if "default" in spec else "–"
            out.append(f"| `{name}` | {_cell(_schema_type(spec))} | {_cell(default)} | {_cell(shown)} "
                       f"| {_cell(spec.get('description', ''))} |")
            if nested:
                walk(nested, value if isinstance(value, dict) else {}, f"{name}.")

    walk(schema["properties"], config, "")
    return "\n".join(out)


#: blocks whose figures a later run or a later change of the workflow superseded: the block says so
SUPERSEDED = {
    "workflow": "measured when `make run` evaluated 8 windows per dataset; it now evaluates 16 (the evaluate "
                "rule's time roughly doubles), so today's run takes longer",
    "run-time": "measured when `make run` evaluated 8 windows per dataset; it now evaluates 16, so today's run "
                "takes longer",
    "domain": "its DP rows are at 4 × 8 private windows and predate the posterior estimator; the distributed "
              "mechanism's current results are the runs at n = 512 and n = 1024",
}


def _load(path: Path):
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".csv":
        return list(csv.reader(path.open()))
    return path.read_text()


#: the workflow's configuration schema (shipped inside the package)
SCHEMA = REPO / "fedlib/schemas/config.schema.yaml"


SOURCES: dict[str, tuple[Path | tuple[Path, ...], Callable]] = {
    "precision": (REPO / "benchmarks/results/precision.json", precision),
    "hessian-dtype": (REPO / "benchmarks/results/hessian_dtype.json", hessian_dtype),
    "scale": (REPO / "benchmarks/results/scale.json", scale),
    "client-mask": (REPO / "benchmarks/results/client_mask.json", client_mask),
    "server": (REPO / "benchmarks/results/server.json", server),
    "workflow": (REPO / "benchmarks/results/workflow.json", workflow),
    "secagg": (REPO / "benchmarks/results/secagg.json", secagg),
    "flower": (REPO / "benchmarks/results/flower.json", flower),
    "gpu": ((REPO / "benchmarks/results/gpu.json", REPO / "benchmarks/results/gpu_evaluate.json"), gpu),
    "gram": (REPO / "benchmarks/results/gram.json", gram),
    "gpu-client-start": (REPO / "benchmarks/results/gpu_client_start.json", gpu_client_start),
    "sparse-inference": ((REPO / "benchmarks/results/sparse_inference.json",
                          REPO / "benchmarks/results/sparse_inference_profile.json"), sparse_inference),
    "gpu-tensor-gram": ((REPO / "benchmarks/results/gpu_sparsegpt_exact.json",
                         REPO / "benchmarks/results/gpu_tensor_gram.json"), gpu_side_by_side),
    "gpu-wanda-batch": ((REPO / "benchmarks/results/gpu_wanda_b8.json",
                         REPO / "benchmarks/results/gpu_wanda_b32.json"), gpu_side_by_side),
    "perplexity": (REPO / "benchmarks/results/perplexity.json", perplexity),
    "byzantine": (REPO / "benchmarks/results/byzantine.json", byzantine),
    "peers": (REPO / "benchmarks/results/peers.json", peers),
    "mask-compression": (REPO / "benchmarks/results/mask_compression.json", mask_compression),
    "cpu-tolerance": (REPO / "benchmarks/results/cpu_tolerance.json", cpu_tolerance),
    "eval-windows": (REPO / "benchmarks/results/eval_windows.json", eval_windows),
    # Table 1's header lines on FedPrLLM against Local-only and on what it does not resolve
    **{name: (REPO / path, table_csv(REPO / path, ("- FedPrLLM (", "- Not resolved", "- Every difference")))
       for name, path in (("table1", "reports/table1.csv"), ("table1-seeds", "reports/table1_seeds.csv"))},
    **{name: (REPO / path, table_csv(REPO / path)) for name, path in (
        ("table12-run", "reports/table12_run.csv"),
        ("domain-headroom", "reports/domain_n512/headroom.csv"),
        ("domain-headroom-n1024", "reports/domain_n1024/headroom.csv"),
        ("domain-headroom-heldout", "reports/domain_heldout/headroom.csv"),
        ("gemma-table1", "reports/gemma3-270m/table1.csv"),
        # every table of the named privacy targets (fedlib.privacy_analyses)
        *((table.replace("_", "-"), f"reports/{table}.csv") for analysis in TARGETS for table in analysis.tables),
    )},
    "privacy": (tuple(REPO / f"reports/privacy_{name}.csv" for name in PRIVACY), privacy),
    "table1-abridged": (REPO / "reports/table1.csv", table1_abridged),
    "run-time": (REPO / "benchmarks/results/workflow.json", run_time),
    "dense-wikitext2": (tuple(REPO / p for p in (
        "reports/table1.csv", "reports/privacy_dp_utility.csv", "benchmarks/results/precision.json",
        "benchmarks/results/hessian_dtype.json", "benchmarks/results/peers.json", "benchmarks/results/perplexity.json")),
        dense_wikitext2),
    "mask-fields": (REPO / "fedlib/maskfile.py", mask_fields),
    "test-durations": (REPO / "benchmarks/results/test_durations.json", test_durations),
    "config": ((SCHEMA, REPO / "config.yaml"), config_reference),
    **{name: (REPO / path, domain(path)) for name, path in (
        ("domain", "reports/domain.csv"), ("domain-n512", "reports/domain_n512/domain.csv"),
        ("domain-n1024", "reports/domain_n1024/domain.csv"),
        ("domain-heldout", "reports/domain_heldout/domain.csv"))},
}


def _paths(source: Path | tuple[Path, ...]) -> tuple[Path, ...]:
    return source if isinstance(source, tuple) else (source,)


def _names(source: Path | tuple[Path, ...]) -> str:
    return ", ".join(str(p.relative_to(REPO)) for p in _paths(source))


def pages() -> list[Path]:
    """Every page that may hold generated blocks: the README, the configuration reference the
    workflow catalog reads, and the docs site."""
    return [REPO / "README.md", REPO / "config/README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(text: str) -> dict[str, str]:
    """name -> the text between its markers (each on its own line)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- figures:([\w-]+) -->\n(.*?)<!-- /figures:\1 -->", text, re.S)}


def render(name: str) -> str:
    """A block's text from its sources (with the superseded note where one applies)."""
    source, renderer = SOURCES[name]
    body = renderer(*map(_load, _paths(source)))
    if name in SUPERSEDED:
        body = f"> **Superseded:** {SUPERSEDED[name]}.\n\n{body}"
    return body + "\n"


def render_all(text: str, names=None) -> tuple[str, list[str]]:
    """Page text with every available block regenerated, and the names regenerated."""
    done = []
    for name in blocks(text):
        source, _ = SOURCES[name]
        if (names and name not in names) or not all(p.is_file() for p in _paths(source)):
            continue
        body = render(name)
        text = re.sub(rf"(<!-- figures:{name} -->\n).*?(<!-- /figures:{name} -->)",
                      lambda m: m.group(1) + body + m.group(2), text, flags=re.S)
        done.append(name)
    return text, done


# A figure in prose outside a block is a copy that nothing keeps equal to its source. The check
# below finds measured-looking figures (a number with a unit) outside blocks and code, and
# accepts one only where the page's own blocks hold that number, or where it is a setting
# (a sparsity, a confidence level, ...) that no run measures.
_FIGURE = re.compile(r"(?<![\w.\-/])(\d[\d,]*(?:\.\d+)?)\s?(%|×(?!\s?\d)|ppl\b|s\b|min\b|minutes\b|hours?\b|GiB\b|MiB\b|GB\b|MB\b"
                     r"|bits? per weight\b|bit/weight\b)")
#: a perplexity quoted by name ("ppl 70.62", "perplexity of 31.17")
_NAMED_FIGURE = re.compile(r"\b(?:ppl|perplexit(?:y|ies))\s+(?:of\s+|is\s+|at\s+)?(\d[\d,]*\.\d+)")
#: figures that are settings or definitions, not measurements, wherever they appear
SETTINGS = {"50 %", "60 %", "70 %", "80 %", "95 %", "1 %", "0.1 %", "50%", "60%", "70%", "95%", "1%", "1.4826 ×", "99.9 %"}


def _prose(text: str) -> str:
    """The page without its generated blocks, code blocks and inline code."""
    text = re.sub(r"<!-- figures:([\w-]+) -->\n.*?<!-- /figures:\1 -->", "", text, flags=re.S)
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text)}


def unsourced_figures(text: str) -> list[str]:
    """Figures with a unit in the page's prose that neither its blocks hold nor SETTINGS lists."""
    held = _numbers("".join(blocks(text).values()))
    prose = _prose(text)
    found = []
    for m in _FIGURE.finditer(prose):
        figure = f"{m.group(1)} {m.group(2)}"
        if figure in SETTINGS or m.group(0) in SETTINGS or m.group(1).replace(",", "") in held:
            continue
        found.append(m.group(0))
    found += [m.group(0) for m in _NAMED_FIGURE.finditer(prose) if m.group(1).replace(",", "") not in held]
    return found


def check(page: Path) -> list[str]:
    """What is wrong with a page: blocks that differ from their sources, unknown blocks, figures
    quoted in prose that its blocks do not hold."""
    text = page.read_text()
    rel = page.relative_to(REPO) if page.is_relative_to(REPO) else page
    unknown = sorted(set(blocks(text)) - set(SOURCES))
    if unknown:
        return [f"{rel}: unknown figure blocks {unknown}; known: {sorted(SOURCES)}"]
    new, done = render_all(text)
    problems = [f"{rel}: block {n} differs from {_names(SOURCES[n][0])} (run python tools/readme_figures.py)"
                for n in done if blocks(new)[n] != blocks(text)[n]]
    problems += [f"{rel}: figure {f!r} in prose is in none of the page's generated blocks (quote it through a block)"
                 for f in unsourced_figures(text)]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare only; exit 1 if a block differs from its source or prose quotes a figure no block holds")
    parser.add_argument("--page", "--readme", dest="pages", action="append",
                        help="a page to regenerate or check (repeatable; default: README.md, config/README.md, docs/**.md)")
    parser.add_argument("names", nargs="*", help="blocks to regenerate (default: all whose source exists)")
    args = parser.parse_args()
    targets = [Path(p) for p in args.pages] if args.pages else pages()
    if args.check:
        problems = [problem for page in targets for problem in check(page)]
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for page in targets:
        text = page.read_text()
        unknown = set(blocks(text)) - set(SOURCES)
        if unknown:
            print(f"{page}: unknown figure blocks {sorted(unknown)}; known: {sorted(SOURCES)}", file=sys.stderr)
            return 2
        new, done = render_all(text, set(args.names))
        if new != text:
            page.write_text(new)
        if done:
            print(f"regenerated {', '.join(done)} in {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
