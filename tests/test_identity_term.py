"""Stage (b)'s identity term: identity swaps of captions, their shots, the term itself, and a tiny run with it."""

import pytest
import torch

from animegamer.data.features import write_shot_targets
from animegamer.data.name_swaps import SWAP_SHOT_FIELD, SWAP_TEXT_FIELD, name_swaps
from animegamer.data.stage_b import pad_swaps
from animegamer.data.tensor_store import TensorStore
from animegamer.training.losses import identity_term, stage_b_loss

NAMES = ["Qiqi", "Momo", "Kai", "Luna"]


# ---------------------------------------------------------------- swaps of a caption


def test_the_friend_is_swapped_everywhere_and_the_subject_kept():
    caption = "Character: Kai; Motion: talk with Luna; Background: noon park. Companion: Luna."
    assert name_swaps(caption, "Kai", NAMES) == [
        "Character: Kai; Motion: talk with Qiqi; Background: noon park. Companion: Qiqi.",
        "Character: Kai; Motion: talk with Momo; Background: noon park. Companion: Momo.",
    ]
    assert name_swaps(caption, "Kai", NAMES, limit=1) == name_swaps(caption, "Kai", NAMES)[:1]
    assert name_swaps("Character: Kai; Motion: eat; Background: noon kitchen.", "Kai", NAMES) == []


def test_names_are_whole_words_and_taken_literally():
    # "Kai" inside "Kaito" is not Kai; a name with regex characters matches itself only
    assert name_swaps("Character: Qiqi; Motion: wave at Kaito.", "Qiqi", NAMES) == []
    swapped = name_swaps("Character: A; Motion: hug B.B.", "A", ["A", "B.B", "C"])
    assert swapped == ["Character: A; Motion: hug C."]
    assert name_swaps("Character: A; Motion: hug BxB.", "A", ["A", "B.B", "C"]) == []
    with pytest.raises(ValueError, match="limit"):
        name_swaps("x", "A", NAMES, limit=-1)


def test_two_named_friends_each_swap_with_the_names_left():
    caption = "Character: Kai; Motion: play with Luna and Momo."
    assert name_swaps(caption, "Kai", NAMES) == [
        "Character: Kai; Motion: play with Luna and Qiqi.",  # Momo -> the one name not in the caption
        "Character: Kai; Motion: play with Qiqi and Momo.",  # Luna -> Qiqi
    ]


# ---------------------------------------------------------------- the term


