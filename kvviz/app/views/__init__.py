"""The views of a run: one file each, all following `base.RunViewProtocol` (reset, apply, refresh,
set_font_scale). They read the engine's RunPlan and StepRecords and never import the engine or the worker."""
