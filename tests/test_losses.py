"""The decoder stages' diffusion loss: plain MSE by default, changing latent cells weighted on request."""

import pytest
import torch
import torch.nn.functional as F

from animegamer.training.losses import changing_cells, diffusion_loss


def moving_blob(frames: int = 4, steps: int = 2) -> torch.Tensor:
    """Latents (1, F, 2, 6, 8) of a static background with a 1-cell blob moving ``steps`` cells right per frame."""
    latents = torch.full((1, frames, 2, 6, 8), 0.3)
    for f in range(frames):
        latents[0, f, 1, 2, 1 + steps * f] = 2.0
    return latents


def test_changing_cells_are_where_the_blob_leaves_and_arrives():
    cells = changing_cells(moving_blob(), threshold=0.2)  # (1, F, 1, h, w)
    assert cells.shape == (1, 4, 1, 6, 8)
    for f in range(4):
        flagged = {tuple(ix) for ix in torch.nonzero(cells[0, f, 0]).tolist()}
        # the blob's own cell and the cells it came from / goes to, all in row 2
        expected = {(2, 1 + 2 * g) for g in (f - 1, f, f + 1) if 0 <= g < 4}
        assert flagged == expected, (f, flagged)
    assert changing_cells(moving_blob(), threshold=5.0).sum() == 0  # nothing changes by more than 1.7
    static = moving_blob(steps=0)
    assert changing_cells(static, 0.2).sum() == 0
    assert changing_cells(moving_blob()[:, :1], 0.2).sum() == 0  # one frame: no neighbour to change from
    with pytest.raises(ValueError, match=r"expected latents \(B, F, C, h, w\)"):
        changing_cells(torch.zeros(2, 3, 4, 5), 0.2)


def test_weight_zero_is_the_plain_mse_and_weights_favour_moving_cells():
    torch.manual_seed(0)
    latents = moving_blob()
    prediction, target = torch.randn_like(latents), torch.randn_like(latents)
    assert torch.equal(diffusion_loss(prediction, target, latents), F.mse_loss(prediction, target))
    static = moving_blob(steps=0)  # nothing changes: every weight is 1, whatever motion_loss_weight says
    assert torch.allclose(diffusion_loss(prediction, target, static, 10.0), F.mse_loss(prediction, target))

    moving = changing_cells(latents, 0.2).expand_as(latents).bool()
    on_motion = torch.where(moving, prediction, target)  # errors only where the blob moves
    off_motion = torch.where(moving, target, prediction)  # errors only on the static background
    plain_on, plain_off = F.mse_loss(on_motion, target), F.mse_loss(off_motion, target)
    mean_weight = 1.0 + 10.0 * moving[:, :, :1].float().mean()  # weights are normalised to mean 1
    assert torch.isclose(diffusion_loss(on_motion, target, latents, 10.0), 11.0 * plain_on / mean_weight)
    assert torch.isclose(diffusion_loss(off_motion, target, latents, 10.0), plain_off / mean_weight)
    assert 11.0 / mean_weight > 5 and 1.0 / mean_weight < 0.7  # the blob is 5% of the cells
    with pytest.raises(ValueError, match="motion_loss_weight=-1.0 must be >= 0"):
        diffusion_loss(prediction, target, latents, -1.0)
