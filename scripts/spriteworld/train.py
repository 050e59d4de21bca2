"""SpriteWorld end to end on a CPU: data -> pretraining -> stages (a) -> (d) -> shipped checkpoint -> report.

    python scripts/spriteworld/train.py --config configs/spriteworld/run.yaml           # the shipped checkpoint
    python scripts/spriteworld/train.py --config configs/spriteworld/mini.yaml output_dir=/tmp/sw_mini   # ~1 min
    python scripts/spriteworld/train.py --config configs/spriteworld/run.yaml "steps=[ship,evaluate]"   # some steps

Each step runs the library function or the real entry point's ``main(argv)`` in this process, with the step's
YAML from ``configs`` (data.yaml, pretrain.yaml, pretrain_llm.yaml, stage_a/b/c/d/d4/d1.yaml, eval.yaml,
ablations.yaml):

    data       animegamer.spriteworld.films.write_dataset (as scripts/spriteworld/make.py); then
               <out>/data/train.jsonl: the training films only (stages a-d never see a held-out film; pretraining
               reads the split itself)
    pretrain   the tiny random CLIP (frozen, seeded) and Mistral (animegamer.tiny), then
               animegamer.spriteworld.pretrain (as scripts/spriteworld/pretrain.py): tiny T5, VAE, stage (a)
               features, base text-to-video transformer
    pretrain_llm  animegamer.spriteworld.pretrain_llm (as scripts/spriteworld/pretrain_llm.py): the tiny Mistral
               trained as a causal LM on the training films' text (the pretrained LLM stage (b) adds LoRA to)
    stage_a    scripts/train_stage_a.py    stage_b  scripts/train_stage_b.py    stage_c  scripts/train_stage_c.py
    stage_d    scripts/train_stage_d.py: the 2-step student of the stage (c) decoder (make demo-fast plays it)
    stage_d4, stage_d1  scripts/train_stage_d.py with stage_d4.yaml / stage_d1.yaml: 4- and 1-step students of
               the same teacher (not in run.yaml's steps; their table rows are distilled4 / distilled1)
    stage_e    scripts/train_stage_e.py: the small causal decoder of the VAE's latents (make demo-fast decodes with it)
    ship       the weights inference needs (safetensors + configs, no optimizer states), assembled beside
               ``ship_dir`` and swapped in whole: stage_a/, stage_b/, stage_c/, stage_d/ (the student's decoder),
               stage_e/ (the small decoder: from its run, or else ship_dir's own when it was trained on the same
               VAE), the pretrained models and the resolved configs; ship_dir's README.md is kept
    ship_stage_e  the stage (e) small decoder alone into ship_dir/stage_e (swapped in whole, the rest of ship_dir
               untouched): a small decoder trained on a shipped checkpoint's VAE joins it without retraining the
               other stages
    evaluate   scripts/run_ablations.py with ablations.yaml: the main table (AnimeGamer, GC-style, random,
               majority), no decoder adaptation, stage (a) reconstruction with and without the motion scope;
               its tables (table.{md,csv}, table_intervals.{md,csv,json}) copied into ship_dir as eval_*.
               ``eval_rows`` runs some rows only; the tables keep the other rows' earlier results (dropped when
               the same call ran ship: they belong to the previous checkpoint)

The step YAMLs name ``outputs/spriteworld`` and ``checkpoints/spriteworld``; they are rewritten to ``output_dir`` and
``ship_dir`` (and ``configs/spriteworld`` to ``output_dir/configs``), the step's ``overrides`` applied (a mapping of
values, or ``key=value`` strings; their paths move too), and the resolved YAML saved as
``output_dir/configs/<name>.yaml`` before the step runs.
``output_dir/summary.json`` collects every step's time and first/last losses.
"""

from __future__ import annotations

import csv
import filecmp
import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from animegamer.cli import UsageError, fail, parse_config
from animegamer.config import ConfigError, SpriteWorldRunConfig, load_config, to_yaml
from animegamer.data.manifest import ManifestError
from animegamer.eval.ablations import main as run_ablations
from animegamer.io import atomic_write_text, resolve_checkpoint, update_json
from animegamer.models.trained import SMALL_DECODER_DIR
from animegamer.recipes import train_stage

