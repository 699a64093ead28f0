"""Checkpoint I/O: streaming safetensors reading, declarative key maps, atomic writes."""

from vidax.checkpoint.atomic import write_atomic
from vidax.checkpoint.keymap import LINEAR, Rule, export_state, linear_rules, load_state
from vidax.checkpoint.model_io import load_model, save_model
from vidax.checkpoint.safetensors import (
    CheckpointError,
    CheckpointReader,
    open_checkpoint,
    save_file,
)

__all__ = [
    "LINEAR",
    "CheckpointError",
    "CheckpointReader",
    "Rule",
    "export_state",
    "linear_rules",
    "load_model",
    "load_state",
    "open_checkpoint",
    "save_file",
    "save_model",
    "write_atomic",
]
