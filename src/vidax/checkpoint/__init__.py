"""Checkpoint I/O: streaming safetensors reading and declarative key maps."""

from vidax.checkpoint.keymap import Rule, export_state, load_state
from vidax.checkpoint.safetensors import CheckpointError, CheckpointReader, open_checkpoint, save_file

__all__ = [
    "CheckpointError",
    "CheckpointReader",
    "Rule",
    "export_state",
    "load_state",
    "open_checkpoint",
    "save_file",
]
