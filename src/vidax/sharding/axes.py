"""The closed vocabulary of logical axis names.

Models annotate every parameter and the activations that matter with these names; only
`vidax.sharding.rules` maps them onto mesh axes. A test checks every model parameter against
`PARAM_AXES`, so a typo is an error rather than a silently replicated tensor.
"""

# Mesh axes, outermost first. Strategies use a subset; absent axes have size 1.
MESH_AXES = ("data", "fsdp", "seq", "tensor")

PARAM_AXES = frozenset(
    {
        "layers",  # stacked transformer blocks (never sharded: scanned over)
        "embed",  # model width d
        "heads",  # flattened attention heads x head_dim (q/k/v output, out-proj input)
        "mlp",  # FFN hidden f
        "modulation",  # adaLN modulation outputs (k * d)
        "patch",  # flattened patch features (pt * ph * pw * c)
        "text_embed",  # text encoder width
        "image_embed",  # image encoder width (CLIP image tokens of image-to-video models)
        "freq",  # sinusoidal timestep features
        "vocab",  # token embedding rows
        "conv_in",  # convolution input channels
        "conv_out",  # convolution output channels
        "kernel",  # convolution taps
        "norm",  # per-channel norm scales that are never worth sharding
    }
)

ACTIVATION_AXES = frozenset(
    {
        "batch",  # video batch (includes the CFG pair)
        "tokens",  # video tokens t*h*w in the residual stream (sequence parallelism shards this)
        "attn_tokens",  # query tokens inside attention (Ulysses gathers them, splitting heads)
        "kv_tokens",  # key/value tokens inside attention (gathered for sequence parallelism)
        "text_tokens",  # text context tokens
        "image_tokens",  # image context tokens (image-to-video cross-attention)
        "embed",  # activation width d
        "attn_heads",  # heads inside attention (Ulysses shards this instead of tokens)
        "head_dim",
        "mlp",
        "frames",  # latent frames t
        "height",
        "width",
        "channels",
    }
)
