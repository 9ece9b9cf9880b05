import numpy as np

from jointspace_train.text import tokenizer


def test_word_level_lowercase_punctuation_unknown(tmp_path):
    tok = tokenizer.build(["A dog runs .", "The dog's ball", "a Dog"], min_count=1)
    assert tok.token_to_id("<pad>") == 0 and tok.token_to_id("<unk>") == 1
    assert tok.token_to_id("dog") == 2  # most frequent first
    words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str("DOG, zebra!"))]
    assert words == ["dog", ",", "zebra", "!"]
    assert tok.encode("DOG, zebra! .").ids == [2, 1, 1, 1, tok.token_to_id(".")]  # unseen -> <unk>
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    assert tokenizer.load(path).encode("the dog").ids == tok.encode("the dog").ids


def test_min_count_and_padding():
    tok = tokenizer.build(["a a b", "a c"], min_count=2)
    assert tok.get_vocab_size() == 3  # <pad>, <unk>, a
    ids, lengths = tokenizer.encode_batch(tok, ["a b a", "a", ""], max_tokens=2)
    assert lengths.tolist() == [2, 1, 1]
    assert ids.tolist() == [[2, 1], [2, 0], [1, 0]]
    assert ids.dtype == np.int64
