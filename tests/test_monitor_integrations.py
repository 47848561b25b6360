"""The training monitor inside Lightning and the transformers Trainer: real runs of tiny models on the
CPU, whose telemetry equals the plain-loop monitor's on the same batches from the same weights."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.core import hook_count
from hookscope.errors import HookscopeError, NonFiniteStepError

L = pytest.importorskip("lightning.pytorch")
transformers = pytest.importorskip("transformers")


class Kept(hookscope.Writer):
    """Every telemetry handed to it, in order."""

    def __init__(self) -> None:
        self.seen: list[hookscope.Telemetry] = []

    def write(self, telemetry: hookscope.Telemetry) -> None:
        self.seen.append(telemetry)


class Planted(nn.Module):
    """Makes NaN in its output on step ``at`` of the step counter it is given (else passes through)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: int | None = None
        self.step = lambda: -1

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * float("nan") if self.step() == self.at else h


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), Planted(), nn.Linear(8, 1))


def _data(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)


def _plain(net: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], accumulate: int, lr: float,
           **kw: Any) -> list[hookscope.Telemetry]:
    """The same run as a plain loop under hookscope.monitor with the optimizer's own step hooks."""
    kept = Kept()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    with hookscope.monitor(net, optimizer=opt, log=kept, **kw) as mon:
        for i in range(0, len(batches), accumulate):
            opt.zero_grad()
            total = torch.zeros(())
            for x, y in batches[i:i + accumulate]:
                loss = nn.functional.mse_loss(net(x), y) / accumulate
                loss.backward()
                total = total + loss.detach()
            mon.note(loss=total)
            opt.step()
    return kept.seen


def _same(a: list[hookscope.Telemetry], b: list[hookscope.Telemetry], prefix: str = "net.") -> None:
    """Equal telemetry; ``b``'s model is the bare Sequential, whose layer names lack ``prefix``."""
    assert [t.step for t in a] == [t.step for t in b]
    for ta, tb in zip(a, b):
        assert len(ta.rows) == len(tb.rows)
        for ra, rb in zip(ta.rows, tb.rows):
            da, db = dataclasses.asdict(ra), dataclasses.asdict(rb)
            db["layer"] = prefix + db["layer"] if db["layer"] else ""
            assert da.keys() == db.keys()
            for k in da:
                va, vb = da[k], db[k]
                if isinstance(va, float) and isinstance(vb, float):
                    assert va == pytest.approx(vb, rel=1e-5, abs=1e-7, nan_ok=True), (ta.step, ra.layer, ra.what, ra.path, k)
                else:
                    assert va == vb, (ta.step, ra.layer, ra.what, ra.path, k)


# --- Lightning -------------------------------------------------------------------------------------
class Module(L.LightningModule):
    def __init__(self, net: nn.Module, lr: float = 0.1) -> None:
        super().__init__()
        self.net, self.lr = net, lr
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _fit(module: L.LightningModule, callback: Any, tmp_path: Any, *, steps: int, accumulate: int = 1,
         batch: int = 4) -> L.Trainer:
    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=False)
    trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=accumulate, enable_progress_bar=False, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, accelerator="cpu", devices=1,
                        limit_val_batches=0, default_root_dir=str(tmp_path), callbacks=[callback])
    trainer.fit(module, loader)
    return trainer


