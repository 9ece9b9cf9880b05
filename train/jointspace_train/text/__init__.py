"""The caption side: the tokenizer, GloVe vectors, the closed-form methods' caption features and their text graph,
a bundle's whole-vocabulary text graph and its int8 text graph."""
