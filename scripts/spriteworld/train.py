"""SpriteWorld end to end on a CPU: data -> pretraining -> stage (a) -> (b) -> (c) -> shipped checkpoint -> report.

    python scripts/train_spriteworld.py --config configs/spriteworld/run.yaml           # the shipped checkpoint
    python scripts/train_spriteworld.py --config configs/spriteworld/mini.yaml output_dir=/tmp/sw_mini   # ~1 min
    python scripts/train_spriteworld.py --config configs/spriteworld/run.yaml "steps=[ship,evaluate]"   # some steps

Each step runs the real entry point's ``main(argv)`` in this process, with the step's YAML from ``configs``
(data.yaml, pretrain.yaml, pretrain_llm.yaml, stage_a/b/c.yaml, eval.yaml, ablations.yaml):

    data       scripts/make_spriteworld.py's write_dataset; then <out>/data/train.jsonl: the training films only
               (stages a-c never see a held-out film; pretraining reads the split itself)
    pretrain   the tiny random CLIP (frozen, seeded) and Mistral (animegamer.tiny), then
               scripts/pretrain_spriteworld.py: tiny T5, VAE, stage (a) features, base text-to-video transformer
    pretrain_llm  scripts/pretrain_spriteworld_llm.py: the tiny Mistral trained as a causal LM on the training
               films' text (the pretrained LLM stage (b) adds LoRA to)
    stage_a    scripts/train_stage_a.py    stage_b  scripts/train_stage_b.py    stage_c  scripts/train_stage_c.py
    ship       the weights inference needs, copied to ``ship_dir`` (safetensors + configs, no optimizer states)
    evaluate   scripts/run_ablations.py with ablations.yaml: the main table (AnimeGamer, GC-style, random,
               majority), no decoder adaptation, stage (a) reconstruction with and without the motion scope;
               its tables (table.{md,csv}, table_intervals.{md,csv,json}) copied into ship_dir as eval_*

The step YAMLs name ``outputs/spriteworld`` and ``checkpoints/spriteworld``; they are rewritten to ``output_dir`` and
``ship_dir`` (and ``configs/spriteworld`` to ``output_dir/configs``), the step's ``overrides`` applied (their paths
move too), and the resolved YAML saved as ``output_dir/configs/<name>.yaml`` before the step runs.
``output_dir/summary.json`` collects every step's time and first/last losses.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from animegamer.cli import parse_config
from animegamer.config import SpriteWorldRunConfig, load_config, to_yaml
from animegamer.io import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("data", "pretrain", "pretrain_llm", "stage_a", "stage_b", "stage_c", "ship", "evaluate")
CONFIG_FILES = ("data", "pretrain", "pretrain_llm", "stage_a", "stage_b", "stage_c", "inference", "eval", "ablations")
RESUME_STATE = ("optimizer*.bin", "scheduler*.bin", "random_states_*.pkl", "trainer_state.json")
DEFAULT_OUT, DEFAULT_SHIP, DEFAULT_CONFIGS = "outputs/spriteworld", "checkpoints/spriteworld", "configs/spriteworld"


def load_script(name: str):
    """``scripts/<name>.py`` as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resolve_configs(cfg: SpriteWorldRunConfig) -> dict[str, Path]:
    """Every step YAML with its paths moved to this run and its overrides applied, under output_dir/configs/."""
    out = Path(cfg.output_dir)
    moves = {DEFAULT_CONFIGS: str(out / "configs"), DEFAULT_OUT: str(out), DEFAULT_SHIP: cfg.ship_dir}
    pattern = re.compile("|".join(re.escape(k) for k in sorted(moves, key=len, reverse=True)))
    resolved = {}
    for name in CONFIG_FILES:
        source = Path(cfg.configs) / f"{name}.yaml"
        text = pattern.sub(lambda m: moves[m.group(0)], to_yaml(load_config(source)))
        path = out / "configs" / f"{name}.yaml"
        atomic_write_text(path, text)
        if cfg.overrides.get(name):
            overrides = [pattern.sub(lambda m: moves[m.group(0)], item) for item in cfg.overrides[name]]
            atomic_write_text(path, to_yaml(load_config(path, overrides)))
        resolved[name] = path
    unknown = sorted(set(cfg.overrides) - set(CONFIG_FILES))
    if unknown:
        raise SystemExit(f"error: overrides for unknown configs {unknown}; known: {list(CONFIG_FILES)}")
    return resolved