def _batches(n: int, batch: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``n`` batches a loader of the data gives, epoch after epoch."""
    x, y = _data()
    epoch = [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)]
    return [epoch[i % len(epoch)] for i in range(n)]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_logs_what_the_plain_loop_logs_at_the_global_steps(tmp_path, accumulate):
    net = _net()
    start = copy.deepcopy(net)
    kept = Kept()
    callback = hookscope.LightningMonitor(every=2, log=kept)
    module = Module(net)
    trainer = _fit(module, callback, tmp_path, steps=5, accumulate=accumulate)
    assert trainer.global_step == 5
    assert [t.step for t in kept.seen] == [0, 2, 4]  # the trainer's global steps, one per optimizer step
    want = _plain(start, _batches(5 * accumulate), accumulate, 0.1, every=2)
    _same(kept.seen, want)
    calls = {r.calls for t in kept.seen for r in t.rows if r.what == "output"}
    assert calls == {accumulate}  # the step's batches merged in each row
    assert all(t.rows[0].lr == 0.1 and t.rows[0].loss is not None for t in kept.seen)
    assert callback.monitor is None and callback.last.step == 4
    assert hook_count(module) == 0


def test_lightning_loss_is_the_mean_of_the_steps_batches_by_hand(tmp_path):
    net = _net()
    start = copy.deepcopy(net)
    kept = Kept()
    _fit(Module(net), hookscope.LightningMonitor(every=1, stats=["output"], log=kept), tmp_path, steps=1, accumulate=2)
    (x1, y1), (x2, y2) = _batches(2)
    with torch.no_grad():
        by_hand = (nn.functional.mse_loss(start(x1), y1) + nn.functional.mse_loss(start(x2), y2)) / 2
    assert kept.seen[0].rows[0].loss == pytest.approx(float(by_hand), rel=1e-6)


def test_lightning_names_a_planted_nan_at_its_step_in_its_module(tmp_path):
    net = _net()
    module = Module(net)
    net[2].at, net[2].step = 3, lambda: module.trainer.global_step
    callback = hookscope.LightningMonitor(every=100, log=Kept())
    with pytest.raises(NonFiniteStepError) as e:
        _fit(module, callback, tmp_path, steps=6)
    assert e.value.step == 3 and "'net.2', forward output" in str(e.value)
    assert callback.monitor is None and hook_count(module) == 0
    assert callback.last.step == 0  # the last sampled step; the flagged one is written, not kept as last


def test_lightning_skip_leaves_the_weights_of_a_non_finite_step(tmp_path):
    net = _net()
    module = Module(net)
    net[2].at, net[2].step = 2, lambda: module.trainer.global_step
    kept = Kept()
    before: dict[int, torch.Tensor] = {}

    class Weights(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            before[trainer.global_step] = net[0].weight.detach().clone()

    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    callback = hookscope.LightningMonitor(every=100, log=kept, nonfinite="skip")
    L.Trainer(max_steps=4, enable_progress_bar=False, logger=False, enable_checkpointing=False,
              enable_model_summary=False, accelerator="cpu", limit_val_batches=0, default_root_dir=str(tmp_path),
              callbacks=[Weights(), callback]).fit(module, loader)
    assert torch.equal(before[2], before[3])  # the flagged step did not move the weights
    assert not torch.equal(before[1], before[2])
    flagged = [t for t in kept.seen if any(r.what == "nonfinite" for r in t.rows)]
    assert [t.step for t in flagged] == [2]
    row = next(r for r in flagged[0].rows if r.what == "nonfinite")
    assert row.layer == "net.2"
    assert torch.isfinite(net[0].weight).all()


# --- the transformers Trainer ----------------------------------------------------------------------
class Regressor(nn.Module):
    """A model the Trainer takes: keyword inputs, the loss in the returned mapping."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training and torch.is_grad_enabled():
            self.seen.append((x.detach().clone(), labels.detach().clone()))
        return {"loss": nn.functional.mse_loss(self.net(x), labels)}


class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.x, self.y = _data()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def _train(model: nn.Module, callback: Any, tmp_path: Any, *, steps: int, accumulate: int = 1,
           clip: float = 0.0) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=steps, learning_rate=0.1, optim="sgd",
        lr_scheduler_type="constant", max_grad_norm=clip, weight_decay=0.0, gradient_accumulation_steps=accumulate,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[callback])
    trainer.train()
    return trainer


@pytest.mark.parametrize("accumulate", [1, 2])
def test_trainer_logs_what_the_plain_loop_logs_at_the_global_steps(tmp_path, accumulate):
    model = Regressor()
    start = copy.deepcopy(model.net)
    kept = Kept()
    callback = hookscope.TrainerMonitor(every=2, log=kept)
    trainer = _train(model, callback, tmp_path, steps=5, accumulate=accumulate)
    assert trainer.state.global_step == 5
    assert [t.step for t in kept.seen] == [0, 2, 4]
    assert len(model.seen) == 5 * accumulate
    want = _plain(start, model.seen, accumulate, 0.1, every=2)
    _same(kept.seen, want)
    assert {r.calls for t in kept.seen for r in t.rows if r.what == "output"} == {accumulate}
    assert hook_count(model) == 0 and callback.monitor is None


