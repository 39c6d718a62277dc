"""The comparison the eval-parity scripts share (resnet_parity_torch.py, vit_parity_torch.py):
a torch.nn model loads loom's saved weights strictly, evaluates loom's saved batch, and the
cross-entropy losses and logits are set side by side.

<out>/model.safetensors holds the state_dict under the torch model's names; <out>/batch.safetensors
holds "images", "labels" and loom's eval-mode "logits" and "loss".
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from reference_train_torch import read_safetensors  # noqa: E402  (the format, without the safetensors package)


def compare_eval(model, out, description, tolerance):
    """Prints the loss of both, their relative difference and the largest logit difference;
    returns the exit code: 0 if the relative loss difference is at most `tolerance`."""
    model.load_state_dict(read_safetensors(os.path.join(out, "model.safetensors")), strict=True)
    model.eval()
    batch = read_safetensors(os.path.join(out, "batch.safetensors"))
    with torch.no_grad():
        logits = model(batch["images"])
        loss = F.cross_entropy(logits, batch["labels"]).item()
    loom_loss = batch["loss"].item()
    rel = abs(loss - loom_loss) / abs(loss)
    logit_diff = (logits - batch["logits"]).abs().max().item()
    params = sum(t.numel() for t in model.parameters())
    print(f"{description} ({params:,} parameters), torch {torch.__version__}:")
    print(f"  loss: loom {loom_loss:.9g}  torch {loss:.9g}  relative difference {rel:.3g}")
    print(f"  logits: max |loom - torch| = {logit_diff:.3g} (largest |logit| {logits.abs().max().item():.3g})")
    ok = rel <= tolerance
    print(f"{'PASS' if ok else 'FAIL'}: relative loss difference {rel:.3g} {'<=' if ok else '>'} {tolerance:g}")
    return 0 if ok else 1
