"""Converting the official AnimeGamer release (TencentARC/AnimeGamer) into this project's checkpoint layout.

``release_io``  reads the release's pickled files without executing them (restricted unpickling, memory-mapped)
``decoder``     the SwissArmyTransformer decoder checkpoint -> a diffusers CogVideoX transformer + our trained parts
``mllm``        the peft-wrapped agent ``pytorch_model.bin`` -> a transformers Mistral + our trained parts

``scripts/convert_official.py`` is the entry point; the README's "Play the released weights" says what to download.
"""
