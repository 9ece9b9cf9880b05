import numpy as np
import torch

from jointspace_train.training import losses


def test_sum_and_max_of_hinges_by_hand():
    # s[i, j]: image i with caption j; diagonal = true pairs
    s = torch.tensor([[0.5, 0.4, 0.1], [0.6, 0.2, 0.0], [0.3, 0.1, 0.9]])
    m = 0.2
    # image anchors (rows): row0: [0.1, 0]; row1: [0.6, 0.0]; row2: [0, 0]
    # caption anchors (cols): col0: [0.3, 0]; col1: [0.4, 0.1]; col2: [0, 0]
    assert torch.isclose(losses.contrastive(s, m, hardest=False), torch.tensor(0.1 + 0.6 + 0.3 + 0.4 + 0.1))
    # hardest per anchor: rows 0.1, 0.6, 0; cols 0.3, 0.4, 0
    assert torch.isclose(losses.contrastive(s, m, hardest=True), torch.tensor(0.1 + 0.6 + 0.3 + 0.4))


def test_perfect_separation_costs_nothing():
    s = torch.eye(4) + 0.0
    assert losses.contrastive(s, 0.2, hardest=True) == 0
    assert losses.contrastive(s, 0.2, hardest=False) == 0


def test_infonce_by_hand():
    s = torch.tensor([[0.5, 0.1], [0.3, 0.2]])
    t = 0.1
    e = torch.exp(s / t)
    rows = -torch.log(e[0, 0] / e[0].sum()) - torch.log(e[1, 1] / e[1].sum())
    cols = -torch.log(e[0, 0] / e[:, 0].sum()) - torch.log(e[1, 1] / e[:, 1].sum())
    assert torch.isclose(losses.infonce(s, t), rows + cols)
    assert torch.isclose(losses.batch_loss("CE", s, 0.2, t, hardest=True), rows + cols)
    # well separated pairs under a sharp temperature cost (almost) nothing
    assert losses.infonce(torch.eye(3), 0.01) < 1e-6


def test_order_similarity_by_hand():
    im = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    cap = torch.tensor([[0.2, 0.9], [1.0, 0.0]])
    s = losses.order_scores(im, cap)
    # S(c, i) = -||max(0, c - i)||^2
    expected = torch.tensor([[-(0.4**2), -(0.5**2)], [-(0.2**2), -(1.0**2)]])
    assert torch.allclose(s, expected)
    assert losses.order_scores(im, im).diag().eq(0).all()  # an image is never "above" itself


def test_blocked_order_scores_equal_the_plain_ones():
    g = torch.Generator().manual_seed(0)
    # Sizes that are not multiples of the blocks, so the ragged last blocks are covered.
    im, cap = torch.rand(19, 7, generator=g), torch.rand(131, 7, generator=g)
    assert torch.allclose(losses.order_scores_blocked(im, cap, block=(8, 64)), losses.order_scores(im, cap))
    # The bundle-side reference (numpy in, numpy out) uses the same scores.
    from jointspace_train.bundle.pipeline import similarities

    assert np.allclose(similarities(im.numpy(), cap.numpy(), "order"), losses.order_scores(im, cap).numpy())


def test_order_scores_in_rows_equal_the_blocked_ones():
    g = torch.Generator().manual_seed(0)
    im, cap = torch.rand(37, 12, generator=g), torch.rand(53, 12, generator=g)
    want = losses.order_scores_blocked(im, cap)
    got = losses.order_scores_rows(im, cap, "cpu", rows=5)
    torch.testing.assert_close(got, want)
    assert not torch.equal(losses.order_scores_rows(cap[:37], im, "cpu"), want)
