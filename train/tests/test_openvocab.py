"""The open-vocabulary benchmark's gallery and measures (openvocab.py; scripts/openvocab.sh)."""
from pathlib import Path

from PIL import Image

from jointspace_train.evaluation.openvocab import (
    english_description,
    first_sentence,
    flatten,
    recall_table,
    shop_name,
    stamps,
    summarise,
)


def test_the_english_line_is_the_one_that_is_not_a_translation():
    text = "An apricot.\nach.utf8=Nyig yat apricot.\nca@valencia.utf8=Un albercoc.\nen_GB.utf8=An apricot.\n"
    assert english_description(text) == "An apricot."
    assert english_description("fr.utf8=Un abricot.\n\n  A pear.  \n") == "A pear."
    assert english_description("de.utf8=Eine Birne.\n") == ""


def test_the_first_sentence_ends_at_a_stop_and_a_space():
    assert first_sentence("A chocolate easter egg. Yum!") == "A chocolate easter egg."
    assert first_sentence("Fire! Fire! Fire!") == "Fire!"
    assert first_sentence("A US 1 cent piece ($.01) called a penny.") == "A US 1 cent piece ($.01) called a penny."
    assert first_sentence("Hard candy\u2014yum!") == "Hard candy\u2014yum!"
    assert first_sentence("Pedestrian Crossing (\u201cPED XING\u201d). Look both ways.") == \
        "Pedestrian Crossing (\u201cPED XING\u201d)."
    assert first_sentence("Is it a bird? No.") == "Is it a bird?"


def test_a_shop_name_is_the_file_names_words_without_sort_numbers():
    assert shop_name("050kennedy-halfdollar") == "Kennedy halfdollar"
    assert shop_name("chineseJunk") == "Chinese junk"
    assert shop_name("Candy_cane_photo_2") == "Candy cane photo"
    assert shop_name("T_filled") == "T filled"
    assert shop_name("asl_zzz_6") == "Asl zzz"
    assert shop_name("1") == "1"                      # nothing but a number: kept
    assert shop_name("yen500") == "Yen"
    assert shop_name("USB_cable") == "USB cable"      # an acronym keeps its capitals


def write_stamp(folder: Path, stem: str, text: str | None, kinds=(".png",)):
    folder.mkdir(parents=True, exist_ok=True)
    for k in kinds:
        if k == ".png":
            Image.new("RGBA", (20, 20), (255, 0, 0, 255)).save(folder / f"{stem}.png")
        else:
            (folder / f"{stem}{k}").write_text("<svg/>")
    if text is not None:
        (folder / f"{stem}.txt").write_text(text, encoding="utf-8")


def test_stamps_pairs_pngs_with_descriptions_and_gives_unique_ids(tmp_path):
    write_stamp(tmp_path / "animals/cats", "lion", "A lion. King of beasts.\nfr.utf8=Un lion.")
    write_stamp(tmp_path / "animals/cats", "lion-2", "A lion cub.")
    write_stamp(tmp_path / "animals/zz", "lion", "A lion.")
    write_stamp(tmp_path / "food", "pear", "A pear.", kinds=(".png", ".svg"))   # both: the PNG is kept
    write_stamp(tmp_path / "food", "plum", "A plum.", kinds=(".svg",))          # SVG only: left out
    write_stamp(tmp_path / "food", "nut", None)                                 # no description
    write_stamp(tmp_path / "food", "fig", "fr.utf8=Une figue.\n")               # no English line
    (tmp_path / "food/orphan.txt").write_text("A description without a picture.")
    rows, skipped = stamps(tmp_path)
    assert [(r["external_id"], r["path"], r["query"], r["name"], r["category"]) for r in rows] == [
        ("lion-2", "animals/cats/lion-2.png", "A lion cub.", "Lion", "animals"),   # path order: "-" before "."
        ("lion", "animals/cats/lion.png", "A lion.", "Lion", "animals"),
        ("lion-3", "animals/zz/lion.png", "A lion.", "Lion", "animals"),   # "lion-2" was taken
        ("pear", "food/pear.png", "A pear.", "Pear", "food")]
    assert rows[1]["description"] == "A lion. King of beasts."
    assert dict(skipped) == {"svg only": 1, "no picture": 1, "empty description": 1, "png without description": 1}


def test_flatten_puts_transparency_on_white_and_pads_a_thin_picture(tmp_path):
    im = Image.new("RGBA", (40, 7), (0, 0, 0, 0))
    im.putpixel((0, 0), (255, 0, 0, 255))
    im.putpixel((1, 0), (0, 0, 255, 128))
    im.save(tmp_path / "thin.png")
    assert flatten(tmp_path / "thin.png", tmp_path / "out.png") == (40, 16)
    out = Image.open(tmp_path / "out.png")
    assert out.mode == "RGB" and out.size == (40, 16)
    assert out.getpixel((0, 4)) == (255, 0, 0)               # 4 rows of white above: centred
    assert out.getpixel((1, 4)) in ((127, 127, 255), (128, 128, 255))  # half blue over white
    assert out.getpixel((5, 5)) == (255, 255, 255) and out.getpixel((0, 0)) == (255, 255, 255)


def test_recall_counts_a_picture_not_returned_as_last():
    inf = float("inf")
    r = recall_table([1, 2, 6, 11, inf])
    assert r == {"r@1": 20.0, "r@5": 40.0, "r@10": 60.0, "median_rank": 6, "not_returned": 1}
    assert recall_table([1, 2, 3, 4])["median_rank"] == 2.5
    assert recall_table([1, inf, inf])["median_rank"] is None


def test_the_summary_counts_unknown_words_with_and_without_punctuation():
    rows = [{"external_id": e, "query": q, "category": c} for e, q, c in
            (("a", "A gnu.", "animals"), ("b", "A cent ($.01).", "symbols"), ("c", "A dog.", "animals"))]
    res = [{"external_id": "a", "rank": 1, "rank_same_text": 1, "unknown_words": ["gnu"]},
           {"external_id": "b", "rank": float("inf"), "rank_same_text": float("inf"), "unknown_words": ["($."]},
           {"external_id": "c", "rank": 12, "rank_same_text": 12, "unknown_words": []}]
    s = summarise(rows, {"vector": res})
    assert (s["queries_with_unknown_word"], s["queries_with_unknown_letter_word"]) == (2, 1)
    assert s["modes"]["vector"]["r@10"] == 33.33 and s["modes"]["vector"]["median_rank"] == 12
    assert s["modes"]["vector"]["without_symbols"]["r@1"] == 50.0
    assert s["modes"]["vector"]["by_category_r@10"] == {"animals": 50.0, "symbols": 0.0}
