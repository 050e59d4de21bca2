"""The training losses: the decoder stages' diffusion loss (MSE on the scheduler's target, optionally weighted
towards motion) and stage (b)'s loss of the MLLM's predictions.

The paper trains stages (a) and (c) with a plain MSE. Where the moving content is a small share of the frame, that
loss is spent on the static background, and a decoder fine-tuned with it can unlearn motion its pretraining had:
SpriteWorld's base model moves its figures only because its pretraining weighted them, and a stage (a) with the
plain loss brought a running figure's flow from 1.5 to 1.2 px/frame and a flight's from 1.2 to 0.9 (30 held-out
clips, same encoder shots). ``motion_loss_weight`` gives the latent cells whose content changes between
neighbouring latent frames that much extra weight; it needs no masks, only the clean latents every step has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def changing_cells(latents: torch.Tensor, threshold: float) -> torch.Tensor:
    """Clean latents (B, F, C, h, w) -> (B, F, 1, h, w): 1.0 where a cell changes from a neighbouring latent frame.

    A cell changes when some channel differs by more than ``threshold`` from the same cell of the previous or the
    next latent frame (CogVideoX latents are scaled to unit variance, so the threshold is in units of their std).
    A single latent frame has no neighbour: nothing changes.
    """
    if latents.ndim != 5:
        raise ValueError(f"expected latents (B, F, C, h, w), got shape {tuple(latents.shape)}")
    if latents.shape[1] < 2:
        return torch.zeros_like(latents[:, :, :1])
    change = (latents[:, 1:] - latents[:, :-1]).abs().amax(dim=2, keepdim=True)  # (B, F - 1, 1, h, w)
    before = torch.cat([change[:, :1], change], dim=1)  # frame f against f - 1 (frame 0 against frame 1)
    after = torch.cat([change, change[:, -1:]], dim=1)  # frame f against f + 1 (the last against the one before)
    return (torch.maximum(before, after) > threshold).to(latents.dtype)


def diffusion_loss(
    prediction: torch.Tensor,
    target: torch.Tensor,
    latents: torch.Tensor,
    motion_loss_weight: float = 0.0,
    motion_threshold: float = 0.2,
) -> torch.Tensor:
    """MSE of (B, F, C, h, w) predictions, in float32; changing cells of ``latents`` weigh ``1 + motion_loss_weight``.

    The weights are normalised to mean 1 over the batch, so the loss keeps the plain MSE's scale; with
    ``motion_loss_weight`` 0 it is exactly the plain MSE.
    """
    error = (prediction.float() - target.float()).square()
    if motion_loss_weight == 0:
        return error.mean()
    if motion_loss_weight < 0:
        raise ValueError(f"motion_loss_weight={motion_loss_weight} must be >= 0")
    weight = 1.0 + motion_loss_weight * changing_cells(latents.float(), motion_threshold)  # (B, F, 1, h, w)
    return (weight * error).mean() / weight.mean()


def identity_term(pred: torch.Tensor, target: torch.Tensor, swaps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error of predicted shots along their identity directions, in units of each direction's length.

    ``pred``, ``target``: (Q, N, D); ``swaps``: (Q, S, N, D), the encoder's shots of the same frame with another
    friend named (:mod:`animegamer.data.name_swaps`); ``mask``: (Q, S), True on real swaps. For u = target - swap,
    e = <pred - target, u> / |u|^2 is 0 when the prediction says the right friend and -1 when it says the swapped
    one; the term is the mean of e^2 over real swaps (0 when there are none). A plain MSE weighs the same error by
    |u|^2 / (N * D), a few thousandths of the shot's variance: it lets the friend go."""
    if swaps.ndim != 4 or swaps.shape[0] != pred.shape[0] or swaps.shape[2:] != pred.shape[1:]:
        raise ValueError(f"identity swaps {tuple(swaps.shape)} do not match predicted shots {tuple(pred.shape)}")
    u = (target.float().unsqueeze(1) - swaps.float()).flatten(2)  # (Q, S, N * D)
    error = (pred.float() - target.float()).flatten(1).unsqueeze(1)  # (Q, 1, N * D)
    e = (error * u).sum(-1) / u.square().sum(-1).clamp_min(1e-12)  # (Q, S)
    weight = mask.to(e.dtype)
    return (e.square() * weight).sum() / weight.sum().clamp_min(1.0)


def stage_b_loss(out: dict[str, torch.Tensor], target_shots: torch.Tensor, mse_weight: float,
                 cosine_weight: float, identity_weight: float = 0.0, swaps: torch.Tensor | None = None,
                 swap_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Stage (b)'s loss of the MLLM's teacher-forced predictions (``AnimeGamerMLLM.forward``): ``loss`` = CE of the
    state value tokens + ``mse_weight`` * MSE(s_a) + ``cosine_weight`` * (1 - cos(s_a)), cosine over each shot
    token's features, + ``identity_weight`` * :func:`identity_term` (with ``swaps``/``swap_mask``); its parts
    ``ce``/``mse``/``cos`` (and ``identity`` when weighted; detached) and ``state_acc``, the fraction of value tokens
    whose argmax over the whole vocabulary is right. ``target_shots``: (Q, N, shot_dim), the encoder's s_a."""
    logits, labels, pred = out["value_logits"], out["value_labels"], out["shots"]
    ce = F.cross_entropy(logits, labels)
    target = target_shots.float()
    mse = F.mse_loss(pred, target)
    cos = 1.0 - F.cosine_similarity(pred, target, dim=-1).mean()
    loss = ce + mse_weight * mse + cosine_weight * cos
    parts = {"ce": ce.detach(), "mse": mse.detach(), "cos": cos.detach()}
    if identity_weight > 0:
        if swaps is None or swap_mask is None:
            raise ValueError("identity_weight > 0 needs the batch's identity swaps (target_swaps, swap_mask)")
        identity = identity_term(pred, target, swaps, swap_mask)
        loss = loss + identity_weight * identity
        parts["identity"] = identity.detach()
    state_acc = (logits.argmax(-1) == labels).float().mean()
    return {"loss": loss, **parts, "state_acc": state_acc}
