"""Lessons: the TOML lesson format, its parser and the built-in lessons' checks."""
