"""Where models come from: checkpoints on disk, the Hugging Face hub, the embedded model."""
