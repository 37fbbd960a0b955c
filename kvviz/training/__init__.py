"""Training the embedded model, and its corpus."""
