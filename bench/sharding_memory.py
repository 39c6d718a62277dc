"""What each rank keeps under DDP, ZeRO-1 and FSDP's strategies, measured against the
formulas of docs/sharding.md: ResNet18 (CIFAR) trained two steps with SGD and momentum (and
ViT-tiny with AdamW) on
N = 2, 3 and 4 processes (loomrun), each rank's model state (parameters, gradients, momenta:
nn::model_state_bytes) and allocator peak as rank 0 prints them.

    python3 bench/sharding_memory.py --table zero1 --out bench/results/sharding_zero1.json
    python3 bench/sharding_memory.py --table zero1_adamw --out bench/results/sharding_zero1_adamw.json
    python3 bench/sharding_memory.py --table fsdp --out bench/results/sharding_fsdp.json

Memory does not depend on timing: two steps on a busy machine measure it exactly.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
import trainer_runs  # noqa: E402

PARAMETERS = 11_173_962  # Ψ, ResNet18 (CIFAR stem, 10 classes)
VIT_TINY_PARAMETERS = 5_362_762  # Ψ, vit_tiny (patch 4, 10 classes)
MIB = 2**20


def zero1_table(args, n, flags, psi, state_bytes):
    """DDP against ZeRO-1 with `flags` (the model and optimizer): the formulas say
    state_bytes·Ψ per rank under DDP, of which the optimizer's share is sharded N ways."""
    common = ["--mode", "ddp", *flags, "--max-steps", str(args.steps), "--batch-size", str(args.batch_size)]
    ddp = trainer_runs.train(args.build, n, common)
    zero = trainer_runs.train(args.build, n, common + ["--zero-redundancy-optimizer"])
    optimizer_bytes = state_bytes - 8  # what is not parameters and gradients (4 + 4 bytes)
    return {"n": n, "ddp_formula": state_bytes * psi / MIB, "ddp_state": trainer_runs.per_rank(ddp["state_mib"]),
            "ddp_peak": trainer_runs.per_rank(ddp["peak_mib"]),
            "zero_formula": (8 * psi + optimizer_bytes * psi / n) / MIB, "zero_state": zero["state_mib"],
            "zero_peak": zero["peak_mib"]}


def zero1_row(args, n):
    return zero1_table(args, n, [], PARAMETERS, 12)  # ResNet18 (the default model), SGD with momentum


def zero1_adamw_row(args, n):
    """AdamW keeps two moments per parameter: 16 bytes a parameter under DDP, 8Ψ + 8Ψ/N
    under ZeRO-1 (weight decay 0: ZeRO-1 takes one parameter group)."""
    return zero1_table(args, n, ["--model", "vit_tiny", "--optimizer", "adamw", "--weight-decay", "0"],
                       VIT_TINY_PARAMETERS, 16)


def fsdp_row(args, n):
    common = ["--max-steps", str(args.steps), "--batch-size", str(args.batch_size)]
    ddp = trainer_runs.train(args.build, n, common + ["--mode", "ddp"])
    state = {s: trainer_runs.train(args.build, n, common + ["--mode", "fsdp", "--sharding-strategy", s])["state_mib"]
             for s in ("full_shard", "shard_grad_op", "no_shard")}
    return {"n": n, "ddp_state": trainer_runs.per_rank(ddp["state_mib"]), "full_formula": 12 * PARAMETERS / n / MIB,
            **{s: trainer_runs.per_rank(v) for s, v in state.items()},
            "full_over_ddp": max(state["full_shard"]) / max(ddp["state_mib"])}


def zero1_columns(ddp_bytes, optimizer_bytes):
    """The DDP-against-ZeRO-1 table's columns, its formulas written for these bytes per parameter."""
    return [{"key": "n", "title": "N"},
            {"key": "ddp_formula", "title": f"DDP formula {ddp_bytes}Ψ", "format": ".1f"},
            {"key": "ddp_state", "title": "DDP measured", "format": ".1f"},
            {"key": "ddp_peak", "title": "DDP peak", "format": ".1f"},
            {"key": "zero_formula", "title": f"ZeRO-1 formula 8Ψ + {optimizer_bytes}Ψ/N", "format": ".1f"},
            {"key": "zero_state", "title": "ZeRO-1 measured (each rank)", "format": ".1f"},
            {"key": "zero_peak", "title": "ZeRO-1 peak (each rank)", "format": ".1f"}]


TABLES = {
    "zero1": (zero1_row, 4,
              "DDP and ZeRO-1 on ResNet18 (CIFAR), SGD with momentum, float32, batch {batch} per rank, {steps} steps: "
              "model state and peak per rank in MiB (one figure where every rank has the same, else each rank's)",
              zero1_columns(12, 4)),
    "zero1_adamw": (zero1_adamw_row, 4,
                    "DDP and ZeRO-1 on ViT-tiny with AdamW (weight decay 0), float32, batch {batch} per rank, "
                    "{steps} steps: model state and peak per rank in MiB (one figure where every rank has the same, "
                    "else each rank's)",
                    zero1_columns(16, 8)),
    "fsdp": (fsdp_row, 8,
             "FSDP's strategies on ResNet18 (CIFAR), SGD with momentum, float32, batch {batch} per rank, {steps} steps: "
             "model state per rank at the end of a step in MiB (one figure where every rank has the same, else each "
             "rank's)",
             [{"key": "n", "title": "N"},
              {"key": "ddp_state", "title": "DDP", "format": ".1f"},
              {"key": "full_formula", "title": "`FULL_SHARD` formula 12Ψ/N", "format": ".1f"},
              {"key": "full_shard", "title": "`FULL_SHARD` measured", "format": ".1f"},
              {"key": "shard_grad_op", "title": "`SHARD_GRAD_OP` measured", "format": ".1f"},
              {"key": "no_shard", "title": "`NO_SHARD` measured", "format": ".1f"},
              {"key": "full_over_ddp", "title": "`FULL_SHARD` / DDP", "format": ".2f",
               "ratio_of": "full_shard / ddp_state"}]),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=sorted(TABLES), required=True)
    parser.add_argument("--degrees", default="2,3,4", help="the numbers of ranks N")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, help="per rank (default: 4 for zero1, 8 for fsdp)")
    parser.add_argument("--build", default=os.path.join(results_file.ROOT, "build"))
    parser.add_argument("--out", help="write the results file (bench/report.py renders it into docs/)")
    args = parser.parse_args()
    row_of, batch, title, columns = TABLES[args.table]
    args.batch_size = args.batch_size or batch
    started = results_file.now()
    rows = []
    for n in map(int, args.degrees.split(",")):
        rows.append(row_of(args, n))
        print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    if args.out:
        title = title.format(batch=args.batch_size, steps=args.steps)
        results_file.write(args.out, results_file.document(title, "sharding_memory.py", columns, rows, [], started))


if __name__ == "__main__":
    main()
