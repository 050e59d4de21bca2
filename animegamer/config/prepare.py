"""The data preparation configs (scripts/prepare_data.py): cutting films into clips, motion levels, captions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from animegamer.config.parts import (
    knob,
)
from animegamer.config.prompts import (
    CAPTION_CHARACTERS_PROMPT,
    CAPTION_DESCRIBE_PROMPT,
    CAPTION_RETRY_PROMPT,
    CAPTION_SYSTEM_PROMPT,
)


@dataclass
class CaptionConfig:
    """The two captioning steps of the paper's supplement (animegamer.data.captioning); prompts are templates."""

    backend: dict[str, Any] = knob(
        factory=dict,
        help="animegamer.llm.make_backend spec: {type: openai, base_url, model, api_key} for any OpenAI-compatible "
             "server (vLLM, LMDeploy), or {type: transformers, path, device, dtype} for a local vision-language model"
             " directory",
    )
    num_frames: int = knob(8, help="frames sampled evenly from each clip and shown to the model")
    image_size: int = knob(448, help="longer side of every image sent (frames and character references)")
    max_attempts: int = knob(
        3,
        help="tries per step; an answer still invalid after them marks the clip caption_status=invalid",
    )
    max_tokens: int = 200
    temperature: float = 0.2
    workers: int = knob(
        4,
        help="clips captioned concurrently (HTTP backends; a local transformers model always uses 1)",
    )
    system_prompt: str = CAPTION_SYSTEM_PROMPT
    # step 1 uses {num_references} {reference_list} {num_frames} {names}; step 2 {num_frames} {characters}
    # {motion_level} {num_levels}; the retry {error}
    characters_prompt: str = knob(CAPTION_CHARACTERS_PROMPT, help="step 1: which reference characters appear")
    describe_prompt: str = knob(CAPTION_DESCRIBE_PROMPT, help="step 2: the structured tag line given the motion level")
    retry_prompt: str = knob(CAPTION_RETRY_PROMPT, help="follow-up message after an invalid answer")


@dataclass
class PrepareDataConfig:
    kind: str = "prepare_data"
    output_dir: str = knob("data", help="clips/, clips.jsonl, features/ land here")
    films: list[str] = knob(factory=list, help="film files or directories of films")
    height: int = 480
    width: int = 720
    clip_seconds: float = knob(2.0, help="fixed clip length")
    fps: int = knob(8, help="clips are resampled to this frame rate")
    scene_threshold: float = knob(27.0, help="PySceneDetect ContentDetector threshold")
    min_scene_seconds: float = knob(2.0, help="scenes shorter than one clip are dropped")
    crop_black_borders: bool = True
    black_threshold: int = knob(16, help="luma below this counts as black border")
    reader: Literal["pyav", "decord"] = knob("pyav", help="video backend: pyav | decord")
    cut_check_threshold: float = knob(
        0.35,
        help="colour-histogram change (0..1) between clip frames that is a cut; 0: off",
    )
    max_decode_errors: int = knob(10, help="a film with more decoder errors (corrupt data) is skipped and reported")
    workers: int = knob(2, help="parallel film workers")
    flow: Literal["dis", "raft"] = knob("dis", help="optical flow: dis (OpenCV) | raft (torchvision, weights on disk)")
    raft_weights: str = knob("", help="local RAFT weights file when flow=raft")
    flow_threshold: float = knob(0.2, help="relative threshold r dropping near-static pixels")
    flow_robust_quantile: float = knob(
        0.99,
        help="\"max\" in r * max is this quantile of a frame pair's magnitudes (1 = max)",
    )
    flow_preset: Literal["ultrafast", "fast", "medium"] = knob("medium", help="DIS preset: ultrafast | fast | medium")
    flow_device: str = knob("cpu", device=True, help="RAFT device: cpu | cuda")
    motion_levels: int = 5
    refit_motion_bins: bool = knob(
        False,
        help="refit level edges on all clips on a rerun (default: keep the stored edges)",
    )
    caption: bool = knob(False, help="run the VLM captioner after cutting")
    captioner: CaptionConfig = knob(factory=CaptionConfig, help="see animegamer.data.captioning")
    characters: str = knob("", help="character registry JSON (name -> reference images)")
