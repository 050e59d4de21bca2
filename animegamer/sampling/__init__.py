"""How a decoder renders a shot: schedules and solver steps (:mod:`.schedule`), the ``sampling.preset`` settings and
the sampler the game holds (:mod:`.presets`), transformer caches (:mod:`.cache`), the stage (d) few-step sampler
(:mod:`.fewstep`) and the streamed VAE decode (:mod:`.streaming`). Below the models: nothing here imports them (a
decoder is passed in)."""