def test_trainer_names_a_planted_nan_on_a_sampled_step(tmp_path):
    model = Regressor()
    state: dict[str, Any] = {}

    class Step(transformers.TrainerCallback):
        def on_step_begin(self, args, s, control, **kw):
            state["step"] = s.global_step

    model.net[2].at, model.net[2].step = 3, lambda: state.get("step", -1)
    callback = hookscope.TrainerMonitor(every=1, log=Kept())
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=6,
                                          optim="sgd", max_grad_norm=0.0, logging_steps=1, save_strategy="no",
                                          report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Step(), callback])
    with pytest.raises(NonFiniteStepError) as e:
        trainer.train()
    assert e.value.step == 3 and "'net.2', forward output" in str(e.value)
    assert hook_count(model) == 0 and callback.monitor is None


# --- bad input -------------------------------------------------------------------------------------
def test_the_callbacks_check_their_settings_when_built():
    with pytest.raises(HookscopeError, match="every"):
        hookscope.LightningMonitor(every=0)
    with pytest.raises(HookscopeError, match="nonfinite"):
        hookscope.TrainerMonitor(nonfinite="skipp")


def test_a_missing_framework_names_its_extra(monkeypatch):
    import builtins
    from hookscope.integrations import _driven

    real = builtins.__import__

    def no_lightning(name, *a, **kw):
        if name.startswith(("lightning", "pytorch_lightning")):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(_driven.importlib, "import_module", lambda n: no_lightning(n) and __import__("importlib").import_module(n))
    from hookscope.integrations import _lightning
    monkeypatch.setattr(_lightning, "_MADE", {})
    with pytest.raises(HookscopeError) as e:
        hookscope.LightningMonitor()
    assert "pip install 'hookscope[lightning]'" in str(e.value) and "\n" not in str(e.value)


def test_the_callbacks_pickle_as_the_frameworks_do(tmp_path):
    import pickle

    for made in (hookscope.LightningMonitor(every=3, stats=["output"]), hookscope.TrainerMonitor(every=3)):
        back = pickle.loads(pickle.dumps(made))  # Lightning's spawned processes get their callbacks so
        assert type(back) is type(made) and back.monitor is None
    back = pickle.loads(pickle.dumps(hookscope.LightningMonitor(every=3, stats=["output"])))
    assert isinstance(back, L.Callback)
    kept = Kept()
    back._driven.settings["log"] = kept
    _fit(Module(_net()), back, tmp_path, steps=4)
    assert [t.step for t in kept.seen] == [0, 3] and {r.what for t in kept.seen for r in t.rows} == {"step", "output"}


