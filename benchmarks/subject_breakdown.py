"""Where a model loses subject consistency: each object's presence, shape and area terms.

`vidax eval` reports subject consistency as one mean; this prints its terms
(`vidax.metrics.subject_scores`) per video on fresh draws, marks colours the caption did not
ask for (`*`), and sums up by object count: the mean over asked colours only says how much of
the loss is spurious colour tracks (e.g. two objects blending where they cross), the rest is
asked objects that flicker out, flip shape or change size. Causal models are read over their
last quarter (the frames issue 16's target scores).

    python benchmarks/subject_breakdown.py --model tiny-causal --attention dense --frames 129
    python benchmarks/subject_breakdown.py --model tiny --random 48 --seed 1000
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

from vidax.data import random_eval_prompts
from vidax.data.shapes import parse_caption
from vidax.eval.harness import evaluate_prompts
from vidax.metrics import subject_scores
from vidax.models.registry import is_causal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-causal")
    ap.add_argument("--random", type=int, default=24, help="fresh draws (prompts)")
    ap.add_argument("--seed", type=int, default=7, help="first seed of the draws")
    ap.add_argument("--seeds", type=int, default=1, help="videos per prompt")
    ap.add_argument("--frames", type=int, default=None)
    ap.add_argument("--attention", default="dense", help="causal models: dense or sparse")
    args = ap.parse_args()

    causal = is_causal(args.model)
    report = evaluate_prompts(
        args.model,
        prompts=random_eval_prompts(args.random, args.seed),
        seeds=args.seeds,
        num_frames=args.frames,
        **({"attention": args.attention} if causal else {}),
    )
    span = "last quarter" if causal else "whole video"
    # the figure `vidax eval` reports; its terms are read from the same frames below
    metric = "last_quarter_subject_consistency" if causal else "subject_consistency"
    print(f"{args.model}, {len(report.samples)} videos, subject consistency over the {span}")
    rows, terms_asked = [], []
    for s in report.samples:
        frames = s.frames[-(len(s.frames) // 4) :] if causal else s.frames
        asked = {o.colour for o in parse_caption(s.prompt.caption)}
        parts = subject_scores(frames * 2.0 - 1.0)
        full = s.metrics[metric]
        own = [p.score for p in parts if p.colour in asked]
        terms_asked += [
            (p.presence, p.shape_agreement, p.area_stability) for p in parts if p.colour in asked
        ]
        rows.append((len(asked), full, float(np.mean(own)) if own else 0.0, len(parts) > len(own)))
        terms = " ".join(
            f"{p.colour}{'' if p.colour in asked else '*'} p{p.presence:.2f} "
            f"s{p.shape_agreement:.2f} a{p.area_stability:.2f}"
            for p in parts
        )
        print(f"  {s.prompt.name} seed {s.seed}: {full:.3f} (asked {rows[-1][2]:.3f})  {terms}")
    r = np.array(rows, dtype=np.float64)
    print(
        f"mean {r[:, 1].mean():.3f}; over asked colours only {r[:, 2].mean():.3f}; videos with "
        f"an unasked colour track: {int(r[:, 3].sum())} of {len(r)}"
    )
    if terms_asked:
        t = np.array(terms_asked).mean(0)
        print(f"asked objects' terms: presence {t[0]:.3f}, shape {t[1]:.3f}, area {t[2]:.3f}")
    for k in sorted({int(n) for n in r[:, 0]}):
        m = r[:, 0] == k
        mean, own = r[m, 1].mean(), r[m, 2].mean()
        print(f"  {k} object(s): {int(m.sum())} videos, {mean:.3f} (asked {own:.3f})")
    print("(p presence, s shape agreement, a area stability; * a colour not asked for)")


if __name__ == "__main__":
    main()
