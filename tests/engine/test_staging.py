"""The staged layout of a batch (engine/staging.py): the lone-sequence template path writes exactly
what the general path writes, for every length of a layout, and leaves no word of an earlier, longer
batch behind in the slot."""
import numpy as np
import pytest

from rose_backend.engine import staging
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.staging import Layout, lone_template, stage


def general(batch, layout, pad_id, arange):
    """stage() with the template path off."""
    old = staging.LONE_TEMPLATE_MAX_TOKENS
    staging.LONE_TEMPLATE_MAX_TOKENS = 0
    try:
        out = np.full(layout.words + 7, -1, np.int32)
        stage(batch, layout, out, pad_id, arange)
        return out[:layout.words]
    finally:
        staging.LONE_TEMPLATE_MAX_TOKENS = old


@pytest.mark.parametrize("sb,tb", [(1, 64), (1, 128), (2, 512), (1, 1024)])
def test_lone_sequences_stage_as_the_general_path_does(sb, tb):
    rng = np.random.default_rng(tb)
    layout, arange = Layout(sb, tb), np.arange(tb, dtype=np.int32)
    slot = np.full(layout.words + 7, -1, np.int32)        # reused across batches, as a slot is
    for t in [tb, 1, tb // 2 + 1, tb - 1, 3]:
        batch = PackedBatch(rng.integers(5, 999, size=t, dtype=np.int32), np.array([t], np.int32))
        assert stage(batch, layout, slot, 1, arange) == layout.words
        np.testing.assert_array_equal(slot[:layout.words], general(batch, layout, 1, arange))


def test_the_template_is_cached_and_read_only():
    a, b = lone_template(1, 128, 100, 0), lone_template(1, 128, 100, 0)
    assert a is b and not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1
