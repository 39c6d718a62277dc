#!/usr/bin/env python3
"""One parameter's shards on the mesh, FSDP1 against FSDP2 (docs/fsdp.md): which elements of a
[9, 6] weight each of 4 ranks holds under --dp-shard 2 --tp 2, drawn from the boxes loom's
own cut computes (build/examples/mesh --parameter: the boxes a sharded checkpoint records).

    meson compile -C build examples/mesh
    python3 bench/shard_picture.py            # writes docs/img/fsdp_shards.svg

No plotting library: the SVG is written directly, so the picture redraws anywhere.
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"]
CELL = 26


def boxes(a, layout):
    cmd = [a.mesh, "--world", str(a.dp_shard * a.tp), "--pp", "1", "--dp-shard", str(a.dp_shard), "--tp", str(a.tp),
           "--parameter", f"{a.rows},{a.cols}", "--tp-dim", str(a.tp_dim), "--fsdp-layout", layout]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def panel(x0, y0, title, ranks, a):
    parts = [f'<text x="{x0}" y="{y0 - 10}" font-size="14" font-weight="bold">{title}</text>']
    for r in ranks:
        for b in r["boxes"]:
            (i, j), (h, w) = b["offsets"], b["sizes"]
            parts.append(f'<rect x="{x0 + j * CELL}" y="{y0 + i * CELL}" width="{w * CELL}" height="{h * CELL}" '
                         f'fill="{COLORS[r["rank"] % len(COLORS)]}" fill-opacity="0.8" stroke="black" stroke-width="2"/>')
            parts.append(f'<text x="{x0 + (j + w / 2) * CELL}" y="{y0 + (i + h / 2) * CELL + 5}" font-size="12" '
                         f'text-anchor="middle" fill="white">{r["rank"]}</text>')
    for i in range(a.rows + 1):  # the element grid
        parts.append(f'<line x1="{x0}" y1="{y0 + i * CELL}" x2="{x0 + a.cols * CELL}" y2="{y0 + i * CELL}" '
                     f'stroke="white" stroke-width="0.5"/>')
    for j in range(a.cols + 1):
        parts.append(f'<line x1="{x0 + j * CELL}" y1="{y0}" x2="{x0 + j * CELL}" y2="{y0 + a.rows * CELL}" '
                     f'stroke="white" stroke-width="0.5"/>')
    return parts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=9)
    p.add_argument("--cols", type=int, default=6)
    p.add_argument("--dp-shard", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--tp-dim", type=int, default=1)
    p.add_argument("--mesh", default=os.path.join(ROOT, "build", "examples", "mesh"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "fsdp_shards.svg"))
    a = p.parse_args()
    flat, rows = boxes(a, "flat"), boxes(a, "per_parameter")
    width = 2 * a.cols * CELL + 3 * 40
    legend_y = 50 + a.rows * CELL + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 40}" height="{legend_y + 20 * len(rows) + 30}" '
             f'font-family="sans-serif">', '<rect width="100%" height="100%" fill="white"/>']
    parts += panel(40, 50, "FSDP1: flat slices", flat, a)
    parts += panel(80 + a.cols * CELL, 50, "FSDP2: rows", rows, a)
    for k, r in enumerate(rows):
        y = legend_y + 20 * k
        parts.append(f'<rect x="40" y="{y - 12}" width="14" height="14" fill="{COLORS[r["rank"] % len(COLORS)]}"/>')
        parts.append(f'<text x="60" y="{y}" font-size="12">rank {r["rank"]}: dp_shard {r["dp_shard"]}, tp {r["tp"]}</text>')
    parts.append(f'<text x="40" y="{legend_y + 20 * len(rows) + 10}" font-size="11">a [{a.rows}, {a.cols}] weight, '
                 f'tp cuts dim {a.tp_dim}; redraw: python3 bench/shard_picture.py</text>')
    parts.append("</svg>")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(parts) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
