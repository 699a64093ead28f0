"""Prompts read into the caption grammar a model was trained on (`ModelSpec.caption_grammar`).

    read_prompt(get("tiny"), "a red square moving right")
    # 'a red square bouncing slowly to the right'

Generation entry points (`vidax.pipeline.generate`, `vidax.forcing.stream_generate`, the
evaluation harness) read every prompt this way before embedding it; `embed_prompts` itself
embeds what it is given.
"""

from __future__ import annotations

from vidax.data.shapes import canonical_caption
from vidax.models.registry import ModelSpec


def read_prompt(spec: ModelSpec, prompt: str) -> str:
    """The prompt as `spec`'s text encoder should see it: for a model trained on the shapes
    captions, the prompt in that grammar where it can be read without guessing
    (`canonical_caption`); else as written."""
    if spec.caption_grammar == "shapes":
        return canonical_caption(prompt)
    return prompt
