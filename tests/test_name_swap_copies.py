"""Stage (b)'s name swaps (``name_swap_copies``): windows whose friend is renamed, with the identity swaps' shots as
their targets; the swaps' names through features and shot targets; a tiny run with them."""

import pytest
import torch

from animegamer.data.features import write_shot_targets
from animegamer.data.manifest import read_manifest
from animegamer.data.name_swaps import (
    NAME_CODES,
    SWAP_NAMES_FIELD,
    SWAP_SHOT_FIELD,
    SWAP_TEXT_FIELD,
    names_from_tensor,
    names_tensor,
    swap_pairs,
)
from animegamer.data.sequences import build_windows
from animegamer.data.stage_b import StageBCollator, StageBDataset, held_out_friends
from animegamer.data.tensor_store import TensorStore
from animegamer.models.mllm_tokenizer import load_tokenizer
from animegamer.tokens import PAPER, TurnLayout
from tests.helpers.stage_b_data import NAMES, friend_of, write_stage_b_data
from tests.helpers.stage_runs import SHOT_DIM
from tests.helpers.stage_runs import STAGE_B_SLOTS as SLOTS

# ---------------------------------------------------------------- the swaps' names


def test_swap_pairs_are_name_swaps_order_and_round_trip_through_a_tensor():
    caption = "Character: Kai; Motion: talk with Luna; Background: noon park. Companion: Luna."
    pairs = swap_pairs(caption, "Kai", ["Qiqi", "Momo", "Kai", "Luna"])
    assert pairs == [("Luna", "Qiqi"), ("Luna", "Momo")]
    assert swap_pairs(caption, "Kai", ["Qiqi", "Momo", "Kai", "Luna"], limit=1) == pairs[:1]
    codes = names_tensor(pairs)
    assert codes.shape == (2, 2, NAME_CODES) and codes.dtype == torch.int32
    assert names_from_tensor(codes) == pairs
    assert names_from_tensor(names_tensor([])) == []


@pytest.mark.parametrize("bad", [torch.zeros(2, 3, NAME_CODES, dtype=torch.int32),
                                 torch.zeros(2, 2, dtype=torch.int32),
                                 torch.full((1, 2, NAME_CODES), -5, dtype=torch.int32),
                                 torch.zeros(1, 2, NAME_CODES, dtype=torch.int32)])  # empty names
def test_swap_names_from_a_file_are_checked(bad):
    with pytest.raises(ValueError):
        names_from_tensor(bad)


def test_a_name_too_long_to_store_is_refused():
    with pytest.raises(ValueError, match="longer than"):
        names_tensor([("A" * (NAME_CODES + 1), "B")])


def test_shot_targets_keep_the_swaps_names(tmp_path):
    g = torch.Generator().manual_seed(0)
    pairs = [("Luna", "Qiqi"), ("Luna", "Momo")]
    rows = {"c0": {"clip_tokens": torch.randn(2, 4, 6, generator=g), "text_tokens": torch.randn(7, 5, generator=g),
                   SWAP_TEXT_FIELD: torch.randn(2, 7, 5, generator=g), SWAP_NAMES_FIELD: names_tensor(pairs)},
            "c1": {"clip_tokens": torch.randn(2, 4, 6, generator=g), "text_tokens": torch.randn(7, 5, generator=g)}}
    TensorStore(tmp_path / "features").write_shard(rows)

    class Encoder(torch.nn.Module):
        def forward(self, clip_tokens, text_tokens):
            return clip_tokens[:, :3, :4] + text_tokens[:, :3, :4]

    out = TensorStore(write_shot_targets(Encoder(), tmp_path / "features", tmp_path / "targets", progress=False))
    got = out.load("c0")
    assert got[SWAP_SHOT_FIELD].shape == (2, 3, 4) and names_from_tensor(got[SWAP_NAMES_FIELD]) == pairs
    assert SWAP_NAMES_FIELD not in out.load("c1") and SWAP_SHOT_FIELD not in out.load("c1")


# ---------------------------------------------------------------- renamed windows


