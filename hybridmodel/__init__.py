"""The project's default model: a small Qwen3.5-architecture hybrid with a byte-level vocabulary, trained here
(``bench train-model``). Where it is loaded from is the loader's: :data:`pretrained.model_spec.DEFAULT_MODEL_DIR`."""