STEPS = ("data", "pretrain", "pretrain_llm", "stage_a", "stage_b", "stage_c", "stage_d", "stage_d4", "stage_d1",
         "stage_e", "ship", "ship_stage_e", "evaluate")
CONFIG_FILES = ("data", "pretrain", "pretrain_llm", "stage_a", "stage_b", "stage_c", "stage_d", "stage_d4", "stage_d1",
                "stage_e", "inference", "eval", "ablations")
# the other students are stage (d) runs of their own YAML (stage_d4.yaml, stage_d1.yaml)
STAGE_SCRIPTS = {"stage_d4": "stage_d", "stage_d1": "stage_d"}
RESUME_STATE = ("optimizer*.bin", "scheduler*.bin", "random_states_*.pkl", "trainer_state.json")
DEFAULT_OUT, DEFAULT_SHIP, DEFAULT_CONFIGS = "outputs/spriteworld", "checkpoints/spriteworld", "configs/spriteworld"


def resolve_configs(cfg: SpriteWorldRunConfig) -> dict[str, Path]:
    """Every step YAML with its paths moved to this run and its overrides applied, under output_dir/configs/.

    A step's overrides are a mapping of its values (merged onto the step YAML, as a ``base`` file's child is) or a
    list of ``key=value`` strings (as on a command line); the paths in either move like the step YAML's."""
    unknown = sorted(set(cfg.overrides) - set(CONFIG_FILES))
    if unknown:
        fail(f"overrides for unknown configs {unknown}; known: {list(CONFIG_FILES)}")
    out = Path(cfg.output_dir)
    moves = {DEFAULT_CONFIGS: str(out / "configs"), DEFAULT_OUT: str(out), DEFAULT_SHIP: cfg.ship_dir}
    pattern = re.compile("|".join(re.escape(k) for k in sorted(moves, key=len, reverse=True)))

    def move(text: str) -> str:
        return pattern.sub(lambda m: moves[m.group(0)], text)

    resolved = {}
    for name in CONFIG_FILES:
        text = move(to_yaml(load_config(Path(cfg.configs) / f"{name}.yaml")))
        path = out / "configs" / f"{name}.yaml"
        step = cfg.overrides.get(name)
        if isinstance(step, dict):
            values = OmegaConf.create(move(OmegaConf.to_yaml(step)))
            text = OmegaConf.to_yaml(OmegaConf.merge(OmegaConf.create(text), values))
        atomic_write_text(path, text)
        if step:
            items = [move(str(item)) for item in step] if isinstance(step, list) else []
            try:
                atomic_write_text(path, to_yaml(load_config(path, items)))
            except ConfigError as exc:
                fail(f"overrides.{name}: {exc}")
        resolved[name] = path
    for stale in sorted(set((out / "configs").glob("*.yaml")) - set(resolved.values())):
        stale.unlink()  # a step an earlier recipe had (e.g. renamed since): ship copies this folder as the record
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
    from animegamer.spriteworld.films import write_dataset

    data_cfg = load_config(configs["data"])
    manifest = read_manifest(write_dataset(data_cfg))
    train_films = set(manifest.meta["splits"]["train"])
    train = [r for r in manifest.records if r.film_id in train_films]
    write_manifest(manifest.path.with_name("train.jsonl"), train, manifest.meta)
    return {"clips": len(manifest), "train_clips": len(train), "test_films": len(manifest.meta["splits"]["test"])}


