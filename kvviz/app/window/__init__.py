"""The window: its parts, actions, controls and presentation."""
