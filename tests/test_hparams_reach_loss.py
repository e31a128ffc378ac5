"""Every registry hyper-parameter reaches the loss, through every path that builds one.

A drafter's loss is built in three places from three kinds of settings: ``ObjectiveDFlashModel``
(its keyword arguments), the local loop (``TrainConfig.objective_hparams`` in ``train_drafter``) and
the SpecForge backend (the workflow's train settings -> draft config -> run YAML -> registered
provider). A path that drops a hyper-parameter silently trains at its default, and a test that uses
the default (alpha 0.5 everywhere) cannot see it. So each case here sets a non-default value of one
hyper-parameter of one registry record, captures the first training forward's loss and the logits it
was computed from, and checks that the loss equals ``block_loss`` at that value and not at the default.

The cases are read from ``dpace.training.objectives.REGISTRY``: a new record's hyper-parameters are covered
without editing this file, as long as ``TRIAL_VALUES`` knows a valid non-default value for each name.
"""

from __future__ import annotations

import pytest
import torch
import yaml
from specforge.modeling.draft.dflash import DFlashDraftModel
from torch import nn
from transformers import Qwen3Config

import dpace.training.online_model
import dpace.training.specforge_backend
from dpace.features import FeatureSettings, compute_features, load_features
from dpace.io import atomic_write_jsonl
from dpace.training.loop import TrainConfig, train_drafter
from dpace.training.objectives import REGISTRY, block_loss, resolve_hparams
from dpace.training.online_model import ObjectiveDFlashModel
from dpace.training.specforge_run import ObjectiveSpec

# B = 8 has a DFlash default gamma (4), so dflash's gamma has a default to differ from.
BLOCK_SIZE = 8

# A valid value away from each hyper-parameter's default. k beyond the vocabulary makes the top-k
# mask all ones, which differs from k=3 on any batch where some target token is not a top-3 guess.
TRIAL_VALUES = {"alpha": 0.1, "gamma": 1.5, "k": 1_000_000}

CASES = [(record.name, name) for record in REGISTRY.values() for name in record.hparams]


def test_every_registry_hyperparameter_has_a_trial_value():
    missing = sorted({name for _, name in CASES} - set(TRIAL_VALUES))
    assert not missing, f"add a valid non-default value for {missing} to TRIAL_VALUES in {__file__}"
    for objective, name in CASES:
        trial = resolve_hparams(objective, BLOCK_SIZE, **{name: TRIAL_VALUES[name]})[name]
        assert trial != resolve_hparams(objective, BLOCK_SIZE)[name], (objective, name)


class LossProbe:
    """Records each ``ObjectiveDFlashModel.forward``'s loss and the ``objective_terms`` inputs it read.

    Only calls made during a forward count (activation checkpointing recomputes chunks in backward).
    """

    def __init__(self, monkeypatch):
        self.forwards: list[dict] = []
        self._calls: list[dict] | None = None
        terms, forward = dpace.training.online_model.objective_terms, ObjectiveDFlashModel.forward

        def recording_terms(objective, **inputs):
            if self._calls is not None:
                self._calls.append({key: value for key, value in inputs.items()
                                    if key in ("draft_logits", "target_ids", "valid", "target_logits")})
            return terms(objective, **inputs)

        def recording_forward(model, *args, **kwargs):
            self._calls = []
            try:
                loss, accuracy, metrics = forward(model, *args, **kwargs)
            finally:
                calls, self._calls = self._calls, None
            joined = {key: None if calls[0][key] is None else torch.cat([c[key].detach() for c in calls], dim=1)
                      for key in calls[0]}
            self.forwards.append({"loss": loss.detach(), "objective": model.objective,
                                  "normalization": model.normalization, "inputs": joined})
            return loss, accuracy, metrics

        monkeypatch.setattr(dpace.training.online_model, "objective_terms", recording_terms)
        monkeypatch.setattr(ObjectiveDFlashModel, "forward", recording_forward)

    def check_first_forward(self, objective: str, name: str, value) -> None:
        """The first forward's loss is ``block_loss`` at ``name=value``, and not at the default."""
        assert self.forwards, "no ObjectiveDFlashModel forward ran"
        first = self.forwards[0]
        assert first["objective"] == objective

        def reference(**hparams):
            return block_loss(objective, normalization=first["normalization"], **first["inputs"], **hparams)[0]

        at_value, at_default = reference(**{name: value}), reference()
        assert abs(float(at_value - at_default)) > 1e-4 * abs(float(at_default)), (
            f"{objective}: this batch cannot tell {name}={value} from the default; the check would be vacuous")
        torch.testing.assert_close(first["loss"], at_value.to(first["loss"].dtype), rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{objective} with {name}={value}: the loss is not block_loss "
                                                 f"at that value (at the default: {float(at_default):.6f})\n{m}")


# --------------------------------------------------------------------------- ObjectiveDFlashModel


def tiny_online_model(objective: str, **hparams) -> ObjectiveDFlashModel:
    hidden, vocab, mask_token = 32, 97, 96
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=hidden, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         intermediate_size=64, num_hidden_layers=1, vocab_size=vocab,
                         layer_types=["full_attention"])
    config.num_target_layers = 4
    config.block_size = BLOCK_SIZE
    config.dflash_config = {"target_layer_ids": [1, 2], "mask_token_id": mask_token}
    config._attn_implementation = "sdpa"
    return ObjectiveDFlashModel(
        draft_model=DFlashDraftModel(config).double(), target_lm_head=nn.Linear(hidden, vocab, bias=False).double(),
        target_embed_tokens=nn.Embedding(vocab, hidden).double(), mask_token_id=mask_token, block_size=BLOCK_SIZE,
        attention_backend="sdpa", num_anchors=6, objective=ObjectiveSpec(objective, hparams), objective_chunk_blocks=2)


