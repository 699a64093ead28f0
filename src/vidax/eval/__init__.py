"""Evaluation: generate videos for the shapes prompts and score them with `vidax.metrics`.

It sits above the pipeline (it generates); `vidax.metrics` stays pure (frames in, scores out).

- `harness`: prompt x seed pairs, scoring, tables, contact sheets, report files.
- `command`: `vidax eval`.
"""
