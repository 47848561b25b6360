"""The training monitor under torch.distributed (two real gloo processes on the CPU, under torchrun)
and on torch.compile'd models: every rank describes its own batch, only rank 0 writes, the parameters
are whole tensors (also sharded by FSDP2), and a compiled model keeps its graphs between sampled steps."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookscope

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
STEPS = 2

JOB = textwrap.dedent('''
    import dataclasses, json, sys
    import torch, torch.distributed as dist
    from torch import nn
    import hookscope

    mode, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    g = torch.Generator().manual_seed(10 + rank)
    x, y = torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (2,))
        fully_shard(net[0], mesh=mesh)
        fully_shard(net[2], mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    with hookscope.monitor(model, every=1, optimizer=opt, log=out + "/logs") as mon:
        for _ in range(%d):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            mon.note(loss=loss)
            opt.step()
            steps.append([dataclasses.asdict(r) for r in mon.last.rows])
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(steps, f)
    dist.destroy_process_group()
''' % STEPS)


def _torchrun(tmp: Path, mode: str) -> list[list[list[dict[str, Any]]]]:
    """Each rank's telemetry, step by step, from two gloo ranks under torchrun."""
    job = tmp / "job.py"
    job.write_text(JOB)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(job), mode, str(tmp)], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in (0, 1)]


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)


def _row(rows: list[dict[str, Any]], layer: str, what: str, path: str | None = None) -> dict[str, Any]:
    return next(r for r in rows if r["layer"] == layer and r["what"] == what and (path is None or r["path"] == path))


def _global_grads() -> dict[str, torch.Tensor]:
    """Step 0's gradients by hand: each rank's batch through the same first weights, averaged (what DDP
    and FSDP2 leave in ``.grad``)."""
    grads: dict[str, torch.Tensor] = {}
    for rank in (0, 1):
        net = _net()
        x, y = _batch(rank)
        nn.functional.mse_loss(net(x), y).backward()
        for name, p in net.named_parameters():
            grads[name] = grads.get(name, torch.zeros_like(p)) + p.grad / 2
    return grads


def _check_params(rows: list[dict[str, Any]]) -> None:
    net, grads = _net(), _global_grads()
    for name, p in net.named_parameters():
        layer, path = name.rsplit(".", 1)
        r = _row(rows, layer, "param", path)
        g = grads[name]
        assert r["numel"] == p.numel()  # the whole tensor, not one rank's shard
        assert r["norm"] == pytest.approx(float(p.detach().norm()), rel=1e-5)
        assert r["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-5)
        assert r["mean"] == pytest.approx(float(g.mean()), rel=1e-4, abs=1e-7)
        assert r["update_norm"] == pytest.approx(0.1 * float(g.norm()), rel=1e-4)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[list[dict[str, Any]]]]]:
    tmp = tmp_path_factory.mktemp("ddp")
    return tmp, _torchrun(tmp, "ddp")


def test_under_ddp_each_rank_describes_its_own_batch(ddp):
    _, ranks = ddp
    for rank, steps in enumerate(ranks):
        x, _ = _batch(rank)
        out = _net()[0](x).detach()
        r = _row(steps[0], "0", "output")  # names of the model inside DistributedDataParallel
        assert r["mean"] == pytest.approx(float(out.mean()), rel=1e-5)
        assert r["min"] == pytest.approx(float(out.min()), rel=1e-5)
        assert r["max"] == pytest.approx(float(out.max()), rel=1e-5)
        assert r["rms"] == pytest.approx(float(out.pow(2).mean().sqrt()), rel=1e-5)
        assert _row(steps[0], "0", "input")["mean"] == pytest.approx(float(x.mean()), rel=1e-5)
    assert _row(ranks[0][0], "0", "output")["mean"] != _row(ranks[1][0], "0", "output")["mean"]


def test_under_ddp_the_parameters_are_the_global_batchs(ddp):
    _, ranks = ddp
    for steps in ranks:
        _check_params(steps[0])
    assert [r for r in ranks[0][1] if r["what"] == "param"] == [r for r in ranks[1][1] if r["what"] == "param"]


def test_under_ddp_only_rank_0_writes(ddp):
    tmp, ranks = ddp
    assert sorted(p.name for p in (tmp / "logs").iterdir()) == ["monitor.csv", "monitor.jsonl"]
    lines = [json.loads(line) for line in (tmp / "logs" / "monitor.jsonl").read_text().splitlines()]
    rows = [line for line in lines if line["what"] != "histogram"]
    assert len(rows) == sum(len(step) for step in ranks[0])  # one rank's rows, once
    written = [r for r in rows if r["step"] == 1 and r["what"] == "output"]
    assert [r["mean"] for r in written] == [r["mean"] for r in ranks[0][1] if r["what"] == "output"]


