"""The tiny workload the planner tests share."""

# 17 frames at 40x48 on the tiny model (stride-4 tiny VAE, 2x2 patches): 5 x 5 x 6 = 150 tokens,
# which divide by neither 4 nor 8, so sequence shards are padded (tests assert this).
TINY_WORKLOAD_ARGS = dict(model="tiny", frames=17, height=40, width=48)