class Manual(Module):
    """Manual optimization: training_step runs the backward pass and the optimizer's step itself."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__(net)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        opt.zero_grad()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.manual_backward(loss)
        opt.step()
        return loss


def test_lightning_manual_optimization_counts_its_steps_and_never_replays_them(tmp_path):
    net = _net()
    module = Manual(net)
    net[2].at, net[2].step = 3, lambda: module.trainer.global_step
    kept, weights = Kept(), {}

    class Weights(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            weights[trainer.global_step] = net[0].weight.detach().clone()

    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    callback = hookscope.LightningMonitor(every=2, log=kept, nonfinite="skip")
    L.Trainer(max_steps=5, enable_progress_bar=False, logger=False, enable_checkpointing=False,
              enable_model_summary=False, accelerator="cpu", limit_val_batches=0, default_root_dir=str(tmp_path),
              callbacks=[Weights(), callback]).fit(module, loader)
    assert [t.step for t in kept.seen] == [0, 2, 3, 4]
    # a replay would run training_step, and with it the optimizer's step: the flagged step leaves the weights
    assert torch.equal(weights[3], weights[4])
    flag = next(r for t in kept.seen for r in t.rows if r.what == "nonfinite")
    assert flag.step == 3 and "raised" not in flag.note and flag.layer == ""  # step 3 is not sampled: no module


def test_trainer_skip_leaves_the_weights_of_a_non_finite_step(tmp_path):
    model = Regressor()
    state: dict[str, Any] = {}
    weights: dict[int, torch.Tensor] = {}

    class Step(transformers.TrainerCallback):
        def on_step_begin(self, args, s, control, **kw):
            state["step"] = s.global_step
            weights[s.global_step] = model.net[0].weight.detach().clone()

    model.net[2].at, model.net[2].step = 2, lambda: state.get("step", -1)
    kept = Kept()
    callback = hookscope.TrainerMonitor(every=100, log=kept, nonfinite="skip")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4,
                                          optim="sgd", learning_rate=0.1, logging_steps=1, save_strategy="no",
                                          report_to=[], use_cpu=True, disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Step(), callback]).train()
    assert torch.equal(weights[2], weights[3]) and not torch.equal(weights[1], weights[2])
    assert [t.step for t in kept.seen if any(r.what == "nonfinite" for r in t.rows)] == [2]
    assert torch.isfinite(model.net[0].weight).all() and hook_count(model) == 0


def test_a_failed_run_is_ended_by_close(tmp_path):
    model = Regressor()
    callback = hookscope.TrainerMonitor(every=1)

    class Fails(transformers.TrainerCallback):
        def on_step_end(self, args, s, control, **kw):
            raise RuntimeError("the run failed")

    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3,
                                          optim="sgd", report_to=[], use_cpu=True, disable_tqdm=True,
                                          save_strategy="no")
    with pytest.raises(RuntimeError, match="the run failed"):
        transformers.Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[callback, Fails()]).train()
    assert callback.monitor is not None  # the Trainer tells its callbacks nothing of an exception
    callback.close()
    callback.close()
    assert callback.monitor is None and hook_count(model) == 0
    with hookscope.monitor(model, every=1):  # the model is free for another monitor
        pass


# --- clipping: both frameworks read the gradient the optimizer uses ---------------------------------
_LOUD = 1e4  # the loss multiplied: a planted gradient far above the clipping threshold of 1.0


class LoudModule(Module):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch, batch_idx) * _LOUD


class LoudRegressor(Regressor):
    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": super().forward(x, labels)["loss"] * _LOUD}


def _unclipped_norm() -> float:
    """The first step's gradient norm by hand, before any clipping: far above 1."""
    net = _net()
    x, y = _batches(1)[0]
    (nn.functional.mse_loss(net(x), y) * _LOUD).backward()
    return math.sqrt(sum(float(p.grad.norm()) ** 2 for p in net.parameters()))


def _check_clipped(seen: list[hookscope.Telemetry]) -> None:
    assert _unclipped_norm() > 100 and len(seen) == 3
    for t in seen:
        params = [r for r in t.rows if r.what == "param"]
        total = math.sqrt(sum(r.grad_norm ** 2 for r in params))
        assert total == pytest.approx(1.0, rel=1e-4), t.step  # clipped to 1.0: the gradient the optimizer used
        for r in params:  # plain SGD, lr 0.1: the update is 0.1 times the gradient read
            assert r.update_norm == pytest.approx(0.1 * r.grad_norm, rel=1e-4), (t.step, r.layer, r.path)


def test_lightning_reads_the_gradients_after_clipping(tmp_path):
    kept = Kept()
    callback = hookscope.LightningMonitor(every=1, log=kept)
    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=False)
    module = LoudModule(_net())
    L.Trainer(max_steps=3, gradient_clip_val=1.0, enable_progress_bar=False, logger=False, enable_checkpointing=False,
              enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
              default_root_dir=str(tmp_path), callbacks=[callback]).fit(module, loader)
    _check_clipped(kept.seen)
    assert hook_count(module) == 0 and not module.trainer.optimizers[0]._optimizer_step_pre_hooks


def test_trainer_reads_the_gradients_after_clipping(tmp_path):
    kept = Kept()
    model = LoudRegressor()
    _train(model, hookscope.TrainerMonitor(every=1, log=kept), tmp_path, steps=3, clip=1.0)
    _check_clipped(kept.seen)
    assert hook_count(model) == 0
