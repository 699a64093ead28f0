"""The tiny workload the planner tests share."""

# 17 frames at 64x48 on the tiny model: a (5, 8, 6) latent, 60 tokens, which do not divide by
# 8: sequence shards are padded.
TINY_WORKLOAD_ARGS = dict(model="tiny", frames=17, height=64, width=48)
