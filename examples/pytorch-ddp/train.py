"""Single-GPU PyTorch code made distributed with DistributedDataParallel.

What changed from the one-process script it was (marked `# DDP` below): the process group
is initialised from the variables torchrun sets (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
RANK, LOCAL_RANK; the platform runs `torchrun` on every learner), the model is wrapped in
DistributedDataParallel (gradients averaged across every process at each step: Gloo on
CPU, NCCL on GPUs), and a DistributedSampler gives each process its own shard of the data.

It makes its own data (a noisy linear classification problem, the same on every process),
logs `epoch=E loss=L accuracy=A` lines (the manifest's evaluation_metrics regexes read
them) and TensorBoard scalars into LOG_DIR (torch.utils.tensorboard), saves a checkpoint
into CHECKPOINT_DIR after every epoch and resumes from the last one it finds (the platform
restores CHECKPOINT_DIR before a retried attempt), prints a digest of its parameters at
the end (identical on every rank: DDP keeps the replicas in step) and, on rank 0, exports
the model as ONNX to RESULT_DIR/model/model.onnx (input `features`, output `logits`, a
symbolic batch dimension, the weights inside the file: torch.export's exporter, or with
`--onnx-exporter torchscript` the older TorchScript one, which takes a second).

    python train.py --epochs 5           # one process, as it always ran
    torchrun --nproc_per_node=2 train.py # two, on one machine
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, CLASSES = 16, 4


def make_data(samples: int) -> TensorDataset:
    """The same data on every process (a fixed seed): each takes its shard of it."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ w + 0.1 * torch.randn(samples, CLASSES, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def checkpoint_path(directory: Path, epoch: int) -> Path:
    # One file per learner: on Kubernetes each learner has a CHECKPOINT_DIR of its own.
    return directory / f"learner-{os.environ.get('LEARNER_ID', '1')}-epoch-{epoch}.pt"


def last_checkpoint(directory: Path) -> int:
    prefix = f"learner-{os.environ.get('LEARNER_ID', '1')}-epoch-"
    epochs = [
        int(p.name[len(prefix) : -3])
        for p in directory.glob(prefix + "*.pt")
        if p.name[len(prefix) : -3].isdigit()
    ]
    return max(epochs, default=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    # Seconds each epoch takes at least (to watch it, or to stop it mid-run).
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    # Wait after this epoch's checkpoint on a first attempt (one that resumed nothing), as
    # a node lost mid-run would: a retry resumes from it.
    parser.add_argument("--hang-after", type=int, default=0)
    parser.add_argument("--onnx-exporter", choices=("dynamo", "torchscript"), default="dynamo")
    # Threads for torch's operators (default: torch's, one per CPU). Learners sharing one
    # machine's CPUs each start that many; 1 keeps two learners on two CPUs from
    # oversubscribing them, as torchrun's own OMP_NUM_THREADS=1 does for its local workers.
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    # DDP: one process group over every process torchrun started (backend by device:
    # Gloo for CPU tensors, NCCL for CUDA ones).
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)

    data = make_data(args.samples)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    checkpoints = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    checkpoints.mkdir(parents=True, exist_ok=True)
    start = last_checkpoint(checkpoints)
    if distributed:
        # Every learner resumes from the same epoch: the last one all of them saved.
        agreed = torch.tensor([start], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        start = int(agreed.item())
    if start:
        state = torch.load(
            checkpoint_path(checkpoints, start), map_location=device, weights_only=True
        )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        print(f"rank={rank} resumed from checkpoint epoch {start}", flush=True)
    ddp = DistributedDataParallel(model) if distributed else model  # DDP

    writer = None
    if local_rank == 0 and os.environ.get("LOG_DIR"):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.environ["LOG_DIR"])
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start + 1, args.epochs + 1):
        began = time.monotonic()
        sampler.set_epoch(epoch)  # DDP: a new shuffle each epoch, the same on every rank
        total, correct, seen = 0.0, 0, 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            out = ddp(x)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            correct += int((out.argmax(dim=1) == y).sum())
            seen += len(y)
        print(
            f"rank={rank} epoch={epoch} loss={total / seen:.5f} accuracy={correct / seen:.4f}",
            flush=True,
        )
        if writer is not None:
            writer.add_scalar("loss", total / seen, epoch)
            writer.add_scalar("accuracy", correct / seen, epoch)
            writer.flush()
        if local_rank == 0:
            path = checkpoint_path(checkpoints, epoch)
            tmp = path.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
            tmp.replace(path)
            checkpoint_path(checkpoints, epoch - 2).unlink(missing_ok=True)
            print(f"rank={rank} checkpointed epoch {epoch}", flush=True)
        time.sleep(max(0.0, args.epoch_seconds - (time.monotonic() - began)))
        if epoch == args.hang_after and not start:
            time.sleep(3600)

    print(f"rank={rank} world_size={world} param_digest={digest(model)}", flush=True)
    if rank == 0 and os.environ.get("RESULT_DIR"):
        target = Path(os.environ["RESULT_DIR"]) / "model" / "model.onnx"
        target.parent.mkdir(parents=True, exist_ok=True)
        model.eval()
        example = torch.randn(2, FEATURES)
        if args.onnx_exporter == "dynamo":
            torch.onnx.export(
                model.cpu(),
                (example,),
                str(target),
                input_names=["features"],
                output_names=["logits"],
                dynamic_shapes=({0: torch.export.Dim("batch")},),
                dynamo=True,
                # The weights inside model.onnx: one file, nothing beside it to deploy.
                external_data=False,
            )
        else:
            torch.onnx.export(
                model.cpu(),
                (example,),
                str(target),
                input_names=["features"],
                output_names=["logits"],
                dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}},
                dynamo=False,
            )
        print(f"exported {target}", flush=True)
    if writer is not None:
        writer.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
