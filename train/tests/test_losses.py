import torch

from jointspace_train import losses


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


def test_order_similarity_by_hand():
    im = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    cap = torch.tensor([[0.2, 0.9], [1.0, 0.0]])
    s = losses.order_scores(im, cap)
    # S(c, i) = -||max(0, c - i)||^2
    expected = torch.tensor([[-(0.4**2), -(0.5**2)], [-(0.2**2), -(1.0**2)]])
    assert torch.allclose(s, expected)
    assert losses.order_scores(im, im).diag().eq(0).all()  # an image is never "above" itself
