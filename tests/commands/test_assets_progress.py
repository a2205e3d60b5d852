"""launcher/commands/prepare.py: what `reproduce prepare` shows while it transfers."""

from __future__ import annotations

import io

from launcher.commands.prepare import PlainEvents, RichEvents


def test_plain_lines_are_throttled_per_file_and_always_show_the_end():
    out = io.StringIO()
    events = PlainEvents(every_s=3600, stream=out)
    for done in range(0, 1_000_001, 100_000):
        events.progress("hf_ckpt", "a.safetensors", done, 1_000_000)
    events.progress("hf_ckpt", "b.safetensors", 5, 10)
    lines = out.getvalue().splitlines()
    assert lines == [
        "hf_ckpt: a.safetensors: 0.0 of 1.0 MB (0%)",
        "hf_ckpt: a.safetensors: 1.0 of 1.0 MB (100%)",
        "hf_ckpt: b.safetensors: 0.0 of 0.0 MB (50%)",
    ]


def test_rich_bars_come_and_go_with_their_files():
    with RichEvents() as events:
        events.bars.console.file = io.StringIO()
        events.say("resolving [not markup]")
        events.progress("rows", "rows.parquet", 10, 100)
        assert list(events.tasks) == [("rows", "rows.parquet")]
        events.progress("rows", "rows.parquet", 100, 100)
        assert events.tasks == {} and not events.bars.tasks
        assert "resolving [not markup]" in events.bars.console.file.getvalue()
