"""Validation loss is measured on the validation split, and only on it.

An evaluation that reads training samples reports a loss that is neither train nor validation
loss and hides overfitting; nothing raises, only the number is wrong. These tests compute the
expected loss from the split's own tokens, independently of the trainer's code.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from runhelpers import tiny_recipe_dict
from trainguard.config.load import validate_recipe
from trainguard.data.prepare import prepare_data
from trainguard.data.sampler import ElasticSampler
from trainguard.train.compute import StepMath
from trainguard.train.guarded_run import build_model
from trainguard.train.optim import build_optimizer


def _trainer(small_corpus, cache_dir):
    recipe = validate_recipe(tiny_recipe_dict(small_corpus, cache_dir))
    data = prepare_data(recipe.data, recipe.tokenizer, progress=False)
    model = build_model(recipe, data.vocab_size, torch.device("cpu"))
    t = recipe.train
    sampler = ElasticSampler(
        data.train.num_samples(recipe.data.seq_len),
        global_batch_size=t.batch_size * t.grad_accum,
        seed=t.seed,
        micro_batch_size=t.batch_size,
    )
    opt = build_optimizer(recipe, model)
    trainer = StepMath(recipe, model, opt, data.train, data.val, sampler)
    return recipe, data, model, trainer


@torch.no_grad()
def _mean_loss(model, tokens: np.ndarray) -> float:
    x, y = torch.from_numpy(tokens[:, :-1]), torch.from_numpy(tokens[:, 1:])
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()


def test_evaluate_reads_the_validation_split(small_corpus, cache_dir):
    recipe, data, model, trainer = _trainer(small_corpus, cache_dir)
    T = recipe.data.seq_len
    # Train a little, so the model tells the splits apart (an untrained model scores ~ln V on both).
    for step in range(8):
        trainer.forward_backward(step, step * recipe.train.batch_size)
        trainer.apply_update(step)
    n_val = data.val.num_samples(T)
    n = min(n_val, recipe.train.eval_batches * recipe.train.batch_size)
    ids = np.linspace(0, n_val - 1, n).astype(np.int64)
    model.eval()
    on_val = _mean_loss(model, data.val.samples(ids, T))
    on_train = _mean_loss(model, data.train.samples(ids, T))
    model.train()
    assert abs(on_val - on_train) > 1e-3  # the splits differ, so the test can tell them apart

    got = trainer.evaluate()
    assert math.isclose(got["val_loss"], on_val, rel_tol=1e-5)
    assert math.isclose(
        got["val_bpb"], on_val / math.log(2) / data.val.bytes_per_token, rel_tol=1e-5
    )
    assert model.training  # evaluate restores training mode


def test_evaluate_leaves_training_bitwise_unchanged(small_corpus, cache_dir):
    """An evaluation between steps must not move the data order, the RNG or the weights."""
    losses = []
    for evaluate in (False, True):
        recipe, _, model, trainer = _trainer(small_corpus, cache_dir)
        run = []
        for step in range(4):
            if evaluate:
                trainer.evaluate()
            run.append(trainer.forward_backward(step, step * 8).loss)
            trainer.apply_update(step)
        losses.append(run)
    assert losses[0] == losses[1]