@pytest.mark.parametrize("objective,name", CASES)
def test_online_model_keyword_reaches_the_loss(monkeypatch, objective, name):
    probe = LossProbe(monkeypatch)
    model = tiny_online_model(objective, **{name: TRIAL_VALUES[name]})
    generator = torch.Generator().manual_seed(1)
    batch, seq_len, hidden = 2, 40, 32
    input_ids = torch.randint(0, 96, (batch, seq_len), generator=generator)
    loss_mask = torch.ones(batch, seq_len)
    loss_mask[:, :5] = 0
    torch.manual_seed(5)
    model(input_ids, torch.randn(batch, seq_len, 2 * hidden, generator=generator, dtype=torch.float64), loss_mask,
          target_last_hidden_states=torch.randn(batch, seq_len, hidden, generator=generator, dtype=torch.float64))
    probe.check_first_forward(objective, name, TRIAL_VALUES[name])


# --------------------------------------------------------------------------- the local loop and SpecForge

CONVERSATIONS = [
    {"id": str(i), "conversations": [
        {"role": "user", "content": f"Question {i}: describe item {i * 5}."},
        {"role": "assistant", "content": " ".join(["the reply is", str(i)] * (6 + i % 3))},
    ]}
    for i in range(4)
]


@pytest.fixture(scope="module")
def features_dir(tmp_path_factory, tiny_target_json):
    folder = tmp_path_factory.mktemp("hparam-features")
    atomic_write_jsonl(folder / "conversations.jsonl", CONVERSATIONS)
    compute_features(tiny_target_json, folder / "conversations.jsonl", folder / "f",
                     FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256))
    return folder / "f"


@pytest.mark.parametrize("objective,name", CASES)
def test_train_config_reaches_the_loss(monkeypatch, tmp_path, tiny_target_json, features_dir, objective, name):
    probe = LossProbe(monkeypatch)
    config = TrainConfig.from_config({}, objective=objective, objective_hparams={name: TRIAL_VALUES[name]}, depth=1,
                                     block_size=BLOCK_SIZE, num_anchors=6, epochs=1, micro_batch_size=2,
                                     grad_accumulation=1, seed=0, threads=1)
    train_drafter(config, target_json=tiny_target_json, features_dir=features_dir, out_dir=tmp_path / "out",
                  scratch_dir=tmp_path / "scratch", stop_after_steps=1)
    probe.check_first_forward(objective, name, TRIAL_VALUES[name])


def specforge_train_in_process(run_yaml: str, features_dir) -> None:
    """What ``dpace.training.specforge_backend train`` does up to the first loss, in this process, on CPU:
    the objective read back from the run's draft config, SpecForge's registered providers, one forward."""
    from specforge.application import resolve_run
    from specforge.config.schema import Config
    from specforge.training.model_loading import resolve_draft_config
    from transformers import AutoConfig, AutoTokenizer

    cfg = Config.model_validate(yaml.safe_load(open(run_yaml)))
    run = resolve_run(cfg, dpace.training.specforge_backend.registry(dpace.training.specforge_backend.objective_of_run(run_yaml)))
    model_providers = run.algorithm.providers.model
    draft_config = resolve_draft_config(cfg, provider=model_providers.draft_config)
    draft = model_providers.build_draft(cfg, draft_config)
    path = cfg.model.target_model_path
    model = model_providers.build_training_model(cfg, draft, draft_config, AutoConfig.from_pretrained(path),
                                                 AutoTokenizer.from_pretrained(path)).model
    item = load_features(features_dir).sequence(0)
    torch.manual_seed(0)
    model(input_ids=item["input_ids"].long()[None], hidden_states=item["hidden"].float()[None],
          loss_mask=item["loss_mask"].float()[None], target_last_hidden_states=item["last_hidden"].float()[None])


@pytest.mark.parametrize("objective,name", CASES)
def test_specforge_settings_reach_the_loss(monkeypatch, tmp_path, tiny_target_json, features_dir, objective, name):
    probe = LossProbe(monkeypatch)

    def run_in_process(command, log):
        if command[1] == "train":  # stop after the first loss: the run "fails" and nothing is exported
            specforge_train_in_process(command[command.index("--config") + 1], features_dir)
        return 1, ""

    monkeypatch.setattr(dpace.training.specforge_backend, "cli_prefix", lambda: ["specforge"])
    monkeypatch.setattr(dpace.training.specforge_backend, "_run", run_in_process)
    settings = {"objective": objective, "objective_hparams": {name: TRIAL_VALUES[name]}, "normalization": None,
                "depth": 1, "block_size": BLOCK_SIZE, "epochs": 1, "num_anchors": 6, "learning_rate": 1e-3,
                "warmup_ratio": 0.04, "max_grad_norm": 1.0, "micro_batch_size": 1, "grad_accumulation": 1,
                "objective_chunk_blocks": 0, "seed": 0, "weight_decay": 0.0, "precision": "fp32",
                "attention_backend": "sdpa"}
    with pytest.raises(RuntimeError, match="SpecForge training exited with code 1"):
        dpace.training.specforge_backend.train_with_specforge(
            settings, target_json=tiny_target_json, features_dir=features_dir, out_dir=tmp_path / "out",
            scratch_dir=tmp_path / "scratch", gpus=["0", "1"], mask_token_id=0, max_length=256,
            log=open(tmp_path / "log", "w"))
    probe.check_first_forward(objective, name, TRIAL_VALUES[name])
