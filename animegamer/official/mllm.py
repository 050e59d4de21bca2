"""The release's agent ``pytorch_model.bin`` -> a transformers Mistral directory + this project's trained MLLM parts.

The release's file is the flat state dict of its ``ContinuousLVLM_Video`` (a peft-wrapped Mistral, prefix
``llm.base_model.model.``, plus two resamplers)::

    …layers.i.self_attn.q_proj.base_layer.weight        -> Mistral/  model.layers.i.self_attn.q_proj.weight
    …layers.i.self_attn.q_proj.lora_{A,B}.default.weight -> mllm/     adapter_model.safetensors (peft keys)
    …layers.i.input_layernorm.modules_to_save.default.weight -> Mistral/ model.layers.i.input_layernorm.weight
    …layers.i.input_layernorm.original_module.weight     dropped: peft runs the modules_to_save copy (B14)
    …model.embed_tokens.weight (V + new, H), …lm_head.weight  -> rows [:V] Mistral/, rows [V:] mllm/ new-token rows
    input_resampler.proj.{0,2}, output_resampler.proj.{0,2}  -> mllm/ input/output_resampler.mlp.{0,2} (GELU erf)

    convert_agent("MLLM-Qiqi/pytorch_model.bin", "animegamer_tokenizer", "converted/Qiqi",
                  base_dir="Mistral-7B-Instruct-v0.1", llm_yaml="mistral7b_lora.yaml")

writes ``out_dir/Mistral/`` (config.json, safetensors shards, the release's tokenizer files) and ``out_dir/mllm/``
(what ``AnimeGamerMLLM.load_trained`` reads). Every size comes from the tensors, the YAMLs and the base config; base
weights the file lacks are taken from ``base_dir``. The input is memory-mapped and the output written one shard at a
time, so at most one shard of copied weights is in memory (7B release: about 2 GB besides the page cache). Nothing
is left behind on failure: both directories are built in a temp directory and renamed into place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from animegamer.io import atomic_write_json
from animegamer.models.mllm import ADAPTER_FILES, LAYOUT_FILE, TRAINED_FILE
from animegamer.models.mllm_tokenizer import shipped_layout_base
from animegamer.models.weights import check_safetensors, save_state_dict_file
from animegamer.official.release_io import ReleaseFileError, load_release_pickle, read_release_yaml, tensor_dict
from animegamer.tokens import RELEASED

LLM_PREFIX = "llm.base_model.model."
RESAMPLERS = ("input_resampler", "output_resampler")
# The release's LLM YAML (peft LoraConfig) and agent YAML values, used when those files are not given.
RELEASED_LORA = {"r": 32, "lora_alpha": 32, "lora_dropout": 0.05}
RELEASED_NUM_SLOTS = 226
MISTRAL_DIR, MLLM_DIR = "Mistral", "mllm"
SHARD_BYTES = 2 * 1024**3

_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.default\.weight$")


def lora_settings(llm_yaml: str | Path | None) -> dict[str, Any]:
    """LoRA rank/alpha/dropout from the release's LLM YAML (``peft_config``), the released values where absent."""
    data = read_release_yaml(llm_yaml, "LLM YAML")
    peft = data.get("peft_config", {}) if data else {}
    if not isinstance(peft, dict):
        raise ReleaseFileError(f"{llm_yaml}: peft_config is not a mapping")
    out = {k: peft.get(k, v) for k, v in RELEASED_LORA.items()}
    for key in ("r", "lora_alpha"):
        if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
            raise ReleaseFileError(f"{llm_yaml}: peft_config.{key} must be a positive integer, got {out[key]!r}")
    out["target_modules"] = peft.get("target_modules")
    return out


def _num_slots(agent_yaml: str | Path | None) -> int:
    data = read_release_yaml(agent_yaml, "agent YAML")
    queries = {data.get(r, {}).get("num_queries") for r in RESAMPLERS if isinstance(data.get(r), dict)} - {None}
    if len(queries) > 1:
        raise ReleaseFileError(f"{agent_yaml}: the resamplers disagree on num_queries ({sorted(queries)})")
    num = queries.pop() if queries else RELEASED_NUM_SLOTS
    if not isinstance(num, int) or num < 1:
        raise ReleaseFileError(f"{agent_yaml}: num_queries must be a positive integer, got {num!r}")
    return num


