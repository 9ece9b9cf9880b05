import numpy as np

from jointspace_train import evaluate


def test_constructed_rankings():
    # 3 images, 2 captions each: captions 0,1 -> image 0; 2,3 -> image 1; 4,5 -> image 2
    owner = np.array([0, 0, 1, 1, 2, 2])
    sims = np.array([
        [0.9, 0.1, 0.8, 0.0, 0.0, 0.0],  # image 0: its caption 0 is first -> rank 1
        [0.9, 0.8, 0.7, 0.6, 0.0, 0.0],  # image 1: best own caption (2) is third -> rank 3
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4],  # image 2: best own caption (4) is fifth -> rank 5
    ])
    assert evaluate.ranks_i2t(sims, owner).tolist() == [1, 3, 5]
    # caption j ranks images by column j: cap0 -> [0.9,0.9,0.9] ties keep image order -> image 0 rank 1
    # cap1 -> [0.1,0.8,0.8] -> image 0 rank 3; cap2 -> [0.8,0.7,0.7] -> image 1 rank 2
    # cap3 -> [0.0,0.6,0.6] -> image 1 rank 1; cap4 -> [0,0,0.5] -> rank 1; cap5 -> [0,0,0.4] -> rank 1
    assert evaluate.ranks_t2i(sims, owner).tolist() == [1, 3, 2, 1, 1, 1]
    m = evaluate.metrics(sims, owner)
    assert m["i2t_r1"] == 33.33 and m["i2t_r5"] == 100.0 and m["i2t_medr"] == 3.0
    assert m["t2i_r1"] == 66.67 and m["t2i_r5"] == 100.0 and m["t2i_medr"] == 1.0
    assert m["rsum"] == round(100 / 3 + 100 + 100 + 400 / 6 + 100 + 100, 2)


def test_median_rank_floors_like_the_papers():
    assert evaluate.summarise(np.array([1, 2, 3, 10]))[3] == 2.0  # median 2.5 -> 2
    assert evaluate.summarise(np.array([4]))[:3] == (0.0, 100.0, 100.0)
