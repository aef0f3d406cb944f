"""PNG plots from the same specs as the report tables (``fedlib plot --spec JSON --out PNG``).

A plot spec is a table spec (see :mod:`fedlib.report`) whose rows also carry ``x`` (a
number: clients, calibration samples, sparsity) and ``series`` (the line they belong to);
``reference`` rows (e.g. Dense) have no ``x`` and are drawn as horizontal lines; ``plot``
holds ``xlabel`` and optionally ``xscale`` (``linear``/``log2``), ``xformat``
(``int``/``percent``), ``yscale`` (``log``/``linear``) and ``panels`` (value keys to plot;
default every value column of the measure: one panel per perplexity dataset, the mean
accuracy for zero-shot). A row with several result files (Local-only over clients) is
drawn at its mean with a ± std error bar. The caption under the axes is the table header:
model and fingerprint, config and its hash, seed, fedlib version and commit, setting and
evaluation windows. Matplotlib runs with the Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import textwrap
from pathlib import Path

HELP = "draw a PNG plot (perplexity or accuracy vs a swept setting) from a plot spec"

PANEL_WIDTH_IN = 4.2
MIN_WIDTH_IN = 6.0
HEIGHT_IN = 5.6
DPI = 110


def figure_size(panels: int) -> tuple[int, int]:
    """Pixel size (width, height) of a plot with ``panels`` panels."""
    width = max(MIN_WIDTH_IN, PANEL_WIDTH_IN * panels)
    return round(width * DPI), round(HEIGHT_IN * DPI)


def load_spec(value: str) -> dict:
    """A spec given as JSON text, or the path of a JSON file."""
    text = value if value.lstrip().startswith("{") else Path(value).read_text()
    return json.loads(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, help="JSON text (or a JSON file): a table spec whose rows have x and series")
    p.add_argument("--out", required=True, help="PNG file")


def _point(measure, results: list[dict], key: str) -> tuple[float, float]:
    values = [measure.value(r, key) for r in results]
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _set_yscale(ax, yscale: str) -> None:
    """``log``, ``linear``, or ``auto``: log when the plotted values span more than a decade.
    Tick labels are plain numbers (no offsets, no 4.93 x 10^4 minor labels)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    if yscale == "auto":
        low, high = ax.dataLim.y0, ax.dataLim.y1
        yscale = "log" if low > 0 and high / low > 10 else "linear"
    ax.set_yscale(yscale)
    if yscale == "log":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)


def write_plot(spec: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    from fedlib.io import atomic_path
    from fedlib.report import MEAN_KEY, load_rows, provenance_lines

    options = spec.get("plot", {})
    rows = [row for row in spec["rows"] if row.get("x") is not None]
    if not rows:
        raise ValueError("plot spec has no row with an x value")
    measure, loaded = load_rows({**spec, "rows": rows})
    references = spec.get("reference", [])
    ref_loaded = [[json.loads(Path(p).read_text()) for p in ref["results"]] for ref in references]
    example = loaded[0][0]
    columns = dict(measure.columns(example))
    keys = options.get("panels") or ([MEAN_KEY] if measure.name == "zeroshot" else list(columns))
    unknown = [k for k in keys if k not in columns]
    if unknown:
        raise ValueError(f"plot panels {unknown} are not value columns of the {measure.name} results ({list(columns)})")

    series: dict[str, list[tuple[float, list[dict]]]] = {}
    for row, results in zip(rows, loaded):
        series.setdefault(row["series"], []).append((float(row["x"]), results))

    width_px, height_px = figure_size(len(keys))
    fig = plt.figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    fig.suptitle(spec["title"], fontsize=10, y=0.985)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    chars = int(width_px / DPI * 17)  # caption characters per line at 6.5 pt
    caption = "\n".join(textwrap.fill(line, chars) for line in provenance_lines(spec["context"], example, measure))
    caption_in = (caption.count("\n") + 1) * 6.5 * 1.3 / 72  # caption height in inches
    fig.subplots_adjust(left=0.07 if len(keys) > 1 else 0.11, right=0.98, top=0.78,
                        bottom=min(0.5, (caption_in + 0.7) / HEIGHT_IN), wspace=0.28)
    xs = sorted({float(row["x"]) for row in rows})
    ylabel = options.get("ylabel", "perplexity" if measure.name == "perplexity" else "accuracy (%)")
    yscale = options.get("yscale", "auto" if measure.name == "perplexity" else "linear")
    markers = "osD^v<>ph*"
    for ax, key in zip(axes, keys):
        for i, (name, points) in enumerate(series.items()):
            points.sort(key=lambda p: p[0])
            stats = [_point(measure, results, key) for _, results in points]
            ax.errorbar([p[0] for p in points], [m for m, _ in stats], yerr=[s for _, s in stats],
                        marker=markers[i % len(markers)], markersize=4, linewidth=1.3, capsize=3, label=name)
        for ref, results in zip(references, ref_loaded):
            mean, _ = _point(measure, results, key)
            ax.axhline(mean, color="0.35", linestyle="--", linewidth=1, label=ref["series"])
        if options.get("xscale") == "log2":
            ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(xs))
        ax.xaxis.set_minor_locator(NullLocator())
        fmt = options.get("xformat", "int")
        ax.set_xticklabels([f"{x:.0%}" if fmt == "percent" else f"{x:g}" for x in xs])
        _set_yscale(ax, yscale)
        ax.set_xlabel(options.get("xlabel", spec["columns"][0]))
        ax.set_ylabel(ylabel)
        ax.set_title(columns[key], fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.945), ncol=min(4, len(labels)),
               fontsize=7.5, frameon=False)
    fig.text(0.01, 0.015, caption, fontsize=6.5, va="bottom", ha="left", color="0.2")
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=DPI, format="png")
    plt.close(fig)
    return out


def run(args) -> None:
    """The ``fedlib plot`` verb."""
    out = write_plot(load_spec(args.spec), Path(args.out))
    print(f"wrote {out}")