def _shots(q=3, s=2, n=4, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(q, n, d, generator=g)
    swaps = target.unsqueeze(1) + torch.randn(q, s, n, d, generator=g)
    return target, swaps


def test_the_term_is_0_at_the_target_1_at_a_swap_and_a_quarter_halfway():
    target, swaps = _shots()
    mask = torch.ones(3, 2, dtype=torch.bool)
    assert identity_term(target, target, swaps, mask).item() == 0.0
    one = identity_term(swaps[:, 0], target, swaps[:, :1], mask[:, :1])
    assert one.item() == pytest.approx(1.0, abs=1e-5)
    half = identity_term((target + swaps[:, 0]) / 2, target, swaps[:, :1], mask[:, :1])
    assert half.item() == pytest.approx(0.25, abs=1e-5)
    # an error orthogonal to every identity direction costs nothing
    error = torch.randn(3, 4 * 5)
    u = (target.unsqueeze(1) - swaps).flatten(2)  # (3, 2, 20)
    for q in range(3):
        basis, _ = torch.linalg.qr(u[q].T)  # (20, 2)
        error[q] -= basis @ (basis.T @ error[q])
    assert identity_term(target + error.view(3, 4, 5), target, swaps, mask).item() == pytest.approx(0, abs=1e-6)


def test_padded_swaps_are_ignored_and_none_cost_nothing():
    target, swaps = _shots()
    mask = torch.tensor([[True, False], [True, True], [False, False]])
    pred = target + 0.1 * torch.randn_like(target)
    garbage = swaps.clone()
    garbage[0, 1] = 1e6
    garbage[2] = -3.0
    assert torch.equal(identity_term(pred, target, swaps, mask), identity_term(pred, target, garbage, mask))
    none = identity_term(pred, target, swaps, torch.zeros(3, 2, dtype=torch.bool))
    assert none.item() == 0.0
    with pytest.raises(ValueError, match="do not match"):
        identity_term(pred, target, swaps[:, :, :2], mask)


def test_the_term_pulls_the_prediction_towards_the_right_friend():
    target, swaps = _shots(q=2, s=1)
    mask = torch.ones(2, 1, dtype=torch.bool)
    pred = swaps[:, 0].clone().requires_grad_(True)  # says the wrong friend
    # plain gradient descent; with this step the error along u_q shrinks by (1 - |u_min|^2 / |u_q|^2) a step
    optimizer = torch.optim.SGD([pred], lr=(target - swaps[:, 0]).flatten(1).square().sum(1).min().item())
    losses = []
    for _ in range(30):
        loss = identity_term(pred, target, swaps, mask)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[0] == pytest.approx(1.0, abs=1e-5) and losses[-1] < 0.01 * losses[0]
    # it moved along the identity direction only: the rest of the error is as it was
    moved = (pred.detach() - swaps[:, 0]).flatten(1)
    u = (target - swaps[:, 0]).flatten(1)
    assert torch.allclose(moved / moved.norm(dim=1, keepdim=True), u / u.norm(dim=1, keepdim=True), atol=1e-4)


def test_stage_b_loss_adds_the_term_only_when_weighted():
    target, swaps = _shots()
    mask = torch.ones(3, 2, dtype=torch.bool)
    out = {"value_logits": torch.randn(6, 10), "value_labels": torch.randint(0, 10, (6,)),
           "shots": target + 0.2 * torch.randn_like(target)}
    plain = stage_b_loss(out, target, 8.0, 0.0)
    assert "identity" not in plain
    weighted = stage_b_loss(out, target, 8.0, 0.0, 2.0, swaps, mask)
    term = identity_term(out["shots"], target, swaps, mask)
    assert weighted["identity"].item() == pytest.approx(term.item())
    assert weighted["loss"].item() == pytest.approx(plain["loss"].item() + 2.0 * term.item(), rel=1e-5)
    with pytest.raises(ValueError, match="identity swaps"):
        stage_b_loss(out, target, 8.0, 0.0, 1.0)


def test_pad_swaps_pads_to_the_most_and_marks_the_real_ones():
    swaps = [torch.ones(2, 4, 5), torch.zeros(0, 4, 5), 3 * torch.ones(1, 4, 5)]
    padded, mask = pad_swaps(swaps)
    assert padded.shape == (3, 2, 4, 5) and mask.tolist() == [[True, True], [False, False], [True, False]]
    assert padded[0].eq(1).all() and padded[1].eq(0).all() and padded[2, 0].eq(3).all() and padded[2, 1].eq(0).all()
    padded, mask = pad_swaps([torch.zeros(0, 4, 5)])
    assert padded.shape == (1, 1, 4, 5) and not mask.any()


# ---------------------------------------------------------------- their shots


class TinyEncoder(torch.nn.Module):
    """A deterministic stand-in for the stage (a) encoder: (B, Nc, Dc), (B, Nt, Dt) -> (B, 3, 4)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.clip, self.text = torch.nn.Linear(6, 4), torch.nn.Linear(5, 4)

    def forward(self, clip_tokens, text_tokens):
        return self.clip(clip_tokens[:, :3]) + self.text(text_tokens[:, :3])


def test_shot_targets_encode_each_swap_with_the_clips_first_frame(tmp_path):
    g = torch.Generator().manual_seed(1)
    rows = {f"c{i}": {"clip_tokens": torch.randn(2, 4, 6, generator=g), "text_tokens": torch.randn(7, 5, generator=g)}
            for i in range(5)}
    rows["c1"][SWAP_TEXT_FIELD] = torch.randn(2, 7, 5, generator=g)
    rows["c3"][SWAP_TEXT_FIELD] = torch.randn(1, 7, 5, generator=g)
    TensorStore(tmp_path / "features").write_shard(rows)
    encoder = TinyEncoder()
    out = TensorStore(write_shot_targets(encoder, tmp_path / "features", tmp_path / "targets", batch_size=4,
                                         progress=False))
    with torch.no_grad():
        for cid, row in rows.items():
            got = out.load(cid)
            first = row["clip_tokens"][:1]
            torch.testing.assert_close(got["shot_embeds"], encoder(first, row["text_tokens"][None])[0])
            if SWAP_TEXT_FIELD in row:
                swaps = row[SWAP_TEXT_FIELD]
                expected = encoder(first.expand(len(swaps), -1, -1), swaps)
                assert got[SWAP_SHOT_FIELD].shape == (len(swaps), 3, 4)
                torch.testing.assert_close(got[SWAP_SHOT_FIELD], expected)
            else:
                assert SWAP_SHOT_FIELD not in got