def _base_config(base_dir: str | Path | None, config_json: str | Path | None) -> dict[str, Any]:
    path = Path(config_json) if config_json is not None else Path(base_dir) / "config.json" if base_dir else None
    if path is None:
        raise ReleaseFileError("the base Mistral config is needed: give the base model directory or its config.json")
    if not path.is_file():
        raise ReleaseFileError(f"{path}: base model config.json not found")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReleaseFileError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict) or "hidden_size" not in config:
        raise ReleaseFileError(f"{path}: not a transformers model config (no hidden_size)")
    return config


class _BaseWeights:
    """Lazy, memory-mapped access to the base model's own weights (safetensors or pickled shards)."""

    def __init__(self, base_dir: str | Path | None):
        self.dir = Path(base_dir) if base_dir else None
        self._where: dict[str, Path] | None = None
        self._bins: dict[Path, dict[str, torch.Tensor]] = {}

    def _index(self) -> dict[str, Path]:
        if self._where is not None:
            return self._where
        self._where = {}
        if self.dir is None:
            return self._where
        from safetensors import safe_open

        files = sorted(self.dir.glob("*.safetensors")) or sorted(self.dir.glob("pytorch_model*.bin"))
        for file in files:
            if file.suffix == ".safetensors":
                check_safetensors(file)  # a pipe, a device or a damaged shard: one line naming it
                with safe_open(str(file), framework="pt") as handle:
                    self._where.update(dict.fromkeys(handle.keys(), file))
            else:
                state = tensor_dict(load_release_pickle(file), file, "a base model state dict")
                self._bins[file] = state
                self._where.update(dict.fromkeys(state, file))
        return self._where

    def shape(self, key: str) -> tuple[int, ...] | None:
        """The stored shape of ``key`` (None if absent), read from the header: no data is loaded."""
        file = self._index().get(key)
        if file is None:
            return None
        if file in self._bins:
            return tuple(self._bins[file][key].shape)
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as handle:
            return tuple(handle.get_slice(key).get_shape())

    def get(self, key: str) -> torch.Tensor | None:
        """The tensor of ``key``, read when its shard is written (one at a time, never all of them)."""
        file = self._index().get(key)
        if file is None:
            return None
        if file in self._bins:
            return self._bins[file][key]
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as handle:
            return handle.get_tensor(key)


def split_agent_state(state: dict[str, torch.Tensor], path: Path) -> tuple[dict, dict, dict]:
    """The release's flat dict as (base weights by Mistral name, LoRA (module, A|B) -> tensor, resamplers)."""
    base, lora, resamplers = {}, {}, {}
    for key, tensor in state.items():
        if key.startswith(RESAMPLERS):
            match = re.fullmatch(r"(input|output)_resampler\.proj\.(\d+)\.(weight|bias)", key)
            if match is None:
                raise ReleaseFileError(f"{path}: unexpected resampler tensor {key!r}")
            resamplers[f"{match[1]}_resampler.mlp.{match[2]}.{match[3]}"] = tensor
            continue
        if not key.startswith(LLM_PREFIX):
            raise ReleaseFileError(f"{path}: unexpected tensor {key!r} (not under {LLM_PREFIX!r} or a resampler)")
        name = key[len(LLM_PREFIX) :]
        lora_match = _LORA_KEY.match(name)
        if lora_match:
            lora[(lora_match["module"], lora_match["ab"])] = tensor
        elif ".original_module." in name:
            continue  # peft's frozen copy of a modules_to_save norm; the forward uses modules_to_save.default
        elif ".modules_to_save.default." in name:
            base[name.replace(".modules_to_save.default.", ".")] = tensor
        else:
            base[name.replace(".base_layer.", ".")] = tensor
    return base, lora, resamplers


def _check_shape(tensor: torch.Tensor | tuple[int, ...], shape: tuple[int, ...], key: str, where: str) -> None:
    found = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else tuple(tensor)
    if found != tuple(shape):
        raise ReleaseFileError(f"{where}: {key} has shape {found}, expected {tuple(shape)}")


