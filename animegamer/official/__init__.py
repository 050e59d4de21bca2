"""The official AnimeGamer release (TencentARC/AnimeGamer) behind one door: its files converted into this project's
checkpoint layout, and its own predictor and renderer for ``compat: released``. The core never imports this package.

``release_io``     reads the release's pickled files without executing them (restricted unpickling, memory-mapped)
``decoder``        the SwissArmyTransformer decoder checkpoint -> a diffusers CogVideoX transformer + our trained parts
``mllm``           the peft-wrapped agent ``pytorch_model.bin`` -> a transformers Mistral + our trained parts
``convert``        both into one checkpoint directory and its ``inference.yaml`` (``scripts/convert_official.py``)
``agent``          the release's MLLM turn (its quirks B1-B6) as a turn function of the core's runner
``sampler``        the release's decoder sampler (B7-B10, B15)
``game``           the one place that picks the release's predictor/renderer or the core's for a config
``release_files``  random files in the release's layout (the speed harness's ``official`` part, tests)

research/official/ holds the measurements of how far ``fixed`` moves from the release.
"""
