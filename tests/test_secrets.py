"""No secrets: what is guaranteed, tested where credentials could leak.

The guarantee (docs/guarantees.md, "What the pipeline guarantees"): dpace never takes a credential as a value.
Hub access (gated targets, data sets) authenticates through huggingface_hub's own lookup of
``HF_TOKEN`` / its token cache: dpace passes no ``token`` argument and reads no token variable,
so a token never reaches target.json, run configs or summaries. The config has no place for a
credential (unknown keys are refused, without echoing their value), and the SLURM profile takes the
account and partition from the environment and holds no credential. The whole smoke DAG runs with a
canary HF_TOKEN and no file under results/ or .snakemake/ may contain it
(tests/test_workflow.py::test_no_secret_in_params_logs_or_results, slow).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CANARY = "hf_dpace_canary_do_not_log"


class FakeHubConfig:
    num_hidden_layers = 4


class FakeHubTokenizer:
    chat_template = "{{ messages }}"


def test_a_hub_target_leaves_authentication_to_the_hub_and_records_no_token(tmp_path, monkeypatch):
    import dpace.targets as targets

    monkeypatch.setenv("HF_TOKEN", CANARY)
    calls = []

    def recording(result):
        def from_pretrained(name, *args, **kwargs):
            calls.append((name, args, kwargs))
            return result
        return from_pretrained

    monkeypatch.setattr(targets.AutoConfig, "from_pretrained", recording(FakeHubConfig()))
    monkeypatch.setattr(targets.AutoTokenizer, "from_pretrained", recording(FakeHubTokenizer()))
    # what a hub target must be to be served (tests/test_reliability.py) is not this test's concern
    monkeypatch.setattr(targets, "check_servable", lambda source, tokenizer: None)
    monkeypatch.setattr(targets, "_weightless_embedding", lambda config, trust_remote_code: None)
    monkeypatch.setattr(targets, "check_embedding_lookup", lambda source, embedding: None)
    target_json = targets.prepare_target({"source": "meta-llama/Llama-3.1-8B-Instruct"}, tmp_path / "llama")
    assert [name for name, _, _ in calls] == ["meta-llama/Llama-3.1-8B-Instruct"] * 2
    for _, args, kwargs in calls:  # huggingface_hub reads HF_TOKEN itself; dpace never handles it
        assert "token" not in kwargs and "use_auth_token" not in kwargs and CANARY not in repr((args, kwargs))
    assert CANARY not in target_json.read_text()


def test_the_config_has_no_place_for_a_credential_and_never_echoes_one():
    from dpace.config import ConfigError, validate_config

    config = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
    for section in (config["targets"]["tiny"], config["data"], config["train"]):
        section["token"] = CANARY
        with pytest.raises(ConfigError, match=r"unknown key\(s\) \['token'\]") as error:
            validate_config(config)
        assert CANARY not in str(error.value)
        del section["token"]


def test_the_slurm_profile_holds_no_credential(tmp_path):
    profile = yaml.safe_load((REPO / "workflow" / "profiles" / "slurm" / "profile.yaml").read_text())
    resources = profile["default-resources"]
    # who pays and where jobs run come from the submitting user's environment, not from the repository
    assert resources["slurm_account"] == "$SLURM_ACCOUNT" and resources["slurm_partition"] == "$SLURM_PARTITION"

    def keys(node, path=""):
        if isinstance(node, dict):
            for key, value in node.items():
                yield f"{path}{key}", value
                yield from keys(value, f"{path}{key}.")

    secret_like = re.compile(r"token|passw|secret|credential|api.?key|auth", re.IGNORECASE)
    assert [k for k, _ in keys(profile) if secret_like.search(k)] == []
    assert [k for k, v in keys(profile) if isinstance(v, str) and re.match(r"hf_[A-Za-z0-9]{8,}", v)] == []