def step_pretrain(cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    from animegamer.spriteworld.memory import lexicon
    from animegamer.spriteworld.pretrain import pretrain
    from animegamer.tiny import build_tiny_clip, build_tiny_mistral

    models = Path(cfg.output_dir) / "models"
    build_tiny_clip(models / "clip", seed=cfg.seed)
    back = load_config(configs["data"]).back  # the world says "back": its word joins the tokenizer's corpus
    build_tiny_mistral(models / "Mistral", seed=cfg.seed, hidden_size=cfg.mistral_hidden, words=lexicon(back))
    pretrain_cfg = load_config(configs["pretrain"])
    pretrain(pretrain_cfg)
    return json.loads((Path(pretrain_cfg.report_dir) / "summary.json").read_text())


def step_pretrain_llm(configs: dict[str, Path]) -> dict:
    from animegamer.spriteworld.pretrain_llm import pretrain_llm

    llm_cfg = load_config(configs["pretrain_llm"])
    pretrain_llm(llm_cfg)
    return json.loads((Path(llm_cfg.report_dir) / "summary.json").read_text())


def step_stage(name: str, configs: dict[str, Path]) -> dict:
    """A fresh run of the stage's recipe (animegamer/recipes/, what ``scripts/train_<stage>.py`` runs) with the
    step's YAML (an earlier run's directory is replaced)."""
    out = Path(load_config(configs[name]).output_dir)
    shutil.rmtree(out, ignore_errors=True)
    train_stage(STAGE_SCRIPTS.get(name, name), ["--config", str(configs[name])])
    return losses_of(out / "metrics.csv", ("loss", "ce", "mse", "state_acc"))


def latest(run_dir: Path) -> Path:
    return resolve_checkpoint(run_dir)


def same_files(a: Path, b: Path) -> bool:
    """Whether folders ``a`` and ``b`` hold the same files, byte for byte."""
    names = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()) if a.is_dir() else []
    return bool(names) and names == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
        filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def step_ship(cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    """Assemble the weights inference and evaluation need beside ship_dir, then swap the whole folder in (an
    interrupted ship leaves the previous one whole); returns the sizes."""
    from animegamer.training.checkpoint import write_dir_atomically

    out, ship = Path(cfg.output_dir), Path(cfg.ship_dir)
    stages = {name: latest(Path(load_config(configs[name]).output_dir))
              for name in ("stage_a", "stage_b", "stage_c", "stage_d")}
    stage_e = Path(load_config(configs["stage_e"]).output_dir)
    readme = ship / "README.md"
    # the small decoder is trained apart (ship_stage_e); without a run of it here, the shipped one stays when it
    # decodes the very VAE being shipped
    shipped_small = ship / "stage_e" / SMALL_DECODER_DIR
    trained_small = (stage_e / "checkpoints" / "latest").is_file()
    keep_small = not trained_small and shipped_small.is_dir()
    if keep_small and not same_files(out / "models" / "CogVideoX" / "vae", ship / "CogVideoX" / "vae"):
        keep_small = False
        print(f"ship: {shipped_small} dropped: it was trained on another VAE (steps=[stage_e,ship_stage_e] trains "
              "one on this one)", flush=True)

    def assemble(tmp: Path) -> None:
        for model in ("clip", "CogVideoX", "Mistral"):
            shutil.copytree(out / "models" / model, tmp / model)
        shutil.copytree(stages["stage_a"] / "encoder", tmp / "stage_a" / "encoder")
        shutil.copytree(stages["stage_a"] / "decoder", tmp / "stage_a" / "decoder")
        shutil.copytree(stages["stage_c"] / "decoder", tmp / "stage_c" / "decoder")
        # the student's LoRA, motion embedding and sampler.json (its timesteps): sampling.preset=distilled plays it
        shutil.copytree(stages["stage_d"] / "decoder", tmp / "stage_d" / "decoder")
        if trained_small:  # the small decoder: sampling.vae=small decodes with it
            shutil.copytree(latest(stage_e) / SMALL_DECODER_DIR, tmp / "stage_e" / SMALL_DECODER_DIR)
        elif keep_small:
            shutil.copytree(shipped_small, tmp / "stage_e" / SMALL_DECODER_DIR)
        # the trained MLLM parts (adapter, resamplers, slot embeddings, layout), not the optimizer/RNG state
        shutil.copytree(stages["stage_b"], tmp / "stage_b", ignore=shutil.ignore_patterns(*RESUME_STATE))
        shutil.copytree(out / "configs", tmp / "configs")
        if keep_small and (ship / "configs" / "stage_e.yaml").is_file():  # the recipe that trained the kept one
            shutil.copy2(ship / "configs" / "stage_e.yaml", tmp / "configs" / "stage_e.yaml")
        if readme.is_file():  # written by hand with the numbers of the run; kept across reruns
            shutil.copy2(readme, tmp / "README.md")

    write_dir_atomically(ship, assemble)
    sizes = {p.relative_to(ship).as_posix(): p.stat().st_size for p in sorted(ship.rglob("*.safetensors"))}
    return {"safetensors_bytes": sum(sizes.values()), "files": sizes}


def step_ship_stage_e(cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    """ship_dir/stage_e/small_decoder from the stage (e) run, swapped in whole; nothing else of ship_dir changes."""
    from animegamer.training.checkpoint import write_dir_atomically

    source = latest(Path(load_config(configs["stage_e"]).output_dir)) / SMALL_DECODER_DIR
    target = write_dir_atomically(Path(cfg.ship_dir) / "stage_e",
                                  lambda tmp: shutil.copytree(source, tmp / SMALL_DECODER_DIR))
    sizes = {p.relative_to(target.parent).as_posix(): p.stat().st_size for p in sorted(target.rglob("*"))
             if p.is_file()}
    return {"files": sizes}


def step_evaluate(cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    """The ablation table (the rows of ``eval_rows``, the others kept from earlier unless this call shipped a new
    checkpoint), then its files (means, and intervals split by turn kind) copied into ship_dir."""
    table_dir, ship = Path(load_config(configs["ablations"]).output_dir), Path(cfg.ship_dir)
    if "ship" in cfg.steps and table_dir.is_dir():  # rows evaluated on the previous checkpoint are stale
        shutil.rmtree(table_dir)
    rows = ["--rows", ",".join(cfg.eval_rows)] if cfg.eval_rows else []
    entries = run_ablations(["--config", str(configs["ablations"]), "--quiet", *rows])
    copied = []
    if ship.is_dir():
        for name in ("table.md", "table.csv", "table_intervals.md", "table_intervals.csv", "table_intervals.json"):
            if (table_dir / name).is_file():
                shutil.copy2(table_dir / name, ship / f"eval_{name}")
                copied.append(f"eval_{name}")
    return {"rows": [label for label, _ in entries], "tables": copied}


def run_step(step: str, cfg: SpriteWorldRunConfig, configs: dict[str, Path]) -> dict:
    """Run one step of the chain; returns what ``summary.json`` keeps of it."""
    if step == "data":
        return step_data(configs)
    if step == "pretrain":
        return step_pretrain(cfg, configs)
    if step == "pretrain_llm":
        return step_pretrain_llm(configs)
    if step in ("stage_a", "stage_b", "stage_c", "stage_d", "stage_d4", "stage_d1", "stage_e"):
        return step_stage(step, configs)
    if step == "ship":
        return step_ship(cfg, configs)
    if step == "ship_stage_e":
        return step_ship_stage_e(cfg, configs)
    return step_evaluate(cfg, configs)


def main(argv: list[str] | None = None) -> dict:
    cfg, _ = parse_config(SpriteWorldRunConfig, __doc__, argv)
    unknown = [s for s in cfg.steps if s not in STEPS]
    if unknown:
        fail(f"unknown steps {unknown}; steps are {list(STEPS)}")
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
        try:
            result = run_step(step, cfg, configs)
        except (ManifestError, FileNotFoundError, UsageError) as exc:  # a missing input (a step not run yet), a bad
            # setting: not a bug
            fail(f"step {step}: {exc}")
        result["seconds"] = round(time.perf_counter() - started, 1)
        summary = update_json(summary_path, step, result)  # read again under a lock: a call beside this one
        # (another output_dir step, e.g. a stage (d) student while the table is evaluated) keeps its entries
        print(f"==== {step} done in {result['seconds']:.0f} s", flush=True)
    print(json.dumps({k: {"seconds": v.get("seconds")} for k, v in summary.items()}), file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
