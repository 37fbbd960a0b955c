"""Options that cannot go together, limits, and what reaches the terminal: each refused in one line with status 2
before any model loads, never silently ignored (issue #36, section 8)."""

from __future__ import annotations

import pytest
from helpers_checkpoints import save_kvviz_folder

NO_MODEL = ("--model", "/no/such/model/folder")  # a run that loaded its model first would say so instead

REFUSED = [
    pytest.param(("generate", *NO_MODEL, "--prompt", "x", "--kv-dtype", "int8", "--no-cache"), "--no-cache",
                 id="generate-kv-dtype-no-cache"),
    pytest.param(("export", *NO_MODEL, "--prompt", "x", "--out", "o", "--kv-dtype", "int8", "--no-cache"),
                 "--no-cache", id="export-kv-dtype-no-cache"),
    pytest.param(("bench", *NO_MODEL, "--gui", "--kv-dtype", "int8"), "--gui", id="bench-gui-kv-dtype"),
    pytest.param(("generate", *NO_MODEL, "--prompt", "x", "--sinks", "2"), "attention sinks go with a window",
                 id="generate-sinks-without-window"),
    pytest.param(("compare", *NO_MODEL, "--prompt", "x", "--sinks", "2"), "attention sinks go with a window",
                 id="compare-sinks-without-window"),
    pytest.param(("generate", *NO_MODEL, "--prompt", "x", "--window", "8", "--kv-dtype", "int8"),
                 "one trade-off at a time", id="generate-window-and-kv-dtype"),
    pytest.param(("batch", *NO_MODEL, "--prompt", "x", "--block-size", "1000000"), "at most 256",
                 id="batch-block-size-huge"),
    pytest.param(("batch", *NO_MODEL, *[arg for _ in range(257) for arg in ("--prompt", "x")]),
                 "257 prompts", id="batch-257-prompts"),
    pytest.param(("lesson", "--file", "kv-quantized", "--export", "out", "--kv-dtype", "int4"),
                 "--kv-dtype: no step", id="lesson-kv-dtype-no-step-takes-it"),
    pytest.param(("lesson", "--file", "kv-window", "--export", "out", "--window", "4"),
                 "--window: no step", id="lesson-window-no-step-takes-it"),
]


@pytest.mark.parametrize(("args", "fragment"), REFUSED)
def test_a_refused_combination_is_one_line_and_status_2_before_the_model_loads(kvviz_cli, tmp_path, args,
                                                                                  fragment):
    done = kvviz_cli(*args, cwd=tmp_path)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
    assert "no/such" not in lines[0]  # refused on the options, not on the model
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_a_prompts_file_takes_one_prompt_a_line_whatever_other_breaks_a_prompt_holds(tmp_path):
    from kvviz.core.files import read_prompts

    path = tmp_path / "prompts.txt"
    path.write_text("one\u2028still one\fand one\x85too\r\nsecond\n\nthird", encoding="utf-8")
    assert read_prompts(path) == ["one\u2028still one\fand one\x85too", "second", "third"]


def test_help_names_every_preset_hub_model_and_built_in_lesson(kvviz_cli):
    from kvviz.lessons.lesson import BUILTIN_LESSONS
    from kvviz.models.families import PRESETS
    from kvviz.sources.hub import HUB_MODELS

    generate_help = "".join(kvviz_cli("generate", "--help").stdout.split())  # argparse wraps at hyphens
    for name in (*PRESETS, *HUB_MODELS):
        assert name in generate_help, name
    lesson_help, app_help = kvviz_cli("lesson", "--help").stdout, kvviz_cli("--help").stdout
    for name in BUILTIN_LESSONS:
        assert name in "".join(lesson_help.split()) and name in "".join(app_help.split()), name


def test_a_folder_named_with_escape_sequences_is_shown_never_obeyed(kvviz_cli, tmp_path):
    folder = save_kvviz_folder(tmp_path / "evil\x1b[2J\x1b]0;owned\x07", n_layer=1, n_head=2, n_embd=32, n_ctx=32)
    done = kvviz_cli("compare", "--model", str(folder), "--prompt", "hi", "--new-tokens", "2")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "evil\\x1b[2J" in done.stdout
    failed = kvviz_cli("generate", "--model", str(folder / "nothing\x1b[2Jhere"), "--prompt", "hi")
    assert failed.returncode == 2 and "\x1b" not in failed.stderr and len(failed.stderr.splitlines()) == 1


@pytest.mark.parametrize(("batched_tps", "turns", "said"), [
    (2.0, (1.9, 2.1, 1.8), "2.00x (turns 1.80-2.10x)"),
    (1.2, (0.6, 1.5, 1.1), "not clear (turns 0.60-1.50x)"),
    (0.6, (0.5, 0.7), "0.60x (turns 0.50-0.70x)"),
])
def test_a_batch_speedup_is_given_with_its_turns_or_called_not_clear(batched_tps, turns, said):
    from kvviz.core.batch_records import BatchSpeed

    speed = BatchSpeed(2, tokens_per_second=batched_tps, sequential_tokens_per_second=1.0, turns=len(turns),
                       turn_speedups=turns)
    assert speed.describe_speedup() == said
