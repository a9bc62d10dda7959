"""The Hugging Face and Lightning adapters (skipped when the framework is not installed)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch


def _model_with_grads(bad: bool):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(8, 4)
    if bad:
        x[0, 0] = math.nan
    model(x).pow(2).mean().backward()
    return model


def test_hf_callback_skips_a_nan_update():
    pytest.importorskip("transformers")
    from transformers import TrainerControl, TrainerState

    from trainguard.integrations.hf import TrainguardCallback

    cb = TrainguardCallback()
    state, control = TrainerState(), TrainerControl()
    for step in range(30):
        state.global_step = step
        model = _model_with_grads(bad=step == 25)
        cb.on_pre_optimizer_step(None, state, control, model=model)
        if step == 25:
            assert all(p.grad is None for p in model.parameters())
        else:
            assert all(p.grad is not None for p in model.parameters())
    assert [(d.step, d.action) for d in cb.decisions] == [(25, "skip")]
    assert not control.should_training_stop


def test_lightning_callback_skips_a_nan_update():
    try:
        from trainguard.integrations.lightning import TrainguardLightningCallback
    except ImportError:
        pytest.skip("lightning is not installed")

    cb = TrainguardLightningCallback()
    trainer = SimpleNamespace(global_step=0, should_stop=False)
    for step in range(30):
        trainer.global_step = step
        model = _model_with_grads(bad=step == 25)
        cb.on_before_optimizer_step(trainer, model, None)
        assert all((p.grad is None) == (step == 25) for p in model.parameters())
    assert [(d.step, d.action) for d in cb.decisions] == [(25, "skip")]
    assert trainer.should_stop is False
