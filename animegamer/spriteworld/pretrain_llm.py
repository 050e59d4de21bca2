"""SpriteWorld's stand-in for Mistral-7B's pretraining: the tiny Mistral that stage (b) adapts with LoRA
(``scripts/spriteworld/pretrain_llm.py`` runs :func:`pretrain_llm`).

Stage (b) adds LoRA to a *pretrained* LLM, one that already reads a sentence and can carry a word of it to a later
position. A frozen random tiny Mistral cannot: stage (b) on top of one learned the character (the first words of
every instruction) but not the place (the last words, at a position that moves with the motion text) — shots
rendered from its predictions showed the asked-for place no more often than chance, even on training films. So the
random tiny Mistral (``animegamer.tiny.build_tiny_mistral``) is first trained here, all parameters, as a causal LM on
SpriteWorld's text: each training film as one document, its turns in order, each turn the instruction a player types
followed by the clip's tag line (``Character: Qiqi; Motion: run; Background: noon park. <S>Qiqi</S>...<EV>noon
park</EV>...``), which asks the model to carry the instruction's words over to the tags, as it must carry them to
the query slots in stage (b). Held-out films are never read.

The result is a plain transformers folder (model + tokenizer) at ``output_dir`` (written next to it and renamed in
place, so ``output_dir`` may be ``pretrained``); ``report_dir`` gets ``metrics.jsonl``, ``config.yaml`` and
``summary.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.config import SpriteWorldLLMConfig, to_yaml
from animegamer.data.manifest import Manifest, ManifestError, read_manifest
from animegamer.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from animegamer.training.checkpoint import write_dir_atomically
from animegamer.training.optim import build_scheduler


def film_texts(manifest: Manifest) -> dict[str, str]:
    """Film id -> its text: every captioned clip's instruction and tag line, in clip order (training films only)."""
    train = set(manifest.meta.get("splits", {}).get("train", [])) or {r.film_id for r in manifest.records}
    films: dict[str, list] = {}
    for record in manifest.records:
        if record.tags and record.film_id in train:
            films.setdefault(record.film_id, []).append(record)
    texts = {}
    for film, records in sorted(films.items()):
        records.sort(key=lambda r: r.clip_index)
        texts[film] = " ".join(f"{r.shot_tags().instruction().render()} {r.tags}" for r in records)
    return texts


def token_windows(documents: list[list[int]], seq_len: int, batch: int, rng: np.random.Generator) -> torch.Tensor:
    """(batch, L) token ids: a random window of ``seq_len`` tokens (or the whole of a shorter document) of a random
    document each, cut to the shortest so the batch needs no padding."""
    picks = []
    for d in rng.integers(0, len(documents), batch):
        doc = documents[d]
        start = int(rng.integers(0, max(1, len(doc) - seq_len + 1)))
        picks.append(doc[start : start + seq_len])
    length = min(len(p) for p in picks)
    return torch.tensor([p[:length] for p in picks])


def pretrain_llm(cfg: SpriteWorldLLMConfig) -> Path:
    """Train ``pretrained`` as a causal LM on the training films' text (module doc); returns ``output_dir``. No
    model at ``pretrained`` raises FileNotFoundError, a manifest without captioned training text ManifestError."""
    from transformers import AutoTokenizer, MistralForCausalLM

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    report = Path(cfg.report_dir)
    report.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report / "config.yaml", to_yaml(cfg))
    if not (Path(cfg.pretrained) / "config.json").is_file():
        raise FileNotFoundError(f"{cfg.pretrained} holds no transformers model (build it with animegamer.tiny)")

    texts = film_texts(read_manifest(cfg.manifest))
    if not texts:
        raise ManifestError(f"no captioned training clips in {cfg.manifest}")
    tokenizer = AutoTokenizer.from_pretrained(cfg.pretrained)
    documents = [[tokenizer.bos_token_id, *tokenizer(t, add_special_tokens=False).input_ids] for t in texts.values()]
    if min(len(d) for d in documents) < 2:
        raise ManifestError(f"{cfg.manifest}: a film's text is shorter than two tokens")
    model = MistralForCausalLM.from_pretrained(cfg.pretrained, torch_dtype=torch.float32).train()

    train = cfg.train
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr, betas=tuple(train.betas),
                                  weight_decay=train.weight_decay)
    lr_scheduler = build_scheduler(optimizer, train)
    rng = np.random.default_rng(cfg.seed)
    rows: list[dict] = []
    progress = tqdm(range(train.max_steps), desc="pretrain llm")
    for step in progress:
        tokens = token_windows(documents, cfg.seq_len, train.batch_size, rng)  # (B, L)
        loss = model(input_ids=tokens, labels=tokens).loss  # next-token cross-entropy
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.max_grad_norm)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % train.log_every == 0 or step + 1 == train.max_steps:
            rows.append({"step": step + 1, "loss": loss.item()})
            atomic_write_jsonl(report / "metrics.jsonl", rows)
            progress.set_postfix(loss=f"{loss.item():.4f}")

    out = Path(cfg.output_dir)

    def save(tmp: Path) -> None:
        model.eval().save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))

    write_dir_atomically(out, save)  # swapped in whole: output_dir may be the model it started from

    losses = [r["loss"] for r in rows]
    summary = {
        "films": len(documents),
        "tokens": sum(len(d) for d in documents),
        "loss_first": float(np.mean(losses[:5])) if losses else float("nan"),
        "loss_last": float(np.mean(losses[-5:])) if losses else float("nan"),
        "seconds": round(time.perf_counter() - started, 1),
    }
    atomic_write_json(report / "summary.json", summary)
    print(json.dumps(summary, indent=2))
    print(f"pretrained Mistral {out}")
    return out
