"""Ground truth for the pipeline finding (issue 27, item 6): PyTorch's pipelining tutorial
(``profiler/tests/fixtures/pytorch_tutorials/pipelining_tutorial.py``, GPipe over 2 stages and
4 micro-batches, stage 0 keeping ``--stage0-layers`` of the 8 decoder layers) under
``stallscope run -- torchrun``, against each stage's work measured alone.

Each stage's work per iteration is timed in one process with no communication: its forward of
the 4 micro-batches, its backward of them (the last stage from its loss, the first from a
gradient of its output's shape) and its optimizer step, the median of ``--iters`` iterations,
one thread each (torchrun sets ``OMP_NUM_THREADS=1``), in CPU time (``process_time``: on a
shared machine the wall time of work alone counts the other processes too). In the pipeline the iteration takes
``T``; a stage that works ``t_alone`` of it waits ``T - t_alone``: that is the truth to hold
stallscope's waiting of stage 0 (peer_wait + interconnect per iteration) against, and half the
difference of the two stages' work is what balancing them would move.

  python bench/pipeline_truth.py --python ~/.cache/stallscope/torch-2.9.1/bin/python
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "profiler/tests/fixtures/pytorch_tutorials/pipelining_tutorial.py")

ALONE = r"""
import os, statistics, sys, time
import torch
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import pipelining_tutorial as t
torch.set_num_threads(1)
torch.manual_seed(0)
k, iters = int(sys.argv[2]), int(sys.argv[3])
args = t.ModelArgs()
stages = {}
for s in (0, 1):
    m = t.Transformer(args)
    if s == 0:
        for i in range(k, 8):
            del m.layers[str(i)]
        m.norm = None
        m.output = None
    else:
        for i in range(k):
            del m.layers[str(i)]
        m.tok_embeddings = None
    stages[s] = m
x = torch.ones(8, 32, dtype=torch.long).chunk(4)
y = torch.randint(0, args.vocab_size, (8, 32)).chunk(4)
h = [stages[0](mb).detach() for mb in x]
loss_fn = torch.nn.CrossEntropyLoss()
out = {}
for s, m in stages.items():
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    times = []
    for _ in range(iters + 1):
        start = time.process_time()
        opt.zero_grad()
        outs = []
        for i in range(4):
            if s == 0:
                outs.append(m(x[i]))
            else:
                inp = h[i].clone().requires_grad_(True)
                outs.append(loss_fn(m(inp).reshape(-1, args.vocab_size), y[i].reshape(-1)))
        for o in outs:
            if s == 0:
                o.backward(torch.ones_like(o))
            else:
                o.backward()
        opt.step()
        times.append(time.process_time() - start)
    out[s] = statistics.median(times[1:])
print(out[0], out[1])
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=os.path.expanduser(
        "~/.cache/stallscope/torch-2.9.1/bin/python"))
    ap.add_argument("--stallscope", default=os.path.join(REPO, "target/debug/stallscope"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--stage0-layers", type=int, default=1)
    ap.add_argument("--port", type=int, default=29651)
    a = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        alone = subprocess.run(
            [a.python, "-c", ALONE, SCRIPT, str(a.stage0_layers), str(a.iters)],
            check=True, capture_output=True, text=True, env=env, cwd=tmp)
        t0, t1 = (float(v) for v in alone.stdout.split())
        summary = os.path.join(tmp, "s.json")
        env.update(ITERS=str(a.iters), STAGE0_LAYERS=str(a.stage0_layers))
        subprocess.run(
            [a.stallscope, "run", "-q", "-o", os.path.join(tmp, "p.stallscope"),
             "--summary-json", summary, "--", a.python, "-m", "torch.distributed.run",
             "--nproc-per-node", "2", "--master-port", str(a.port), SCRIPT],
            check=True, stdout=subprocess.DEVNULL, env=env, cwd=tmp)
        with open(summary) as f:
            s = json.load(f)
    ranks = {r["rank"]: r for r in s["ranks"]}
    r0 = ranks[0]
    per = lambda r, c: r["categories"][c]["seconds"] / r["iterations"]
    iteration = statistics.mean(
        sum(r["categories"][c]["seconds"] for c in r["categories"]) / r["iterations"]
        for r in ranks.values())
    waited = per(r0, "peer_wait") + per(r0, "interconnect")
    print(f"stage work alone per iteration: stage 0 {t0 * 1e3:.1f} ms, stage 1 {t1 * 1e3:.1f} ms")
    print(f"pipeline iteration (mean over the counted ones): {iteration * 1e3:.1f} ms")
    print(f"stage 0 waiting, true (iteration - its work alone): {(iteration - t0) * 1e3:.1f} ms"
          f" = {(iteration - t0) / iteration:.0%}")
    print(f"stage 0 waiting, stallscope (peer_wait {per(r0, 'peer_wait') * 1e3:.1f} + "
          f"interconnect {per(r0, 'interconnect') * 1e3:.1f}): {waited * 1e3:.1f} ms "
          f"= {waited / iteration:.0%}")
    print(f"work to move, true ((t1 - t0) / 2): {(t1 - t0) / 2 * 1e3:.1f} ms per iteration")
    print(f"finding: {s['finding']['sentence']}")
    print(f"change: {s['finding']['suggestion']}")


if __name__ == "__main__":
    sys.exit(main())