def test_under_fsdp2_the_parameters_are_summarised_as_whole_tensors(tmp_path):
    ranks = _torchrun(tmp_path, "fsdp")
    for steps in ranks:
        _check_params(steps[0])
    assert [r for r in ranks[0][0] if r["what"] == "param"] == [r for r in ranks[1][0] if r["what"] == "param"]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["monitor.csv", "monitor.jsonl"]


# --- torch.compile ---------------------------------------------------------------------------------
class Kept(hookscope.Writer):
    def __init__(self) -> None:
        self.seen: list[hookscope.Telemetry] = []

    def write(self, telemetry: hookscope.Telemetry) -> None:
        self.seen.append(telemetry)


def _run(model: nn.Module, params: Any, steps: int, after: Any = lambda: None) -> list[hookscope.Telemetry]:
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    opt = torch.optim.SGD(params, lr=0.1)
    kept = Kept()
    with hookscope.monitor(model, every=4, optimizer=opt, log=kept) as mon:
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            mon.note(loss=loss)
            opt.step()
            after()
    return kept.seen


def test_a_compiled_model_keeps_its_graphs_between_sampled_steps_and_gives_the_eager_values(caplog):
    from torch._dynamo.testing import CompileCounterWithBackend

    eager = _net()
    want = _run(eager, eager.parameters(), 9)
    torch._dynamo.reset()
    net = _net()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(net, backend=counter)
    frames: list[int] = []
    got = _run(compiled, net.parameters(), 9, after=lambda: frames.append(counter.frame_count))
    # steps 0, 4, 8 are sampled: each compiles its hooked graphs afresh; the steps between run the
    # graphs compiled once, without hooks, and compile nothing
    assert frames[1] > 0 and frames[1] == frames[2] == frames[3]
    assert frames[5] == frames[6] == frames[7] and frames[4] == frames[5]
    assert [t.step for t in got] == [t.step for t in want] == [0, 4, 8]
    for a, b in zip(got, want):
        assert len(a.rows) == len(b.rows)
        for ra, rb in zip(a.rows, b.rows):
            da, db = dataclasses.asdict(ra), dataclasses.asdict(rb)
            for k, v in da.items():
                if isinstance(v, float):
                    assert v == pytest.approx(db[k], rel=1e-5, abs=1e-7, nan_ok=True), (a.step, ra.layer, ra.what, k)
                else:
                    assert v == db[k], (a.step, ra.layer, ra.what, k)
    assert hookscope.core.hook_count(net) == 0
    # the monitor's own hooks run eagerly: Dynamo never traces them (one trace per layer would hit its recompile limit)
    assert "recompile_limit" not in caplog.text and "_probe.py" not in caplog.text
    torch._dynamo.reset()


LIGHTNING_JOB = textwrap.dedent('''
    import dataclasses, json, sys
    import torch
    import lightning.pytorch as L
    from torch import nn
    import hookscope

    out = sys.argv[1]

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
    callback = hookscope.LightningMonitor(every=1, log=out + "/logs")
    trainer = L.Trainer(max_steps=2, strategy="ddp", devices=2, accelerator="cpu", enable_progress_bar=False,
                        logger=False, enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=out, callbacks=[callback])
    trainer.fit(M(), torch.utils.data.DataLoader(data, batch_size=4))
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        json.dump([dataclasses.asdict(r) for r in callback.last.rows], f)
''')


def test_lightning_under_ddp_describes_each_ranks_batch_and_rank_0_writes(tmp_path):
    pytest.importorskip("lightning.pytorch")
    job = tmp_path / "job.py"
    job.write_text(LIGHTNING_JOB)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(job), str(tmp_path)], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    inputs = [_row(rows, "net.0", "input")["mean"] for rows in ranks]
    assert inputs[0] != inputs[1]  # each rank its own part of the data
    params = [[r for r in rows if r["what"] == "param"] for rows in ranks]
    assert params[0] == params[1] and len(params[0]) == 4  # the gradients DDP averaged
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["monitor.csv", "monitor.jsonl"]
    lines = [json.loads(line) for line in (tmp_path / "logs" / "monitor.jsonl").read_text().splitlines()]
    last = [line for line in lines if line["step"] == 1 and line["what"] != "histogram"]
    assert [line["mean"] for line in last if line["what"] == "input"] == [r["mean"] for r in ranks[0] if r["what"] == "input"]
    assert len(lines) == 2 * len(ranks[0])
