"""In the style of horovod's pytorch_synthetic_benchmark.py: a large model (8.4 M parameters)
with hvd.DistributedOptimizer (its fused allreduce, several 25 MB buckets), each worker reading
its own rows of a synthetic dataset."""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark")
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--batch-size", type=int, default=8, help="input batch size")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--num-iters", type=int, default=64, help="samples in the synthetic set")
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)

model = nn.Sequential(
    nn.Linear(1024, 2048), nn.Tanh(),
    nn.Linear(2048, 2048), nn.Tanh(),
    nn.Linear(2048, 1024), nn.Tanh(),
    nn.Linear(1024, 1),
)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size())
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

features = torch.randn(args.num_iters, 1024)
targets = features[:, :8].sum(dim=1, keepdim=True)
# Horovod: every worker takes its own rows.
features, targets = features[hvd.rank()::hvd.size()], targets[hvd.rank()::hvd.size()]

for start in range(0, len(features), args.batch_size):
    data, target = features[start:start + args.batch_size], targets[start:start + args.batch_size]
    optimizer.zero_grad()
    loss = F.mse_loss(model(data), target)
    loss.backward()
    optimizer.step()
    if hvd.rank() == 0:
        print("Iter: loss %.4f" % loss.item())

if hvd.rank() == 0:
    torch.save(model.state_dict(), "synthetic.pt")
