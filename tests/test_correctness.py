"""Issue 20: recipes that mean what they say, exact normalisers, one KL with one direction, one
reference pass, and an engine interface that is complete. Each test fails on the old behaviour."""

from __future__ import annotations

import math

import pytest
import torch

from tinyrl.algo.losses import kl_penalty
from tinyrl.algo.recipes import RECIPES
from tinyrl.api import build_trainer
from tinyrl.config import load_config
from tinyrl.rollout.base import Rollouts

# --------------------------------------------------------------------------- recipes


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_on_the_default_preset_resolves_to_its_own_switches(recipe):
    """The default preset sets estimator/loss_agg itself; a recipe named on the command line wins
    over them (it used to be silently overridden: rloo kept estimator=grpo)."""
    _, cfg = load_config(None, {"algo.recipe": recipe})
    for key, value in RECIPES[recipe].items():
        assert getattr(cfg.algo, key) == value, (recipe, key)


def test_recipe_precedence_layers():
    # a field set beside the recipe in the same layer wins over it, in the preset and on the command line
    _, cfg = load_config(None, {"algo.recipe": "dapo", "algo.epsilon_high": 0.3})
    assert cfg.algo.epsilon_high == 0.3 and cfg.algo.dynamic_sampling
    # a later layer's field wins over an earlier layer's recipe
    _, cfg = load_config("smollm2-135m_grpo_cpu", {"algo.epsilon_high": 0.25})
    assert cfg.algo.recipe == "dapo" and cfg.algo.epsilon_high == 0.25
    assert cfg.algo.dynamic_sampling is False  # the preset's own field beside its recipe
    # a later layer's recipe replaces an earlier layer's recipe switches, not its unrelated fields
    _, cfg = load_config("smollm2-135m_grpo_cpu", {"algo.recipe": "rloo"})
    assert cfg.algo.estimator == "rloo" and cfg.algo.scale == "none"


def test_resolved_algo_block_is_logged_and_saved(run_root, caplog):
    import yaml

    caplog.set_level("INFO", logger="tinyrl")
    t = build_trainer(overrides={"algo.recipe": "rloo", "log.run_dir": run_root, "log.progress": False,
                                 "data.num_train": 16, "data.num_eval": 0,
                                 "train.eval_before_after": False})
    saved = yaml.safe_load((t.run.path / "config.yaml").read_text())["algo"]
    assert saved["recipe"] == "rloo" and saved["estimator"] == "rloo" and saved["scale"] == "none"
    assert any(r.message.startswith("algo: ") and "'estimator': 'rloo'" in r.message for r in caplog.records)


# --------------------------------------------------------------------------- KL: one helper, one direction


