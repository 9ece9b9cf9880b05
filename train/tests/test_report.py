"""`report --table2`: the paper's Table 2 read from the seeds file, this project's runs set beside it."""
import pytest

from jointspace_train.evaluation.report import COLUMNS, paper_table2, table2

SEEDS = """Some prose | with a bar.

| model | i2t R@1 | R@5 | R@10 | med r | t2i R@1 | R@5 | R@10 | med r |
|---|---|---|---|---|---|---|---|---|
| FC7-MH | 23.0 | 49.0 | 63.3 | 6 | 18.5 | 43.2 | 56.1 | 8 |
| FNE-MH | 27.3 | 56.8 | 69.3 | 4 | 21.2 | 47.1 | 59.7 | 6 |
| FNE-SOE | 24.0 | 52.4 | 63.9 | 5 | 18.7 | 44.2 | 57.7 | 7 |
"""


def run(loss, inp, dev, r1, crop="ten", **settings):
    test = dict(zip(COLUMNS, (r1, 50.0, 60.0, 5, r1 - 5, 40.0, 50.0, 8)))
    test["rsum"] = sum(v for k, v in test.items() if "medr" not in k)
    return {"settings": {"loss": loss, "image_input": inp, **settings},
            "features": {"input": inp, "crop": crop, "tap_point": "post_relu"},
            "dev": {"rsum": dev}, "test": test, "command": f"python -m jointspace_train train --loss {loss}"}


def test_the_papers_rows_are_read_with_their_rsum():
    rows = paper_table2(SEEDS)
    assert set(rows) == {("FC7", "MH"), ("FNE", "MH"), ("FNE", "SOE")}
    assert rows[("FNE", "MH")]["t2i_r1"] == 21.2 and rows[("FNE", "MH")]["i2t_medr"] == 4
    assert rows[("FNE", "MH")]["rsum"] == 281.4  # the six recalls, not the medians
    with pytest.raises(ValueError, match="not 8"):
        paper_table2("| FNE-MH | 27.3 | 56.8 |")
    with pytest.raises(ValueError, match="no Table 2 rows"):
        paper_table2("nothing here")


def test_runs_sit_beside_the_paper_with_fne_minus_the_baseline():
    results = {"runs/last-mh": run("MH", "l2-last", 240.0, 20.0), "runs/fne-mh": run("MH", "fne", 250.5, 23.5),
               "runs/fne-soe": run("SOE", "fne", 230.0, 21.0)}
    lines = table2(paper_table2(SEEDS), results).splitlines()
    labels = [line.split(" | ")[0][2:] for line in lines[2:]]
    assert labels == ["MH, the paper's FC7", "MH, single layer (last-mh: ten crop, post_relu)", "MH, the paper's FNE",
                      "MH, FNE (fne-mh: ten crop, post_relu)", "MH, FNE minus single layer (fne-mh - last-mh)",
                      "SOE, the paper's FNE", "SOE, FNE (fne-soe: ten crop, post_relu)"]
    delta = lines[2 + labels.index("MH, FNE minus single layer (fne-mh - last-mh)")].split(" | ")
    assert delta[1] == "+10.5"  # dev rsum
    assert delta[2] == "+3.5" and delta[6] == "+3.5" and delta[10] == "+7.0"  # i2t R@1, t2i R@1, test rsum
    assert "`python -m jointspace_train train --loss MH`" in lines[2 + labels.index("MH, FNE (fne-mh: ten crop, "
                                                                                  "post_relu)")]


def test_fne_is_set_against_a_baseline_only_under_the_same_settings():
    results = {"runs/last-center": run("PH", "l2-last", 240.0, 20.0, crop="center"),
               "runs/last-ten": run("PH", "l2-last", 244.0, 21.0),
               "runs/fne-ten": run("PH", "fne", 250.0, 23.0),
               "runs/fne-ten-lr": run("PH", "fne", 251.0, 23.5, lr=1e-4)}
    lines = table2(paper_table2(SEEDS), results).splitlines()
    deltas = [line.split(" | ")[0][2:] for line in lines if "minus" in line]
    # the centre-crop baseline and the run with another learning rate have no partner
    assert deltas == ["PH, FNE minus single layer (fne-ten - last-ten)"]


def test_a_ce_run_and_its_caption_encoder_are_labelled():
    results = {"runs/ce-glove": run("CE", "fne", 250.0, 23.0, rnn="lstm", word_init="glove100", word_dim=100)}
    lines = table2(paper_table2(SEEDS), results).splitlines()
    ce = [line for line in lines if line.startswith("| CE")]
    assert len(ce) == 1
    assert ce[0].startswith("| CE, FNE (ce-glove: ten crop, post_relu, LSTM, glove100 words to 100-d) | 250.0 |")


def test_runs_that_ran_to_other_caps_are_paired_and_say_how_long_they_ran():
    # a baseline closed at a time limit (its cap lowered to the epoch it stopped at) beside an FNE run that
    # stopped on its own patience under the paper's cap
    closed = run("PH", "l2-last", 255.9, 21.7, epochs=177)
    closed.update(history=[{"epoch": e} for e in range(1, 178)], best_epoch=165)
    stopped = run("PH", "fne", 247.7, 23.5, epochs=200)
    stopped.update(history=[{"epoch": e} for e in range(1, 159)], best_epoch=148)
    lines = table2(paper_table2(SEEDS), {"runs/last-ph": closed, "runs/fne-ph": stopped}).splitlines()
    labels = [line.split(" | ")[0][2:] for line in lines[2:] if line.startswith("| PH")]
    assert labels == ["PH, single layer (last-ph: ten crop, post_relu, 177 epochs, best 165, at its cap)",
                      "PH, FNE (fne-ph: ten crop, post_relu, 158 epochs, best 148)",
                      "PH, FNE minus single layer (fne-ph - last-ph)"]
    assert lines[-1].split(" | ")[1] == "-8.2"
