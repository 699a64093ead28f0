"""The CLI's persistent compilation cache (`vidax.compile_cache`)."""

import os
import subprocess
import sys
from pathlib import Path

from vidax import compile_cache


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VIDAX_CACHE_DIR", str(tmp_path / "a"))
    assert compile_cache.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("VIDAX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.cache_dir() == tmp_path / "xdg" / "vidax" / "jax"
    monkeypatch.setenv("VIDAX_COMPILE_CACHE", "0")
    assert not compile_cache.enabled_by_environment()


def _generate(tmp_path: Path, cache: Path, *flags: str) -> None:
    env = {**os.environ, "VIDAX_CACHE_DIR": str(cache), "VIDAX_COMPILE_CACHE": "1"}
    args = [sys.executable, "-m", "vidax", *flags, "generate", "--model", "tiny"]
    args += ["--prompt", "a red circle", "--frames", "5", "--steps", "2"]
    args += ["--out", str(tmp_path / "v.mp4")]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_generate_fills_the_cache_unless_told_not_to(tmp_path):
    cache = tmp_path / "cache"
    _generate(tmp_path, cache)
    assert any(cache.iterdir())
    off = tmp_path / "off"
    _generate(tmp_path, off, "--no-compile-cache")
    assert not off.exists() or not any(off.iterdir())
