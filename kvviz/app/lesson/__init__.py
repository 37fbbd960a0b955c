"""Lesson mode: the controller and its panel."""
