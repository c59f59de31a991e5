"""Train a tiny decoder-only transformer on CPU and report it to gpumon through the SDK.

The model trains on the CPU but reports as if it ran on NVML GPU ``--device``, so a daemon started with
``--simulate`` attributes the rank to a simulated GPU and computes MFU against that GPU's peak. At the end the
script computes its OWN tokens/s and MFU over the same span the daemon uses (first step() call to last) and
writes them to ``--out``, so the two can be compared::

    gpumon serve --simulate 1xH100-SXM &
    pip install torch --index-url https://download.pytorch.org/whl/cpu   # the CPU build is enough
    python examples/train_tiny.py --steps 200 --device 0 --peak-flops 67e12
    gpumon diagnose --job train-tiny

Standard library + torch only (plus gpumon.client, which is itself standard library only).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

# the CPU build of torch warns on import when NumPy is absent; this script never converts to NumPy
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
from torch import nn  # noqa: E402

from gpumon.client import Reporter  # noqa: E402
from gpumon.client.model import ModelSpec  # noqa: E402

VOCAB = 256
HIDDEN = 128
HEADS = 4
LAYERS = 2


class TinyLM(nn.Module):
    """Pre-norm decoder-only transformer with learned positions and tied input/output embeddings."""

    def __init__(self, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(seq_len, HIDDEN)
        layer = nn.TransformerEncoderLayer(
            HIDDEN, HEADS, dim_feedforward=4 * HIDDEN, dropout=0.0, batch_first=True, norm_first=True
        )
        # enable_nested_tensor only matters for padded inference; off avoids a warning with norm_first
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2 and PaLM
        # GPT-2's init: nn.Embedding's N(0, 1) through a tied head starts the loss far above log(VOCAB)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def model_spec(model: TinyLM, seq_len: int) -> ModelSpec:
    """The SDK's shape description of TinyLM: GPT-2 style (plain GeLU MLP, biases, learned positions, tied
    head). Checked against the real module so the FLOPs cannot silently describe a different model."""
    spec = ModelSpec(
        layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, seq_len=seq_len, gated_mlp=False,
        tied_embeddings=True, biases=True, learned_positions=True, name="train_tiny",
    )  # fmt: skip
    actual = sum(p.numel() for p in model.parameters())  # parameters() counts the tied weight once
    if spec.parameters() != actual:
        raise RuntimeError(f"ModelSpec counts {spec.parameters()} parameters, the model has {actual}")
    return spec


def make_batch(gen: torch.Generator, batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    # a learnable stream (each row counts up by its own stride), so the loss visibly falls
    start = torch.randint(0, VOCAB, (batch, 1), generator=gen)
    stride = torch.randint(1, 8, (batch, 1), generator=gen)
    seq = (start + stride * torch.arange(seq_len + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--job", default="train-tiny")
    p.add_argument("--url", default=None, help="daemon URL (default: the SDK's, GPUMON_URL or loopback)")
    p.add_argument("--device", default="0", help="NVML GPU index or UUID to attribute this rank to")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--report-interval", type=float, default=None, help="seconds between reports")
    p.add_argument("--peak-flops", type=float, default=None, help="per-GPU peak FLOP/s for the script's MFU")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument(
        "--data-delay", type=float, default=0.0, metavar="SECONDS",
        help="a slow input pipeline: wait this long for each batch (the daemon calls the job input-bound)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="also write the printed figures to this JSON file")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2: throughput is measured between the first and the last step")
    if not 0.0 <= args.data_delay <= 60.0:
        p.error("--data-delay must be from 0 to 60 seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TinyLM(args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # PaLM convention, 6N + 12·L·H·Q·T; N keeps the tied output head, which does matmul work (see ModelSpec)
    fpt = model_spec(model, args.seq).flops_per_token(train=True, convention="palm")
    tokens_per_step = args.batch * args.seq
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    reporter = Reporter(
        job=args.job, device=args.device, kind="train", workload="train_tiny", dtype=args.dtype,
        flops_per_token=fpt, flops_convention="palm", url=args.url, interval=args.report_interval,
    )  # fmt: skip
    first = last = 0.0
    loss = torch.zeros(())
    for step in range(args.steps):
        with reporter.data_wait():
            inputs, targets = make_batch(gen, args.batch, args.seq)
            if args.data_delay:
                time.sleep(args.data_delay)
        with reporter.forward_backward():
            with autocast:
                logits = model(inputs)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
        with reporter.optimizer():
            opt.step()
            opt.zero_grad(set_to_none=True)
        reporter.step(tokens=tokens_per_step, samples=args.batch)
        # timed right after step(), like the reporter's own clock: the first call only starts the clock
        last = time.perf_counter()
        if step == 0:
            first = last

    # same span as the daemon: tokens of steps 2..N over the time between the first and the last step()
    tokens_per_second = (args.steps - 1) * tokens_per_step / (last - first)
    mfu = tokens_per_second * fpt / args.peak_flops if args.peak_flops else None
    reporter.close()
    result = {
        "tokens_per_second": tokens_per_second,
        "mfu": mfu,
        "flops_per_token": fpt,
        "steps": args.steps,
        "tokens": args.steps * tokens_per_step,
        "job": args.job,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"final loss {loss.item():.3f} (uniform guess: {math.log(VOCAB):.3f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