@pytest.fixture
def layout(tiny_mistral_dir):
    tokenizer, _ = load_tokenizer(str(tiny_mistral_dir), "paper", SLOTS)
    return TurnLayout(tokenizer, PAPER, SLOTS)


def _data(tmp_path, held_out=()):
    manifest_path, store_path = write_stage_b_data(
        tmp_path, films=2, clips_per_film=4, num_slots=SLOTS, shot_dim=SHOT_DIM, swaps=2, friends=True,
        meta={"config": {"held_out_pairs": list(held_out)}})
    manifest, store = read_manifest(manifest_path), TensorStore(store_path)
    return manifest, store, build_windows(manifest, history_turns=2, split="all")


def test_held_out_friends_are_the_character_pairs_of_the_manifest(tmp_path):
    manifest, _, _ = _data(tmp_path, held_out=("Qiqi:Ken", "Sam:eat", "Qiqi:Qiqi", "bad"))
    assert held_out_friends(manifest) == {frozenset(("Qiqi", "Ken")), frozenset(("Sam", "eat"))}
    manifest.meta["config"]["held_out_pairs"] = "Qiqi:Ken"
    with pytest.raises(ValueError, match="list of 'A:B' strings"):
        held_out_friends(manifest)


def test_renamed_windows_say_the_new_name_and_read_its_swap_shots(tmp_path, layout):
    manifest, store, windows = _data(tmp_path)
    plain = StageBDataset(windows, manifest, store, layout, 4096, SHOT_DIM, swaps=True)
    data = StageBDataset(windows, manifest, store, layout, 4096, SHOT_DIM, swaps=True, name_swap_copies=2)
    assert len(plain) == len(windows) and plain.renamed == 0
    friend_windows = [w for w in windows if int(w.current[-1]) % 2]  # odd clips name the film's friend
    assert data.renamed == 2 * len(friend_windows) and len(data) == len(windows) + data.renamed
    for index in range(len(windows)):  # the windows as they are come first, unchanged
        a, b = plain[index], data[index]
        assert all(torch.equal(a[k], b[k]) for k in a)
    tokenizer = layout.tokenizer
    seen = set()
    for index in range(len(windows), len(data)):
        window, (old, new) = data.items[index]
        film = int(window.film_id[-2:])
        assert old == friend_of(film) and new not in (old, NAMES[film % len(NAMES)])
        seen.add((film, new))
        item = data[index]
        text = tokenizer.decode(item["input_ids"].tolist())
        assert new in text and old not in text
        shots = [*item["history_shots"], item["target_shot"]]
        for cid, shot in zip(window.clip_ids, shots, strict=True):
            row = store.load(cid)
            if SWAP_NAMES_FIELD in row and (old, new) in names_from_tensor(row[SWAP_NAMES_FIELD]):
                which = names_from_tensor(row[SWAP_NAMES_FIELD]).index((old, new))
                torch.testing.assert_close(shot, row[SWAP_SHOT_FIELD][which])
            else:
                torch.testing.assert_close(shot, row["shot_embeds"])
        current = store.load(window.current)
        other = [i for i, p in enumerate(names_from_tensor(current[SWAP_NAMES_FIELD])) if p != (old, new)]
        expected = torch.stack([current["shot_embeds"], *current[SWAP_SHOT_FIELD][other]])
        torch.testing.assert_close(item["target_swaps"], expected)  # the real friend, then the other rename
    assert len(seen) == 4  # both other characters of both films
    batch = StageBCollator(pad_id=0, max_seq_len=4096)([data[0], data[len(windows)]])
    assert batch["target_swaps"].shape == (2, 2, SLOTS, SHOT_DIM)
    assert batch["swap_mask"].tolist() == [[False, False], [True, True]]  # clip 0 names no one


