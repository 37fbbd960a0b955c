"""`kvviz export`: still images of a run, or an animation with --animate (the work is in kvviz.app.export)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kvviz.cli.compare import dtype_honoured
from kvviz.cli.parser import UsageError


def app_export(name: str, command: str) -> Callable:  # kvviz.app.export's `name`, if the app's packages load
    try:
        import kvviz.app.export as export
    except ImportError as exc:
        raise UsageError(f"{command} needs PySide6 and pyqtgraph ({exc})") from exc
    return getattr(export, name)


def cmd_export(args: argparse.Namespace) -> int:
    if args.animate:
        return cmd_export_animation(args)
    animation_only = {"--target": args.target, "--steps": args.steps, "--fps": args.fps, "--hold-last": args.hold_last}
    for option, value in animation_only.items():
        if value is not None:
            raise UsageError(f"{option} is for an animation: add --animate")
    for fmt in (args.format or "").split(","):
        if fmt.strip().lower().lstrip(".") in ("gif", "mp4"):
            raise UsageError(f"--format {fmt.strip()}: an animation; add --animate (stills are png, svg, pdf)")
    run_export = app_export("run_export", "export")
    if args.break_cache and not args.compare:
        raise UsageError("--break-cache shows in the compare view: add --compare")
    with dtype_honoured(args.dtype, "cpu"):
        paths = run_export(args.model, args.prompt, args.new_tokens, args.out, args.format or "png,svg,pdf",
                           use_cache=not args.no_cache, width=args.width or 1920, compare=args.compare,
                           break_cache=args.break_cache, theme=args.theme, dtype=args.dtype, window=args.window,
                           sinks=args.sinks, kv_dtype=args.kv_dtype or "")  # checked first thing
    print(*paths, sep="\n")
    return 0


def cmd_export_animation(args: argparse.Namespace) -> int:
    """`kvviz export --animate`: a GIF and/or an MP4 of one view, a frame per step."""
    run_animation = app_export("run_animation", "export --animate")
    if args.break_cache and not args.compare:
        raise UsageError("--break-cache shows in the compare view: add --compare")
    given = {"formats": args.format, "width": args.width, "target": args.target, "steps": args.steps,
             "fps": args.fps, "hold": args.hold_last}
    with dtype_honoured(args.dtype, "cpu"):
        paths = run_animation(args.model, args.prompt, args.new_tokens, args.out, use_cache=not args.no_cache,
                              compare=args.compare, break_cache=args.break_cache, theme=args.theme, dtype=args.dtype,
                              window=args.window, sinks=args.sinks, kv_dtype=args.kv_dtype or "",
                              **{name: value for name, value in given.items() if value is not None})
    print(*paths, sep="\n")
    return 0
