import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from animegamer.config import load_config
from animegamer.data.manifest import read_manifest
from animegamer.data.sequences import build_windows, runs, split_films, split_in_time, windows_of_run
from animegamer.data.stage_b import StageBCollator, StageBDataset, filter_windows
from animegamer.data.tensor_store import TensorStore
from animegamer.models.mllm_tokenizer import load_tokenizer
from animegamer.models.weights import load_state_dict_file
from animegamer.recipes import stage_b
from animegamer.tokens import PAPER, TurnLayout
from animegamer.training.batches import ResumableBatchSampler
from tests.helpers.stage_b_data import clip_id, write_stage_b_data
from tests.helpers.stage_runs import SHOT_DIM, stage_b_overrides
from tests.helpers.stage_runs import STAGE_B_SLOTS as SLOTS
from tests.helpers.stage_scripts import free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


# ---------------------------------------------------------------- windows and splits


def test_windows_history_and_stride(tmp_path):
    manifest = read_manifest(write_stage_b_data(tmp_path, films=1, clips_per_film=5)[0])
    run = runs(manifest.records)[0]
    got = [w.clip_ids for w in windows_of_run(run, history_turns=2)]
    ids = [clip_id(0, i) for i in range(5)]
    assert got == [tuple(ids[:1]), tuple(ids[:2]), tuple(ids[:3]), tuple(ids[1:4]), tuple(ids[2:5])]
    strided = windows_of_run(run, history_turns=1, stride=2)
    assert [w.current for w in strided] == [ids[0], ids[2], ids[4]]
    assert strided[1].history == (ids[1],)
    assert [len(w.clip_ids) for w in windows_of_run(run, history_turns=0)] == [1] * 5
    with pytest.raises(ValueError):
        windows_of_run(run, history_turns=1, stride=0)
    # every turn with every shorter history too, down to none
    every = [w.clip_ids for w in windows_of_run(run, history_turns=2, all_history_lengths=True)]
    assert every[:6] == [tuple(ids[:1]), tuple(ids[:2]), tuple(ids[1:2]), tuple(ids[:3]), tuple(ids[1:3]),
                         tuple(ids[2:3])]
    assert len(every) == 1 + 2 + 3 + 3 + 3 and sum(len(w) == 1 for w in every) == 5
    assert {w[-1] for w in every} == set(ids) and set(got) <= set(every)


def test_windows_shorter_than_a_turns_reach_are_dropped(tmp_path):
    manifest = read_manifest(write_stage_b_data(tmp_path, films=1, clips_per_film=5)[0])
    run = runs(manifest.records)[0]
    ids = [r.clip_id for r in run]
    run[3].extra["reach"] = 2  # turn 3 names something only turn 1 showed ("go back")
    run[4].extra["reach"] = 1
    every = windows_of_run(run, history_turns=3, all_history_lengths=True, reach_field="reach")
    by_turn = {i: sorted(len(w.history) for w in every if w.current == i) for i in ids}
    assert by_turn == {ids[0]: [0], ids[1]: [0, 1], ids[2]: [0, 1, 2], ids[3]: [2, 3], ids[4]: [1, 2, 3]}
    # without the field every window stays; a turn reaching past the longest history has none
    assert len(windows_of_run(run, history_turns=3, all_history_lengths=True)) == len(every) + 3
    run[3].extra["reach"] = 4
    assert ids[3] not in {w.current for w in windows_of_run(run, history_turns=3, reach_field="reach")}
    for bad in (-1, "2", True, 1.5):
        run[3].extra["reach"] = bad
        with pytest.raises(ValueError, match="reach"):
            windows_of_run(run, history_turns=3, reach_field="reach")


def test_runs_break_at_uncaptioned_clips_and_gaps(tmp_path):
    manifest = read_manifest(write_stage_b_data(tmp_path, films=1, clips_per_film=8, uncaptioned=(clip_id(0, 3),))[0])
    records = [r for r in manifest.records if r.clip_index != 6]  # clip 6 dropped: 5 and 7 are not consecutive
    assert [[r.clip_index for r in run] for run in runs(records)] == [[0, 1, 2], [4, 5], [7]]
    windows = [w for run in runs(records) if len(run) >= 2 for w in windows_of_run(run, history_turns=3)]
    assert all(len({c.split("_")[0] for c in w.clip_ids}) == 1 for w in windows)
    assert (clip_id(0, 2), clip_id(0, 4)) not in {w.clip_ids[-2:] for w in windows}


