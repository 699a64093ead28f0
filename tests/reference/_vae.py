"""Shared helpers for the VAE parity tests: randomised diffusers references and layout moves."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def random_reference(cls, config: dict, seed: int = 0):
    """A diffusers `cls(**config)` whose every parameter (norm weights included) is randomised."""
    torch.manual_seed(seed)
    model = cls(**config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def saved_pair(cls, config: dict, path, load, from_diffusers_config):
    """A random reference saved to `path` and our model loaded back from that checkpoint."""
    ref = random_reference(cls, config)
    ref.save_pretrained(path)
    return ref, load(path, from_diffusers_config(dict(ref.config)))


def to_torch(x):
    """(b, t, h, w, c) -> torch (b, c, t, h, w)."""
    return torch.from_numpy(np.asarray(x, np.float32)).permute(0, 4, 1, 2, 3)


def from_torch(x):
    """torch (b, c, t, h, w) -> numpy (b, t, h, w, c) float32."""
    return x.detach().float().permute(0, 2, 3, 4, 1).numpy()


def ref_encode(ref, x):
    """The reference's posterior mode of channels-last video x, channels-last."""
    with torch.no_grad():
        return from_torch(ref.encode(to_torch(x)).latent_dist.mode())


def ref_decode(ref, z):
    """The reference's decoding of channels-last latents z, channels-last."""
    with torch.no_grad():
        return from_torch(ref.decode(to_torch(z)).sample)
