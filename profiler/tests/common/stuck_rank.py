import os
import time
import torch
import torch.distributed as dist

def stuck_in_here():
    time.sleep(float(os.environ.get("STUCK_SECONDS", "15")))

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(15):
    if rank == 1 and i == 12:
        stuck_in_here()
    model(torch.randn(4, 8)).sum().backward()
    dist.all_reduce(torch.ones(4))
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
print("trained")