def test_split_by_film_never_shares_a_film(tmp_path):
    manifest = read_manifest(write_stage_b_data(tmp_path, films=5, clips_per_film=4)[0])
    train = build_windows(manifest, history_turns=2, split="train", test_fraction=0.2)
    test = build_windows(manifest, history_turns=2, split="test", test_fraction=0.2)
    train_films = {w.film_id for w in train}
    test_films = {w.film_id for w in test}
    assert len(test_films) == 1 and len(train_films) == 4 and not train_films & test_films
    assert all(c.startswith(w.film_id) for w in train + test for c in w.clip_ids)
    assert len(train) + len(test) == len(build_windows(manifest, history_turns=2, split="all"))
    # deterministic and stable: a new film does not move the others
    films = [f"film{i:02d}" for i in range(5)]
    assert split_films(films, 0.2) == split_films(list(reversed(films)), 0.2)
    assert set(split_films(films, 0.2)[1]) <= set(split_films([*films, "film99"], 0.4)[1])
    # a single film cannot be split by film
    one = read_manifest(write_stage_b_data(tmp_path / "one", films=1, clips_per_film=4)[0])
    with pytest.raises(ValueError, match="split_by=time"):
        build_windows(one, history_turns=1, split="test", split_by="film")


def test_split_in_time_is_8_to_2_without_crossing(tmp_path):
    manifest = read_manifest(write_stage_b_data(tmp_path, films=1, clips_per_film=10)[0])
    train_clips, test_clips = split_in_time(manifest.records, 0.2)
    assert [r.clip_index for r in train_clips] == list(range(8)) and [r.clip_index for r in test_clips] == [8, 9]
    train = build_windows(manifest, history_turns=3, split="train", split_by="time")
    test = build_windows(manifest, history_turns=3, split="test", split_by="time")
    assert {c for w in train for c in w.clip_ids} == {clip_id(0, i) for i in range(8)}
    assert {c for w in test for c in w.clip_ids} == {clip_id(0, 8), clip_id(0, 9)}
    assert [w.clip_ids for w in test] == [(clip_id(0, 8),), (clip_id(0, 8), clip_id(0, 9))]  # history restarts
    assert len(train) == 8


# ---------------------------------------------------------------- dataset


@pytest.fixture
def layout(tiny_mistral_dir):
    tokenizer, _ = load_tokenizer(str(tiny_mistral_dir), "paper", SLOTS)
    return TurnLayout(tokenizer, PAPER, SLOTS)


def test_dataset_missing_targets_trimming_and_shapes(tmp_path, layout):
    manifest_path, store_path = write_stage_b_data(
        tmp_path, films=2, clips_per_film=4, num_slots=SLOTS, shot_dim=SHOT_DIM, missing=(clip_id(1, 1),)
    )
    manifest, store = read_manifest(manifest_path), TensorStore(store_path)
    windows = build_windows(manifest, history_turns=2, split="all")
    kept, missing = filter_windows(windows, store)
    assert missing == [clip_id(1, 1)]
    assert len(kept) == len(windows) - 3  # the windows with clip 1 of film 1: as current, and in two histories
    assert all(clip_id(1, 1) not in w.clip_ids for w in kept)

    full = StageBDataset(kept, manifest, store, layout, max_seq_len=4096, shot_dim=SHOT_DIM)
    item = full[2]  # 3 turns
    assert item["history_shots"].shape == (2, SLOTS, SHOT_DIM) and item["target_shot"].shape == (SLOTS, SHOT_DIM)
    torch.testing.assert_close(item["target_shot"], store.load(full.windows[2].current)["shot_embeds"])
    two_turns = len(full[1]["input_ids"])
    short = StageBDataset(kept, manifest, store, layout, max_seq_len=two_turns, shot_dim=SHOT_DIM)
    assert short.trimmed > 0 and max(len(short[i]["input_ids"]) for i in range(len(short))) <= two_turns
    assert [w.current for w in short.windows] == [w.current for w in full.windows]
    with pytest.raises(ValueError, match="longer than max_seq_len"):
        StageBDataset(kept, manifest, store, layout, max_seq_len=10, shot_dim=SHOT_DIM)
    with pytest.raises(ValueError, match=r"expected \(8, 16\)"):
        StageBDataset(kept, manifest, store, layout, max_seq_len=4096, shot_dim=16)[0]