def test_a_held_out_pair_is_never_made_and_one_copy_takes_the_swaps_in_turn(tmp_path, layout):
    manifest, store, windows = _data(tmp_path, held_out=("Qiqi:Ken",))  # film 0: Qiqi with Sam
    data = StageBDataset(windows, manifest, store, layout, 4096, SHOT_DIM, name_swap_copies=1,
                         held_out=held_out_friends(manifest))
    renames = [(w.film_id, pair) for w, pair in data.items if pair is not None]
    assert renames and ("film00", ("Sam", "Ken")) not in renames
    assert {pair for film, pair in renames if film == "film00"} == {("Sam", "Mia")}
    assert {pair for film, pair in renames if film == "film01"} == {("Mia", "Qiqi"), ("Mia", "Ken")}
    assert "target_swaps" not in data[len(windows)]  # no identity term asked for


def test_a_window_that_names_the_new_name_already_is_not_renamed(tmp_path, layout):
    manifest, store, windows = _data(tmp_path)
    data = StageBDataset(windows, manifest, store, layout, 4096, SHOT_DIM, name_swap_copies=2)
    window = windows[3]  # film 0 up to clip 3: Qiqi with Sam
    data.swap_names[window.clip_ids[0]] = [("Mia", "Sam")]  # as if its first clip named Mia
    assert data._renames(window, frozenset(), 1) == [("Sam", "Ken")]


def test_name_swaps_need_the_swaps_names(tmp_path, layout):
    manifest_path, store_path = write_stage_b_data(tmp_path, films=2, clips_per_film=4, num_slots=SLOTS,
                                                   shot_dim=SHOT_DIM, swaps=2)  # swaps without their names
    manifest, store = read_manifest(manifest_path), TensorStore(store_path)
    windows = build_windows(manifest, history_turns=2, split="all")
    with pytest.raises(ValueError, match="hold no identity swaps with their names"):
        StageBDataset(windows, manifest, store, layout, 4096, SHOT_DIM, name_swap_copies=1)
    with pytest.raises(ValueError, match=">= 0"):
        StageBDataset(windows, manifest, store, layout, 4096, SHOT_DIM, name_swap_copies=-1)


# ---------------------------------------------------------------- a tiny run


@pytest.mark.slow
def test_train_stage_b_with_name_swaps(tmp_path, tiny_mistral_dir, capsys, one_thread):
    """name_swap_copies=1 with the identity term: the renamed windows join the data (the held-out pair never made),
    the loss and the term fall, and the run is deterministic (twice, the same weights bit for bit)."""
    import csv
    from pathlib import Path

    from animegamer.models.weights import load_state_dict_file
    from animegamer.recipes import stage_b
    from tests.helpers.stage_runs import stage_b_overrides

    write_stage_b_data(tmp_path / "data", films=3, clips_per_film=5, num_slots=SLOTS, shot_dim=SHOT_DIM, swaps=2,
                       friends=True, meta={"config": {"held_out_pairs": ["Qiqi:Ken"]}})
    config = str(Path(__file__).resolve().parents[1] / "configs" / "tiny" / "stage_b.yaml")

    def run(folder):
        stage_b.main(["--config", config, *stage_b_overrides(
            tmp_path, tiny_mistral_dir, folder, identity_weight=1.0, name_swap_copies=1,
            **{"train.max_steps": 12, "train.batch_size": 4})])
        rows = [r for r in csv.reader(open(folder / "metrics.csv")) if r[0] != "step"]
        logged = {}
        for _, name, value, _ in rows:
            logged.setdefault(name, []).append(float(value))
        step = folder / "checkpoints" / "step_0000012"
        weights = {**load_state_dict_file(step / "adapter_model.safetensors"),
                   **load_state_dict_file(step / "mllm_trained.safetensors")}
        return logged, weights

    logged, first = run(tmp_path / "a")
    out = capsys.readouterr().out
    # 3 films x 5 clips, history 2 by default in the tiny config: 6 windows end on a friend clip; film 0 (Qiqi with
    # Sam) may not become Qiqi with Ken
    assert "name swaps: 6 renamed windows more" in out and "[['Ken', 'Qiqi']]" in out
    assert sum(logged["loss"][-3:]) < 0.8 * sum(logged["loss"][:3])
    held = [v for v in logged["identity"] if v > 0]
    assert len(held) >= 6 and sum(held[-3:]) < sum(held[:3])
    _, second = run(tmp_path / "b")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