def _check_resamplers(resamplers: dict[str, torch.Tensor], hidden: int, where: str) -> tuple[int, int]:
    """(shot_dim, Linear layers per resampler) of the two resamplers, checked: Linear-GELU-Linear... with the inner
    layers at the output width (our ShotResampler), input shot_dim -> hidden, output hidden -> shot_dim."""
    shot_dim = None
    depth = {}
    for which in RESAMPLERS:
        linears = sorted({int(k.split(".")[2]) for k in resamplers if k.startswith(which)})
        if not linears or linears != list(range(0, 2 * len(linears), 2)):
            raise ReleaseFileError(f"{where}: {which}.proj layers {linears} are not Linear, GELU, Linear, ...")
        depth[which] = len(linears)
        for index in linears:
            for part in ("weight", "bias"):
                if f"{which}.mlp.{index}.{part}" not in resamplers:
                    raise ReleaseFileError(f"{where}: {which}.proj.{index}.{part} is missing")
        first = resamplers[f"{which}.mlp.0.weight"]
        outer_in, width = int(first.shape[1]), int(first.shape[0])
        if which == "input_resampler":
            shot_dim = outer_in
            if width != hidden:
                raise ReleaseFileError(f"{where}: input_resampler maps to {width}, the LLM width is {hidden}")
        elif outer_in != hidden or width != shot_dim:
            raise ReleaseFileError(f"{where}: output_resampler is {outer_in} -> {width}, not {hidden} -> {shot_dim}")
        for index in linears:
            _check_shape(
                resamplers[f"{which}.mlp.{index}.weight"],
                (width, outer_in if index == 0 else width),
                f"{which}.proj.{index}.weight",
                where,
            )
            _check_shape(resamplers[f"{which}.mlp.{index}.bias"], (width,), f"{which}.proj.{index}.bias", where)
    if depth["input_resampler"] != depth["output_resampler"]:
        raise ReleaseFileError(f"{where}: the resamplers have different depths {depth}")
    return shot_dim, depth["input_resampler"]


def _shards(items: Iterator[tuple[str, torch.Tensor]], limit: int) -> Iterator[dict[str, torch.Tensor]]:
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for key, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > limit:
            yield shard
            shard, size = {}, 0
        shard[key], size = tensor.clone(), size + nbytes  # clone: the mapped source stays file-backed
    if shard:
        yield shard