def test_collator_padding_and_packing(tmp_path, layout):
    manifest_path, store_path = write_stage_b_data(tmp_path, films=1, clips_per_film=4, num_slots=SLOTS,
                                                   shot_dim=SHOT_DIM)
    manifest = read_manifest(manifest_path)
    dataset = StageBDataset(build_windows(manifest, 1, split="all"), manifest, TensorStore(store_path), layout,
                            max_seq_len=256, shot_dim=SHOT_DIM)
    items = [dataset[i] for i in range(4)]
    lengths = [len(i["input_ids"]) for i in items]
    padded = StageBCollator(pad_id=0, max_seq_len=256)(items)
    assert padded["input_ids"].shape == (4, -(-max(lengths) // 8) * 8)
    assert padded["attention_mask"].sum(-1).tolist() == lengths and padded["num_tokens"] == sum(lengths)
    packed = StageBCollator(pad_id=0, max_seq_len=256, pack=True)(items)
    assert packed["input_ids"].shape[0] == 2 and packed["num_tokens"] == sum(lengths)
    # every sequence restarts its positions; labels, slots and targets survive packing
    starts = (packed["position_ids"] == 0).nonzero().tolist()
    assert [r for r, _ in starts].count(0) >= 2
    assert (packed["labels"] != -100).sum() == (padded["labels"] != -100).sum() == 16
    flat = packed["input_ids"].reshape(-1)
    for positions in packed["query_positions"]:
        assert flat[positions].tolist() == layout.slot_ids
    torch.testing.assert_close(packed["target_shots"], padded["target_shots"])


def test_history_noise_perturbs_the_history_shots_only(tmp_path, layout):
    """history_noise > 0: the MLLM reads history shots + noise of that fraction of their std (a game's history is
    its own predicted shots); targets and tokens stay as they were, 0 draws nothing."""
    script = stage_b
    manifest_path, store_path = write_stage_b_data(tmp_path, films=1, clips_per_film=4, num_slots=SLOTS,
                                                   shot_dim=SHOT_DIM)
    manifest = read_manifest(manifest_path)
    dataset = StageBDataset(build_windows(manifest, 2, split="all"), manifest, TensorStore(store_path), layout,
                            max_seq_len=512, shot_dim=SHOT_DIM)
    batch = StageBCollator(pad_id=0, max_seq_len=512)([dataset[i] for i in range(len(dataset))])
    clean = batch["history_shots"]
    assert clean.shape[0] >= 4
    rng = torch.get_rng_state()
    assert script.perturb_history(batch, 0.0) is batch and torch.equal(torch.get_rng_state(), rng)
    empty = {**batch, "history_shots": clean[:0]}
    assert script.perturb_history(empty, 0.5) is empty
    torch.manual_seed(0)
    noisy = script.perturb_history(batch, 0.5)
    assert torch.equal(batch["history_shots"], clean)  # the input batch is not changed in place
    noise = noisy["history_shots"] - clean
    assert abs(float(noise.std() / clean.std()) - 0.5) < 0.05
    for key in batch.keys() - {"history_shots"}:
        assert noisy[key] is batch[key], key
    with pytest.raises(Exception, match="history_noise=-0.1 must be >= 0"):
        load_config(ROOT / "configs" / "tiny" / "stage_b.yaml", ["history_noise=-0.1"])


# ---------------------------------------------------------------- the training script


def metrics(run_dir: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    # rows are (step, name, value, time); the header is skipped by content because under two processes
    # training/run.py's CSVTracker can lose it (both ranks construct the tracker; reported)
    for step, name, value, _ in csv.reader(open(run_dir / "metrics.csv")):
        if step != "step":
            out.setdefault(name, []).append(float(value))
    return out


def trained_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    return {
        **load_state_dict_file(step_dir / "adapter_model.safetensors"),
        **load_state_dict_file(step_dir / "mllm_trained.safetensors"),
    }


@pytest.mark.parametrize("history_noise", [0.0, 0.3])
def test_train_stage_b_resumes_exactly(tmp_path, tiny_mistral_dir, capsys, history_noise):
    script = stage_b
    config = str(ROOT / "configs" / "tiny" / "stage_b.yaml")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"

    def run(out: Path, **extra) -> None:
        script.main(["--config", config, *stage_b_overrides(tmp_path, tiny_mistral_dir, out,
                                                            history_noise=history_noise, **extra)])

    run(straight, **{"train.max_steps": 6})
    printed = capsys.readouterr().out
    assert "1 clips have no shot target" in printed
    assert (straight / "missing_shot_targets.txt").read_text() == f"{clip_id(2, 4)}\n"
    run(resumed, **{"train.max_steps": 4})
    run(resumed, **{"train.max_steps": 6, "train.resume": "latest"})
    assert "resumed from" in capsys.readouterr().out

    final = straight / "checkpoints" / "step_0000006"
    assert (straight / "checkpoints" / "latest").read_text().strip() == final.name
    for name in ("adapter_config.json", "adapter_model.safetensors", "mllm_trained.safetensors", "optimizer.bin",
                 "trainer_state.json"):
        assert (final / name).is_file(), name
    a, b = trained_tensors(final), trained_tensors(resumed / "checkpoints" / "step_0000006")
    assert a.keys() == b.keys() and len(a) > 4
    for k in a:
        assert torch.equal(a[k], b[k]), k
    logged_a, logged_b = metrics(straight), metrics(resumed)
    assert logged_a["loss"] == logged_b["loss"]  # 4 + 2 steps logged the same 6 losses
    loss = logged_a["loss"]
    assert all(torch.isfinite(torch.tensor(loss))) and sum(loss[-2:]) < sum(loss[:2])
    for part in ("ce", "mse", "cos", "state_acc", "lr", "tokens_per_s", "steps_per_s"):
        assert len(logged_a[part]) == 6, part
    assert all(v > 0 for v in logged_a["steps_per_s"]) and "peak_gpu_memory_gb" not in logged_a  # a CPU run
    assert json.loads((final / "trainer_state.json").read_text())["step"] == 6
    # the games' vocabulary: the words of the clips the run trained on, beside the weights
    from animegamer.data.manifest import read_manifest
    from animegamer.data.vocabulary import load_vocabulary

    vocabulary = load_vocabulary(final)
    trained = [r.shot_tags() for r in read_manifest(tmp_path / "data" / "clips.jsonl").records if r.shot_tags()]
    assert vocabulary is not None and set(vocabulary.characters) <= {t.subject for t in trained}
    assert vocabulary.motions and set(vocabulary.motions) <= {t.motion for t in trained}


def test_train_stage_b_with_the_identity_term(tmp_path, tiny_mistral_dir, capsys):
    """identity_weight > 0: batches carry each current turn's identity swaps, the term is logged and falls; the
    run is deterministic (run twice, the same weights bit for bit)."""
    write_stage_b_data(tmp_path / "data", films=3, clips_per_film=5, num_slots=SLOTS, shot_dim=SHOT_DIM, swaps=2)
    out = tmp_path / "run"

    def run(folder: Path) -> None:
        stage_b.main(["--config", str(ROOT / "configs" / "tiny" / "stage_b.yaml"),
                      *stage_b_overrides(tmp_path, tiny_mistral_dir, folder, identity_weight=4.0,
                                         **{"train.max_steps": 10, "train.batch_size": 4})])

    run(out)
    assert "identity term: 8 of 15 current clips have identity swaps" in capsys.readouterr().out
    run(tmp_path / "again")
    a = trained_tensors(out / "checkpoints" / "step_0000010")
    b = trained_tensors(tmp_path / "again" / "checkpoints" / "step_0000010")
    assert a.keys() == b.keys() and len(a) > 4 and all(torch.equal(a[k], b[k]) for k in a)
    logged = metrics(out)
    identity = logged["identity"]
    assert len(identity) == 10 and all(torch.isfinite(torch.tensor(identity)))
    held = [v for v in identity if v > 0]  # a batch whose current turns name no friend has no term
    assert len(held) >= 6 and sum(held[-3:]) < 0.9 * sum(held[:3])
    assert logged["loss"][0] > 0.5 * logged["mse"][0] + 4.0 * identity[0]  # the loss holds the term


def test_train_stage_b_two_processes(tmp_path, tiny_mistral_dir, capsys):
    out = tmp_path / "ddp"
    overrides = stage_b_overrides(tmp_path, tiny_mistral_dir, out, **{
        "train.max_steps": 3, "train.batch_size": 1, "data.history_turns": 1, "train.checkpoint_every": 3,
    })
    # some step must mix a window without history (input resampler unused) with one that has history: DDP only
    # works there because the resampler always runs, on an empty batch if need be
    cfg = load_config(ROOT / "configs" / "tiny" / "stage_b.yaml", overrides)
    manifest = read_manifest(cfg.data.manifest)
    windows, _ = filter_windows(build_windows(manifest, 1, split="all"), TensorStore(cfg.shot_targets))
    order = ResumableBatchSampler(len(windows), 1, seed=cfg.seed, world_size=2)
    steps = [order.global_batch(i) for i in range(3)]
    assert any(len({len(windows[j].clip_ids) for j in step}) == 2 for step in steps)

    # `accelerate launch --cpu --num_processes 2` starts one process (multi-CPU wants mpirun); torchrun's launcher
    # with ACCELERATE_USE_CPU=true starts two that talk over gloo
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}  # this checkout's package, wherever the venv's points
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()),
           str(ROOT / "scripts" / "train_stage_b.py"), "--config", str(ROOT / "configs" / "tiny" / "stage_b.yaml"),
           *overrides]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "run_info.json").read_text())["num_processes"] == 2
    final = out / "checkpoints" / "step_0000003"
    assert (final / "random_states_1.pkl").is_file() and (final / "mllm_trained.safetensors").is_file()
    assert len(metrics(out)["loss"]) == 3
    assert result.stdout.count("done: 3 steps") == 1  # printed by the main process only
    # resumed on one process: other batches, not an exact resume; refused in one line unless allowed
    script = stage_b
    resumed = ["--config", str(ROOT / "configs" / "tiny" / "stage_b.yaml"), *overrides, "train.max_steps=4",
               "train.resume=latest"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        script.main(resumed)
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and err.startswith("error: ") and "\n" not in err
    assert "num_processes 2 -> 1" in err and "allow_recipe_change=true" in err
    script.main([*resumed, "train.allow_recipe_change=true"])
    changed = json.loads((out / "run_info.json").read_text())["recipe_changed"]
    assert changed["num_processes"] == {"was": 2, "now": 1}
    assert changed["distributed_type"]["was"] == "DistributedType.MULTI_CPU"


# ---------------------------------------------------------------- bad input: one line, exit code 2, nothing written


def _fails_with_one_line(script, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "line, needle",
    [
        ("{not json", "not valid JSON"),
        ('{"clip_id": "x", "video": "x.mp4", "film_id": "f", "clip_index": 0, "start": 0}', "missing field 'end'"),
        ("TAGS_OUT_OF_RANGE", "'stamina': 7 is not one of"),
    ],
    ids=["malformed_json", "missing_field", "tag_out_of_range"],
)
def test_a_bad_manifest_line_is_one_error_naming_file_and_line(tmp_path, tiny_mistral_dir, capsys, line, needle):
    overrides = stage_b_overrides(tmp_path, tiny_mistral_dir, tmp_path / "run")
    manifest = tmp_path / "data" / "clips.jsonl"
    lines = manifest.read_text().splitlines()
    if line == "TAGS_OUT_OF_RANGE":
        row = json.loads(lines[2])
        row["tags"] = row["tags"].replace(row["tags"][row["tags"].index("<ST>") :], "<ST>7</ST>")
        line = json.dumps(row)
    manifest.write_text("\n".join([*lines[:2], line, *lines[3:]]) + "\n")
    script = stage_b
    argv = ["--config", str(ROOT / "configs" / "tiny" / "stage_b.yaml"), *overrides]
    err = _fails_with_one_line(script, argv, capsys)
    assert f"{manifest}:3: " in err and needle in err
    assert not (tmp_path / "run").exists()  # nothing of the run was written


def test_a_missing_resume_checkpoint_leaves_a_finished_run_alone(tmp_path, tiny_mistral_dir, capsys):
    out = tmp_path / "run"
    out.mkdir()
    finished = {"config.yaml": "kind: stage_b\n# the finished run's\n", "run_info.json": '{"finished": true}\n',
                "metrics.csv": "step,name,value,time\n1,loss,2.0,0\n"}
    for name, text in finished.items():
        (out / name).write_text(text)
    argv = ["--config", str(ROOT / "configs" / "tiny" / "stage_b.yaml"),
            *stage_b_overrides(tmp_path, tiny_mistral_dir, out), "--resume", str(tmp_path / "nonexistent")]
    err = _fails_with_one_line(stage_b, argv, capsys)
    assert "checkpoint not found" in err and str(tmp_path / "nonexistent") in err
    assert {name: (out / name).read_text() for name in finished} == finished


def test_the_removed_encoder_checkpoint_key_is_an_unknown_key(tmp_path, tiny_mistral_dir, capsys):
    argv = ["--config", str(ROOT / "configs" / "tiny" / "stage_b.yaml"),
            *stage_b_overrides(tmp_path, tiny_mistral_dir, tmp_path / "run"), "encoder_checkpoint=/nonexistent"]
    assert "encoder_checkpoint" in _fails_with_one_line(stage_b, argv, capsys)
