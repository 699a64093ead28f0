"""`vidax.progress.share`: several passes reported as one run of the steps."""

import pytest

from vidax import progress


@pytest.mark.parametrize("parts", [2, 3])
def test_passes_share_one_bar(parts):
    steps, seen = 7, []
    for part in range(parts):
        report = progress.share(seen.append, steps, part, parts)
        for i in range(steps):
            report(i)
    # monotonic, every step index reported, the last one only at the very end
    assert seen == sorted(seen)
    assert set(seen) == set(range(steps))
    assert seen.index(steps - 1) == len(seen) - 1


def test_one_pass_is_the_callback_itself():
    assert progress.share(print, 5, 0, 1) is print
    assert progress.share(None, 5, 1, 2) is None
    with pytest.raises(ValueError, match="part must be in"):
        progress.share(print, 5, 2, 2)
