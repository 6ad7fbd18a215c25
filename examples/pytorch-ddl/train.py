"""Single-GPU PyTorch code made distributed with DDL's recipe (the open DDL's PyTorch API,
`import ddl`, run one process per GPU under mpirun by the platform's pytorch-ddl):

    import ddl                                     # initialises: rank, size, process group
    lr = args.lr * ddl.size()                      # the global batch grows with the learners
    x, y = x[ddl.rank()::ddl.size()], ...          # a disjoint shard per learner
    ddl.broadcast_parameters(model)                # every learner starts as rank 0
    optimizer = ddl.DistributedOptimizer(optimizer, check=...)  # gradients averaged

It makes its own data, logs `epoch=E loss=L` lines, checks once that `ddl.all_reduce_n`
agrees with a plain MPI_Allreduce (`check`), prints a digest of its parameters at the end
(identical on every rank), and rank 0 exports the model as ONNX to
RESULT_DIR/model/model.onnx (input `features`, output `logits`, a batch dimension of any
size: deployable for scoring) beside its weights (state_dict, model/weights.pt).
Without mpirun it is rank 0 of 1 and trains alone.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import ddl
import torch
from torch import nn

FEATURES, CLASSES = 16, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.02)
    # all_reduce_n's tolerance against MPI_Allreduce (0: not checked).
    parser.add_argument("--check", type=float, default=0.0)
    args = parser.parse_args()
    rank, size = ddl.rank(), ddl.size()

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(args.samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ w).argmax(dim=1)
    x, y = x[rank::size], y[rank::size]  # DDL: this learner's shard

    torch.manual_seed(100 + rank)  # different on purpose: the broadcast makes them equal
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    ddl.broadcast_parameters(model)
    optimizer = ddl.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9), check=args.check
    )

    if args.check:
        # The grouped all_reduce_n against MPI's, on tensors of mixed dtypes and shapes.
        mine = [torch.full((3, 4), float(rank + 1)), torch.arange(6) * (rank + 1)]
        summed = ddl.all_reduce_n(mine, op="sum", check=args.check)
        expected = sum(range(1, size + 1))
        assert torch.equal(summed[1], torch.arange(6) * expected), summed[1]
        print(
            f"rank={rank} all_reduce_n agrees with MPI_Allreduce (check={args.check})", flush=True
        )

    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(1, args.epochs + 1):
        total = 0.0
        for i in range(0, len(x), args.batch_size):
            xb, yb = x[i : i + args.batch_size], y[i : i + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(yb)
        mean = ddl.all_reduce_n([torch.tensor(total / len(x))], op="avg")[0].item()
        print(f"rank={rank} epoch={epoch} loss={mean:.5f}", flush=True)

    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    print(
        f"rank={rank} world_size={size} backend={ddl.backend()} param_digest={h.hexdigest()[:16]}",
        flush=True,
    )
    if rank == 0 and os.environ.get("RESULT_DIR"):
        target = Path(os.environ["RESULT_DIR"]) / "model" / "weights.pt"
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), target)
        model.eval()
        torch.onnx.export(
            model,
            (torch.randn(2, FEATURES),),
            str(target.with_name("model.onnx")),
            input_names=["features"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            dynamo=True,
            external_data=False,  # the weights inside model.onnx: one file to deploy
        )
        print(f"exported {target.with_name('model.onnx')}", flush=True)


if __name__ == "__main__":
    main()