def convert_agent(
    agent_bin: str | Path,
    tokenizer_dir: str | Path,
    out_dir: str | Path,
    base_dir: str | Path | None = None,
    llm_yaml: str | Path | None = None,
    agent_yaml: str | Path | None = None,
    base_config: str | Path | None = None,
    shard_bytes: int = SHARD_BYTES,
) -> dict[str, Any]:
    """Convert the agent; returns what was converted (sizes, LoRA, dirs) and the ``mllm`` config values to play it.

    ``base_config``: a Mistral ``config.json`` (default ``base_dir/config.json``). Raises :class:`ReleaseFileError`
    (one line) for a bad input; ``out_dir/Mistral`` and ``out_dir/mllm`` must not exist yet and are only created
    complete.
    """
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    agent_bin, out_dir = Path(agent_bin), Path(out_dir)
    for name in (MISTRAL_DIR, MLLM_DIR):
        if (out_dir / name).exists():
            raise ReleaseFileError(f"{out_dir / name} already exists; choose a new output directory")
    lora_cfg = lora_settings(llm_yaml)
    num_slots = _num_slots(agent_yaml)
    config = _base_config(base_dir, base_config)
    if not Path(tokenizer_dir).is_dir():
        raise ReleaseFileError(f"{tokenizer_dir}: tokenizer directory not found")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as exc:
        raise ReleaseFileError(f"{tokenizer_dir}: not a readable tokenizer ({str(exc).splitlines()[0]})") from None
    try:
        base_vocab = shipped_layout_base(tokenizer, RELEASED.special_tokens(num_slots))
    except ValueError as exc:
        raise ReleaseFileError(f"{tokenizer_dir}: {exc}") from None
    if base_vocab is None:
        raise ReleaseFileError(f"{tokenizer_dir}: not the release's tokenizer (no <frame_i>/<Strength_k> tokens)")
    vocab_total = len(tokenizer)

    state = tensor_dict(load_release_pickle(agent_bin), agent_bin, "the agent state dict")
    base, lora, resamplers = split_agent_state(state, agent_bin)
    where = str(agent_bin)

    # the model's geometry, from the tensors; the base config must agree
    embed = base.get("model.embed_tokens.weight")
    if embed is None or embed.dim() != 2:
        raise ReleaseFileError(f"{where}: missing {LLM_PREFIX}model.embed_tokens.weight")
    hidden = int(embed.shape[1])
    _check_shape(embed, (vocab_total, hidden), "embed_tokens (rows = the tokenizer's length)", where)
    layers = {int(m[1]) for k in base if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    derived = {"hidden_size": hidden, "num_hidden_layers": len(layers) or config.get("num_hidden_layers")}
    if "model.layers.0.mlp.gate_proj.weight" in base:
        derived["intermediate_size"] = int(base["model.layers.0.mlp.gate_proj.weight"].shape[0])
    for key, value in derived.items():
        if config.get(key) != value:
            raise ReleaseFileError(f"{where}: {key} is {value} in the agent but {config.get(key)} in the base config")
    config = {**config, "vocab_size": base_vocab, "torch_dtype": str(embed.dtype).removeprefix("torch.")}
    config.pop("dtype", None)
    mistral_config = MistralConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in MistralForCausalLM(mistral_config).state_dict().items()}

    # LoRA: modules and rank from the tensors, alpha from the YAML
    modules = sorted({m for m, _ in lora})
    targets = sorted({m.rsplit(".", 1)[-1] for m in modules})
    if not modules:
        raise ReleaseFileError(f"{where}: no LoRA tensors (…lora_A.default.weight) found")
    ranks = {int(lora[(m, "A")].shape[0]) for m in modules if (m, "A") in lora}
    if ranks != {lora_cfg["r"]}:
        raise ReleaseFileError(f"{where}: LoRA rank {sorted(ranks)} differs from the LLM YAML's r={lora_cfg['r']}")
    for module in modules:
        for ab in "AB":
            if (module, ab) not in lora:
                raise ReleaseFileError(f"{where}: {LLM_PREFIX}{module}.lora_{ab}.default.weight is missing")
        out_features, in_features = expected.get(f"{module}.weight", (None, None))
        if out_features is None:
            raise ReleaseFileError(f"{where}: LoRA on {module}, which the base model does not have")
        _check_shape(lora[(module, "A")], (lora_cfg["r"], in_features), f"{module}.lora_A", where)
        _check_shape(lora[(module, "B")], (out_features, lora_cfg["r"]), f"{module}.lora_B", where)
    if lora_cfg["target_modules"] is not None and sorted(set(lora_cfg["target_modules"])) != targets:
        raise ReleaseFileError(f"{llm_yaml}: target_modules {lora_cfg['target_modules']} but the agent has {targets}")

    shot_dim, layers_per_resampler = _check_resamplers(resamplers, hidden, where)

    # every base weight, from the agent or else from base_dir, checked against the config's shapes
    fallback = _BaseWeights(base_dir)
    unknown = sorted(set(base) - set(expected))
    if unknown:
        raise ReleaseFileError(f"{where}: {len(unknown)} tensors the base model does not have, e.g. {unknown[0]!r}")
    # embeddings and head come from the agent whole (the release resized them: rows [base_vocab:] are trained)
    row_split = ("model.embed_tokens.weight", "lm_head.weight")
    from_base = set()
    for key, shape in expected.items():
        if key in base:
            _check_shape(base[key], (vocab_total, shape[1]) if key in row_split else shape, key, where)
            continue
        found = None if key in row_split else fallback.shape(key)
        if found is None:
            hint = f" nor in {base_dir}" if base_dir else " (give the base Mistral directory)"
            raise ReleaseFileError(f"{where}: base weight {key} is neither in the agent file{hint}")
        _check_shape(found, shape, key, str(base_dir))
        from_base.add(key)

    def base_items() -> Iterator[tuple[str, torch.Tensor]]:
        for key in expected:
            if key in from_base:
                yield key, fallback.get(key)
            else:
                yield key, base[key][:base_vocab] if key in row_split else base[key]

    num_new = vocab_total - base_vocab
    head = base["lm_head.weight"]
    extras = {
        "new_token_embed.weight": embed[base_vocab:].clone(),  # (num_new, hidden)
        "new_token_head.weight": head[base_vocab:].clone(),  # (num_new, hidden)
        **{k: v.clone() for k, v in resamplers.items()},
    }
    adapter = {f"base_model.model.{m}.lora_{ab}.weight": t.clone() for (m, ab), t in lora.items()}
    layout = {
        "vocabulary": RELEASED.name,
        "num_slots": num_slots,
        "base_vocab": base_vocab,
        "num_new_tokens": num_new,
        "hidden_size": hidden,
        "shot_dim": shot_dim,
        "resampler_gelu": "erf",
        "resampler_layers": layers_per_resampler,
        "slot_attention": "bidirectional",  # the release trained its frame block so (B2); adopted on load
    }

    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".convert_agent.", dir=out_dir))
    try:
        mistral = work / MISTRAL_DIR
        mistral.mkdir()
        index: dict[str, str] = {}
        count = total = 0
        names = []
        for shard in _shards(base_items(), shard_bytes):
            count += 1
            total += sum(t.numel() * t.element_size() for t in shard.values())
            name = f"model-{count:05d}.safetensors"
            save_state_dict_file(shard, mistral / name, metadata={"format": "pt"})
            index.update(dict.fromkeys(shard, name))
            names.append(name)
            del shard
        if count == 1:
            os.replace(mistral / names[0], mistral / "model.safetensors")
        else:
            atomic_write_json(
                mistral / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": index}
            )
        mistral_config.architectures = ["MistralForCausalLM"]
        mistral_config.save_pretrained(str(mistral))
        for file in Path(tokenizer_dir).iterdir():
            if file.is_file():
                shutil.copy2(file, mistral / file.name)

        mllm = work / MLLM_DIR
        mllm.mkdir()
        _write_adapter(mllm, adapter, lora_cfg, targets)
        save_state_dict_file(extras, mllm / TRAINED_FILE, metadata={"layout": json.dumps(layout)})
        atomic_write_json(mllm / LAYOUT_FILE, layout)
        for name in (MISTRAL_DIR, MLLM_DIR):
            os.replace(work / name, out_dir / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "mistral_dir": str(out_dir / MISTRAL_DIR),
        "mllm_dir": str(out_dir / MLLM_DIR),
        "num_layers": len(layers),
        "hidden_size": hidden,
        "base_vocab": base_vocab,
        "num_new_tokens": num_new,
        "lora": {"r": lora_cfg["r"], "lora_alpha": lora_cfg["lora_alpha"], "target_modules": targets},
        "shards": count,
        "mllm_config": {
            "vocabulary": RELEASED.name,
            "num_slots": num_slots,
            "shot_dim": shot_dim,
            "resampler_layers": layers_per_resampler,
            "resampler_gelu": "erf",
            "lora_rank": lora_cfg["r"],
            "lora_alpha": lora_cfg["lora_alpha"],
            "lora_dropout": lora_cfg["lora_dropout"],
            "lora_targets": targets,
        },
    }


def _write_adapter(out: Path, adapter: dict[str, torch.Tensor], lora_cfg: dict[str, Any], targets: list[str]) -> None:
    """peft's adapter format (what ``set_peft_model_state_dict`` reads): config + ``…lora_{A,B}.weight`` tensors."""
    from peft import LoraConfig

    config = LoraConfig(
        r=lora_cfg["r"],
        lora_alpha=lora_cfg["lora_alpha"],
        lora_dropout=lora_cfg["lora_dropout"],
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    config.save_pretrained(str(out))
    save_state_dict_file(adapter, out / ADAPTER_FILES[1], metadata={"format": "pt"})
