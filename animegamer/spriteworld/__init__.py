"""SpriteWorld: a small synthetic anime-life world whose clips train every stage for real on a CPU, and the
stand-ins for the pretrained models it needs (the CogVideoX VAE and base transformer, the Mistral LLM).

The world, in the order it is built:

- :mod:`~animegamer.spriteworld.world`: characters, actions, places, times; :class:`ShotSpec`, one shot;
- :mod:`~animegamer.spriteworld.animate`: the poses of every frame of a shot, its pixels and its true motion,
  drawn by :mod:`~animegamer.spriteworld.draw` (figures, props, scenery) and :mod:`~animegamer.spriteworld.home`
  (a memory film's home and companion);
- :mod:`~animegamer.spriteworld.memory`: what a film keeps without saying it, held-out pairs, game memory;
- :mod:`~animegamer.spriteworld.films`: films of shots, the dataset on disk, the held-out games.

Pretraining of the stand-in models: :mod:`~animegamer.spriteworld.pretrain` (the tiny CogVideoX: T5, VAE from
:mod:`~animegamer.spriteworld.pretrain_vae`, base transformer from
:mod:`~animegamer.spriteworld.pretrain_transformer`) and :mod:`~animegamer.spriteworld.pretrain_llm`. Entry
points: ``scripts/spriteworld/`` (make, pretrain, pretrain_llm, train and research tools).

The real-data path (animegamer.data, .inference, .models, .training) never imports this package.
"""

from animegamer.spriteworld.animate import animate, draw_scene, motion_scope, render_shot
from animegamer.spriteworld.films import drawing_settings, plan_films, training_tags, write_dataset
from animegamer.spriteworld.memory import lexicon, resolve_game
from animegamer.spriteworld.world import (
    ACTIONS,
    ADVERB_SPEED,
    CHARACTERS,
    PLACES,
    TIMES,
    ShotSpec,
    caption_tags,
    spec_from_instruction,
)

__all__ = [
    "ACTIONS", "ADVERB_SPEED", "CHARACTERS", "PLACES", "TIMES", "ShotSpec", "animate", "caption_tags", "draw_scene",
    "drawing_settings", "lexicon", "motion_scope", "plan_films", "render_shot", "resolve_game",
    "spec_from_instruction", "training_tags", "write_dataset",
]