def losses_of(metrics_csv: Path, names: tuple[str, ...] = ("loss",), count: int = 5) -> dict:
    """Mean of the first and of the last ``count`` logged values of each name (the csv tracker's long format)."""
    if not metrics_csv.is_file():
        return {}
    values: dict[str, list[float]] = {}
    with open(metrics_csv, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["name"] in names:
                values.setdefault(row["name"], []).append(float(row["value"]))
    result = {}
    for name, series in values.items():
        n = min(count, len(series))
        result[f"{name}_first"], result[f"{name}_last"] = sum(series[:n]) / n, sum(series[-n:]) / n
        result[f"{name}_logged"] = len(series)
    return result


# --------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------


def step_data(configs: dict[str, Path]) -> dict:
    from animegamer.data.manifest import read_manifest, write_manifest
    from animegamer.spriteworld import write_dataset

    data_cfg = load_config(configs["data"])
    manifest = read_manifest(write_dataset(data_cfg))
    train_films = set(manifest.meta["splits"]["train"])
    train = [r for r in manifest.records if r.film_id in train_films]
    write_manifest(manifest.path.with_name("train.jsonl"), train, manifest.meta)
    return {"clips": len(manifest), "train_clips": len(train), "test_films": len(manifest.meta["splits"]["test"])}


def step_pretrain(cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    from animegamer.spriteworld import lexicon
    from animegamer.tiny import build_tiny_clip, build_tiny_mistral

    models = Path(cfg.output_dir) / "models"
    build_tiny_clip(models / "clip", seed=cfg.seed)
    build_tiny_mistral(models / "Mistral", seed=cfg.seed, hidden_size=cfg.mistral_hidden, words=lexicon())
    load_script("pretrain_spriteworld").main(["--config", str(configs["pretrain"])])
    pretrain = load_config(configs["pretrain"])
    return json.loads((Path(pretrain.report_dir) / "summary.json").read_text())


def step_pretrain_llm(configs: dict[str, Path]) -> dict:
    load_script("pretrain_spriteworld_llm").main(["--config", str(configs["pretrain_llm"])])
    return json.loads((Path(load_config(configs["pretrain_llm"]).report_dir) / "summary.json").read_text())


def step_stage(name: str, configs: dict[str, Path]) -> dict:
    """A fresh run of ``scripts/train_<name>.py`` (an earlier run's directory is replaced)."""
    out = Path(load_config(configs[name]).output_dir)
    shutil.rmtree(out, ignore_errors=True)
    load_script(f"train_{name}").main(["--config", str(configs[name])])
    return losses_of(out / "metrics.csv", ("loss", "ce", "mse", "state_acc"))


def latest(run_dir: Path) -> Path:
    from animegamer.training.checkpoint import resolve_checkpoint

    return resolve_checkpoint(run_dir)


def step_ship(cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    """Copy the weights inference and evaluation need into ship_dir (replacing it); returns the sizes."""
    out, ship = Path(cfg.output_dir), Path(cfg.ship_dir)
    stage_a = latest(Path(load_config(configs["stage_a"]).output_dir))
    stage_b = latest(Path(load_config(configs["stage_b"]).output_dir))
    stage_c = latest(Path(load_config(configs["stage_c"]).output_dir))
    tmp = ship.with_name(ship.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(out / "models" / "clip", tmp / "clip")
    shutil.copytree(out / "models" / "CogVideoX", tmp / "CogVideoX")
    shutil.copytree(out / "models" / "Mistral", tmp / "Mistral")
    shutil.copytree(stage_a / "encoder", tmp / "stage_a" / "encoder")
    shutil.copytree(stage_a / "decoder", tmp / "stage_a" / "decoder")
    shutil.copytree(stage_c / "decoder", tmp / "stage_c" / "decoder")
    # the trained MLLM parts (adapter, resamplers, slot embeddings, layout), not the optimizer/RNG state
    shutil.copytree(stage_b, tmp / "stage_b", ignore=shutil.ignore_patterns(*RESUME_STATE))
    shutil.copytree(out / "configs", tmp / "configs")
    readme = ship / "README.md"
    if readme.is_file():  # written by hand with the numbers of the run; kept across reruns
        shutil.copy2(readme, tmp / "README.md")
    if ship.exists():
        shutil.rmtree(ship)
    tmp.rename(ship)
    sizes = {p.relative_to(ship).as_posix(): p.stat().st_size for p in sorted(ship.rglob("*.safetensors"))}
    return {"safetensors_bytes": sum(sizes.values()), "files": sizes}


def step_evaluate(cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    """The ablation table, then its files (means, and intervals split by turn kind) copied into ship_dir."""
    entries = load_script("run_ablations").main(["--config", str(configs["ablations"]), "--quiet"])
    table_dir, ship = Path(load_config(configs["ablations"]).output_dir), Path(cfg.ship_dir)
    copied = []
    if ship.is_dir():
        for name in ("table.md", "table.csv", "table_intervals.md", "table_intervals.csv", "table_intervals.json"):
            if (table_dir / name).is_file():
                shutil.copy2(table_dir / name, ship / f"eval_{name}")
                copied.append(f"eval_{name}")
    return {"rows": [label for label, _ in entries], "tables": copied}


def main(argv: list[str] | None = None) -> dict:
    cfg, _ = parse_config(SpriteWorldRunConfig, __doc__, argv)
    unknown = [s for s in cfg.steps if s not in STEPS]
    if unknown:
        raise SystemExit(f"error: unknown steps {unknown}; steps are {list(STEPS)}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "run.yaml", to_yaml(cfg))
    configs = resolve_configs(cfg)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    for step in (s for s in STEPS if s in cfg.steps):
        print(f"==== {step}", flush=True)
        started = time.perf_counter()
        if step == "data":
            result = step_data(configs)
        elif step == "pretrain":
            result = step_pretrain(cfg, configs)
        elif step == "pretrain_llm":
            result = step_pretrain_llm(configs)
        elif step in ("stage_a", "stage_b", "stage_c"):
            result = step_stage(step, configs)
        elif step == "ship":
            result = step_ship(cfg, configs)
        else:
            result = step_evaluate(cfg, configs)
        result["seconds"] = round(time.perf_counter() - started, 1)
        summary[step] = result
        atomic_write_json(summary_path, summary)
        print(f"==== {step} done in {result['seconds']:.0f} s", flush=True)
    print(json.dumps({k: {"seconds": v.get("seconds")} for k, v in summary.items()}), file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