def test_kl_penalty_estimates_kl_of_the_sampling_distribution():
    """Tokens drawn from p: mean kl_penalty(log p, log q) -> KL(p || q), for every estimator's mean
    (k1, k3 unbiased), and not KL(q || p) (the reversed formula the trainer used to write)."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, generator=g), -1)
    q = torch.softmax(torch.randn(50, generator=g), -1)
    exact = float((p * (p.log() - q.log())).sum())
    reverse = float((q * (q.log() - p.log())).sum())
    x = torch.multinomial(p, 400_000, replacement=True, generator=g)
    for est in ("k1", "k3"):
        got = float(kl_penalty(p.log()[x], q.log()[x], est).mean())
        assert got == pytest.approx(exact, rel=0.03), est
    assert abs(exact - reverse) > 0.1 * exact  # the test can tell the directions apart


# --------------------------------------------------------------------------- shared fixtures


def small(model, run_root, **extra):
    o = {"model.name": model, "log.run_dir": run_root, "log.progress": False, "train.steps": 2,
         "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 8,
         "rollout.max_new_tokens": 6, "data.num_train": 64, "data.num_eval": 8, "train.lr": 1e-2,
         "train.eval_before_after": False, "reward.functions": ["tests.test_training:reward_by_length"]}
    o.update(extra)
    return o


def test_reinforce_pp_runs_one_reference_pass_and_charges_the_kl_once(tiny_model_dir, run_root, monkeypatch):
    import tinyrl.update as upd

    calls = []
    real = upd.reference_context
    monkeypatch.setattr(upd, "reference_context", lambda m: calls.append(1) or real(m))
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{"algo.recipe": "reinforce_pp", "algo.beta": 0.5}))
    assert t.cfg.algo.kl_in_reward
    t.train_step()  # move the adapter off the reference (LoRA starts at B = 0: KL 0)
    assert len(calls) == 1  # one reference pass per step
    batch, _ = t.collect_batch()
    t.reference(batch)
    assert len(calls) == 2
    t.advantages(batch)
    with_kl = batch.advantages.clone()
    beta = t.cfg.algo.beta
    t.cfg.algo.beta = 0.0
    t.advantages(batch)
    assert not torch.allclose(with_kl, batch.advantages)  # the KL is in the token rewards ...
    # ... and not in the loss: with the advantages fixed, beta changes nothing in the loss
    from tinyrl.update import policy_update

    batch.advantages = with_kl
    losses = []
    for b in (beta, 0.0):
        t.cfg.algo.beta = b
        sd = {k: v.clone() for k, v in t.model.state_dict().items() if "lora_" in k}
        res = policy_update(t.model, t.optimizer, batch, t.cfg.algo, temperature=1.0, micro_batch=8,
                            max_grad_norm=1e9, max_len=6)
        losses.append(res.stats["loss"])
        t.model.load_state_dict(sd, strict=False)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert len(calls) == 2  # the update never re-runs the reference


def test_kl_in_reward_needs_a_token_reward_estimator():
    from tinyrl.config import ConfigError

    with pytest.raises(ConfigError, match="algo.kl_in_reward"):
        load_config(None, {"algo.kl_in_reward": True, "algo.estimator": "grpo"})


# --------------------------------------------------------------------------- normalisers


def _batch_with_padding(batch: Rollouts, extra: int) -> Rollouts:
    """The same batch with `extra` more padding columns on the right of every completion."""
    pad = lambda t: torch.cat([t, t.new_zeros(t.shape[0], extra)], 1)  # noqa: E731
    out = Rollouts(**{f: getattr(batch, f) for f in batch.__dataclass_fields__})
    for f in ("completion_ids", "completion_mask", "loss_mask", "sampling_logprobs", "observation_mask"):
        setattr(out, f, pad(getattr(batch, f)))
    return out


def _grads_of_update(t, batch, **kw):
    from tinyrl.update import policy_update

    sd = {k: v.clone() for k, v in t.model.state_dict().items() if "lora_" in k}
    t.optimizer.zero_grad()
    lr = t.optimizer.param_groups[0]["lr"]
    t.optimizer.param_groups[0]["lr"] = 0.0  # keep the weights: only the gradient is compared
    res = policy_update(t.model, t.optimizer, batch, t.cfg.algo, temperature=1.0, max_grad_norm=1e9,
                        max_len=t.cfg.rollout.max_new_tokens, **kw)
    t.optimizer.param_groups[0]["lr"] = lr
    grads = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    t.model.load_state_dict(sd, strict=False)
    return res, grads


def test_dr_grpo_normaliser_is_the_configured_max_length_not_the_padded_width(tiny_model_dir, run_root):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{"algo.recipe": "dr_grpo"}))
    batch, _ = t.collect_batch()
    t.advantages(batch)
    r1, g1 = _grads_of_update(t, batch, micro_batch=8)
    r2, g2 = _grads_of_update(t, _batch_with_padding(batch, 5), micro_batch=8)
    assert r1.stats["loss"] == pytest.approx(r2.stats["loss"], rel=1e-6)
    assert all(torch.allclose(g1[n], g2[n], atol=1e-7) for n in g1)
    # and the loss is sum / (N * max_new_tokens): halve the configured max length, the loss doubles
    t.cfg.rollout.max_new_tokens = 3
    r3, _ = _grads_of_update(t, batch, micro_batch=8)
    assert r3.stats["loss"] == pytest.approx(2 * r1.stats["loss"], rel=1e-5)


def test_top_entropy_selection_is_batch_global_and_exact(tiny_model_dir, run_root):
    """The kept tokens are the top-q of the whole batch, whatever the micro-batch size, and the
    normaliser is their exact count (it used to be q x tokens, per micro-batch)."""
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{"algo.top_entropy_quantile": 0.25}))
    batch, _ = t.collect_batch()
    t.advantages(batch)
    before = batch.loss_mask.clone()
    t.select_tokens(batch)
    kept = batch.loss_mask.bool()
    ent = t._score(batch).entropy
    thresh = torch.quantile(ent[before.bool()], 0.75)
    assert torch.equal(kept, before.bool() & (ent >= thresh))
    assert 0.2 * before.sum() <= kept.sum() <= 0.35 * before.sum()
    r_small, g_small = _grads_of_update(t, batch, micro_batch=2)
    r_big, g_big = _grads_of_update(t, batch, micro_batch=16)
    assert all(torch.allclose(g_small[n], g_big[n], atol=1e-6, rtol=1e-4) for n in g_small)
    # token_mean divides by the kept tokens of the whole batch (rows without gradient included):
    # loss = (mean pg over the trained rows' kept tokens) * their count / all kept tokens
    n_kept, n_trained = float(kept.sum()), float(kept[r_big.rows].sum())
    assert r_big.stats["loss"] == pytest.approx(r_big.stats["pg_loss"] * n_trained / n_kept, rel=1e-5)


# --------------------------------------------------------------------------- metrics that say what they are


def test_unmeasured_quantities_are_absent(tiny_model_dir, run_root):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{"log.track_likelihood": False}))
    metrics, _ = t.train_step()
    assert "update_kl" not in metrics and "update_clip_frac" not in metrics and "policy_kl" not in metrics
    assert "pass_kl" not in metrics and "ref_kl" not in metrics  # one pass, beta 0


def test_canary_compares_only_tokens_the_trainer_scored(tiny_model_dir, run_root):
    """With mask_truncated, truncated rows leave the loss; the canary must not compare their
    sampling logprobs with zeros (it used to: a false stale-weights alarm)."""
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{"algo.mask_truncated": True,
                                                                   "rollout.max_new_tokens": 2}))
    metrics, _ = t.train_step()
    assert metrics["truncated_frac"] > 0
    assert metrics["rollout_trainer_maxdiff"] < 1e-3


# --------------------------------------------------------------------------- the engine interface


class ProtocolOnly:
    """An engine with exactly the RolloutEngine Protocol's methods and nothing else."""

    def __init__(self, inner):
        self._inner = inner

    @property
    def tokenizer(self):
        return self._inner.tokenizer

    def generate(self, prompts, n, params, columns=None, greedy=False):
        return self._inner.generate(prompts, n, params, columns, greedy=greedy)

    def sample(self, contexts, params, n=1, greedy=False, max_new=None):
        return self._inner.sample(contexts, params, n=n, greedy=greedy, max_new=max_new)

    def session(self, params, greedy=False):
        return self._inner.session(params, greedy)

    def episodes(self, params):
        return self._inner.episodes(params)

    def bound_to(self, model):
        return ProtocolOnly(self._inner.bound_to(model))

    def release(self):
        self._inner.release()

    def sync(self, model):
        self._inner.sync(model)

    def state_dict(self):
        return self._inner.state_dict()

    def load_state_dict(self, state):
        self._inner.load_state_dict(state)


def test_an_engine_written_to_the_protocol_trains_evaluates_and_checkpoints(tiny_model_dir, run_root):
    from tinyrl.rollout.engine import RolloutEngine
    from tinyrl.sources import Shaper, make_source

    protocol = {n for n in dir(RolloutEngine) if not n.startswith("_")} | set(RolloutEngine.__annotations__)
    assert protocol == {n for n in dir(ProtocolOnly) if not n.startswith("_")}  # all of it, nothing more
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{"train.eval_before_after": True}))
    t.engine = ProtocolOnly(t.engine)  # the batches come through it too: the source is built on it
    t.source = make_source(t.cfg, t.engine, t.prompts, Shaper(t.rewards, t.sampling), t.dist, t.model)
    run = t.train()
    assert not run.interrupted and run.eval_after is not None and not math.isnan(run.eval_after)
    t.load_checkpoint(t.run.latest_checkpoint())
