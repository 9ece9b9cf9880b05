import numpy as np
import pytest

from jointspace_train.evaluation import retrieval


def test_constructed_rankings():
    # 3 images, 2 captions each: captions 0,1 -> image 0; 2,3 -> image 1; 4,5 -> image 2
    owner = np.array([0, 0, 1, 1, 2, 2])
    sims = np.array([
        [0.9, 0.1, 0.8, 0.0, 0.0, 0.0],  # image 0: its caption 0 is first -> rank 1
        [0.9, 0.8, 0.7, 0.6, 0.0, 0.0],  # image 1: best own caption (2) is third -> rank 3
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4],  # image 2: best own caption (4) is fifth -> rank 5
    ])
    assert retrieval.ranks_i2t(sims, owner).tolist() == [1, 3, 5]
    # caption j ranks images by column j: cap0 -> [0.9,0.9,0.9] ties keep image order -> image 0 rank 1
    # cap1 -> [0.1,0.8,0.8] -> image 0 rank 3; cap2 -> [0.8,0.7,0.7] -> image 1 rank 2
    # cap3 -> [0.0,0.6,0.6] -> image 1 rank 1; cap4 -> [0,0,0.5] -> rank 1; cap5 -> [0,0,0.4] -> rank 1
    assert retrieval.ranks_t2i(sims, owner).tolist() == [1, 3, 2, 1, 1, 1]
    m = retrieval.metrics(sims, owner)
    assert m["i2t_r1"] == 33.33 and m["i2t_r5"] == 100.0 and m["i2t_medr"] == 3.0
    assert m["t2i_r1"] == 66.67 and m["t2i_r5"] == 100.0 and m["t2i_medr"] == 1.0
    assert m["rsum"] == round(100 / 3 + 100 + 100 + 400 / 6 + 100 + 100, 2)


def test_median_rank_floors_like_the_papers():
    assert retrieval.summarise(np.array([1, 2, 3, 10]))[3] == 2.0  # median 2.5 -> 2
    assert retrieval.summarise(np.array([4]))[:3] == (0.0, 100.0, 100.0)


def test_hub_bias_is_minus_alpha_times_the_mean_of_the_top_k_bank_scores():
    bank = np.array([[0.9, 0.1, 0.5],
                     [0.2, 0.3, 0.4]])
    # image 0: top 2 are 0.9 and 0.5 -> mean 0.7; image 1: 0.4 and 0.3 -> 0.35
    assert np.allclose(retrieval.hub_bias(bank, 2, 0.5), [-0.35, -0.175])
    assert np.allclose(retrieval.hub_bias(bank, 1, 1.0), [-0.9, -0.4])
    for k in (0, 4):
        with pytest.raises(ValueError, match="between 1 and the bank's 3"):
            retrieval.hub_bias(bank, k, 0.5)


def test_hub_bias_returns_a_hubs_stolen_queries_and_leaves_annotation_alone():
    # image 0 is a hub: it outscores image 1 on image 1's own caption (caption 1)
    owner = np.array([0, 1])
    sims = np.array([[0.8, 0.7],
                     [0.1, 0.65]])
    assert retrieval.metrics(sims, owner)["t2i_r1"] == 50.0
    # ... and it is close to every caption of a bank; image 1 is not
    bias = retrieval.hub_bias(np.array([[0.7, 0.6, 0.6], [0.1, 0.2, 0.0]]), 2, 0.5)
    fixed = retrieval.metrics(sims + bias[:, None], owner)
    assert fixed["t2i_r1"] == 100.0
    plain = retrieval.metrics(sims, owner)
    assert {k: v for k, v in fixed.items() if k.startswith("i2t")} == \
        {k: v for k, v in plain.items() if k.startswith("i2t")}
