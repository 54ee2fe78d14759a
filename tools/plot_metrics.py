#!/usr/bin/env python3
"""Training curves from mnist-train --metrics files, several runs on one chart.

    tools/plot_metrics.py compiled.jsonl eager.jsonl -o curves.png
    tools/plot_metrics.py seed1.jsonl seed2.jsonl seed3.jsonl --label 1 --label 2 --label 3 -o seeds.svg

Train loss (solid) and test loss (dashed) above, test accuracy below, against epochs; one colour
per run, labelled with the file's name or --label. Rows with a fractional "epoch" (evaluations
within an epoch) are drawn where they fall. The output's extension picks the format: .png, .svg
or .pdf. Needs matplotlib (pip install matplotlib); without it, exit status 2 and a message.
Exit status 1 for an unreadable or malformed metrics file, 2 for a usage error.
"""

import argparse
import json
import math
import os
import sys

CURVES = ("train_loss", "test_loss", "test_accuracy")
FORMATS = (".png", ".svg", ".pdf")


def fail(message, status=1):
    print(f"plot_metrics: {message}", file=sys.stderr)
    sys.exit(status)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_run(path):
    """The rows of one --metrics file, checked: each has a numeric epoch and numeric curves."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})")
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path}:{n}: expected a JSON object per line ({e.msg})")
        if not isinstance(row, dict) or not is_number(row.get("epoch")):
            fail(f'{path}:{n}: expected an object with a numeric "epoch"')
        present = [k for k in CURVES if k in row]
        if not present:
            fail(f"{path}:{n}: expected at least one of {', '.join(CURVES)}")
        for k in present:
            if not is_number(row[k]):
                fail(f'{path}:{n}: expected a number for "{k}", got {json.dumps(row[k])}')
        rows.append(row)
    if not rows:
        fail(f"{path}: no metrics rows (expected the JSON lines mnist-train --metrics writes)")
    return rows


def curve(rows, key, scale=1.0):
    """(epochs, values) of the rows that have `key`, non-finite values left out."""
    points = [(r["epoch"], r[key] * scale) for r in rows if key in r and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="plot_metrics.py",
        description="Draw train/test loss and test accuracy from mnist-train --metrics JSONL files.",
    )
    p.add_argument("metrics", nargs="+", help="JSONL files written by mnist-train --metrics")
    p.add_argument("-o", "--output", required=True, help="the chart to write: .png, .svg or .pdf")
    p.add_argument("--label", action="append", default=[], help="one per file, in order (default: file names)")
    p.add_argument("--title", default=None, help="the chart's title")
    args = p.parse_args(argv)
    if os.path.splitext(args.output)[1].lower() not in FORMATS:
        p.error(f"--output {args.output}: expected a name ending in {', '.join(FORMATS)}")
    if args.label and len(args.label) != len(args.metrics):
        p.error(f"{len(args.label)} --label for {len(args.metrics)} files: give one per file or none")
    return args


def default_labels(paths):
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    return names if len(set(names)) == len(names) else list(paths)


def draw(runs, title, output):
    # Imported only now, so that usage and input errors are reported without matplotlib.
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        fail(f"matplotlib is needed to draw the chart ({e}); pip install matplotlib", status=2)

    fig, (loss_ax, acc_ax) = plt.subplots(2, 1, sharex=True, figsize=(9, 7.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rows) in enumerate(runs):
        color = colors[i % len(colors)]
        marker = "o" if len(rows) <= 40 else None
        loss_ax.plot(*curve(rows, "train_loss"), color=color, marker=marker, ms=3, label=f"{label}: train")
        loss_ax.plot(*curve(rows, "test_loss"), color=color, marker=marker, ms=3, ls="--", label=f"{label}: test")
        acc_ax.plot(*curve(rows, "test_accuracy", 100), color=color, marker=marker, ms=3, label=label)
    loss_ax.set_ylabel("cross-entropy loss")
    loss_ax.set_ylim(bottom=0)
    acc_ax.set_ylabel("test accuracy (%)")
    acc_ax.set_xlabel("epoch")
    for ax in (loss_ax, acc_ax):
        ax.grid(True, color="#e3e3e3")
    if all(float(r["epoch"]).is_integer() for _, rows in runs for r in rows):
        acc_ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no 1.5 ticks between whole epochs
    if len(runs) == 1:
        loss_ax.legend(loc="upper right")
    else:  # colours name the runs, line styles the loss
        styles = [Line2D([], [], color="#444", label="train loss"), Line2D([], [], color="#444", ls="--", label="test loss")]
        loss_ax.legend(handles=styles, loc="upper right")
        acc_ax.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()

    # A temporary file renamed over the output, as mnist-train writes --plot: never half a chart.
    base, ext = os.path.splitext(output)
    tmp = f"{base}.tmp-{os.getpid()}{ext}"
    try:
        fig.savefig(tmp, format=ext[1:].lower(), dpi=120)
        os.replace(tmp, output)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        fail(f"{output}: cannot write it ({e.strerror or e})")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    labels = args.label or default_labels(args.metrics)
    runs = [(label, read_run(path)) for label, path in zip(labels, args.metrics)]
    if args.title:
        title = args.title
    elif len(runs) == 1:
        precision = runs[0][1][-1].get("precision")
        title = f"{labels[0]}" + (f" (precision {precision})" if isinstance(precision, str) else "")
    else:
        title = "train and test loss, test accuracy: " + ", ".join(labels)
    draw(runs, title, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
