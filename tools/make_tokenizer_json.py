#!/usr/bin/env python3
"""Hugging Face tokenizer files from the fixture vocabularies, and the ids Hugging Face's own
libraries give for the fixture cases: the second reference of tandem's tokenizer tests.

Reads tests/fixtures/tokenizers/ (made by tools/make_tokenizer_fixtures.mjs) and writes
tests/fixtures/tokenizers/hf/:

  gpt2/tokenizer.json     transformers.GPT2TokenizerFast(vocab.json, merges.txt)
  llama3/tokenizer.json   tokenizers: BPE with ignore_merges, Split by Llama 3's pattern then
                          ByteLevel without its own split, ByteLevel decoder, special tokens
                          128000-128255, a template adding <|begin_of_text|>
  llama2/tokenizer.json   tokenizers, laid out as transformers' Llama converter writes it: BPE
                          with byte_fallback, fuse_unk and <unk>; Prepend + Replace
                          normalizer; Replace, ByteFallback, Fuse, Strip decoder; <s> template
  llama2/tokenizer.model  a SentencePiece BPE model built with sentencepiece_model_pb2: the
                          pieces in id order, score -id, <0x00>..<0xFF> as BYTE pieces,
                          byte_fallback, add_dummy_prefix, no removal of extra white space
  expected_hf.json        ids of every case of expected_node.json through these files
                          (tokenizers for the three tokenizer.json, sentencepiece for the
                          .model), without added special tokens

Needs: pip install tokenizers transformers sentencepiece protobuf
Usage: python3 tools/make_tokenizer_json.py
"""
import json
import os
import sys

from sentencepiece import SentencePieceProcessor
from sentencepiece import sentencepiece_model_pb2 as sp_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors
from transformers import GPT2TokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
OUT = os.path.join(FIX, "hf")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        text = f.read()
    assert text.endswith("\n"), path
    return text[:-1].split("\n")


def compact(name):
    vocab = {tok: i for i, tok in enumerate(lines(os.path.join(FIX, name, "vocab.txt")))}
    merges = [tuple(m.split(" ")) for m in lines(os.path.join(FIX, name, "merges.txt"))]
    assert all(len(m) == 2 for m in merges)
    return vocab, merges


def gpt2():
    """GPT-2's tokenizer.json as transformers writes it for GPT2TokenizerFast: byte-level BPE
    over vocab.json + merges.txt, <|endoftext|> (50256) special. transformers 4.x builds it
    from the two files; where a version's GPT2TokenizerFast does not take them (5.x builds an
    empty model from vocab_file/merges_file), the same pipeline is assembled with tokenizers."""
    vocab_path = os.path.join(FIX, "gpt2", "vocab.json")
    merges_path = os.path.join(FIX, "gpt2", "merges.txt")
    with open(vocab_path, encoding="utf-8") as f:
        vocab = json.load(f)
    try:
        tok = GPT2TokenizerFast(vocab_file=vocab_path, merges_file=merges_path).backend_tokenizer
        if tok.get_vocab_size() == len(vocab):
            return tok
    except Exception as e:  # noqa: BLE001 - any failure falls back to the explicit build
        print(f"gpt2: GPT2TokenizerFast(vocab_file, merges_file) failed ({e}); building it "
              "with tokenizers", file=sys.stderr)
    merges = [tuple(m.split(" ")) for m in lines(merges_path)
              if m and not m.startswith("#version")]
    assert all(len(m) == 2 for m in merges)
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="",
                             end_of_word_suffix="", fuse_unk=False))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                               use_regex=True)
    t.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    t.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False,
                                            use_regex=True)
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    assert t.token_to_id("<|endoftext|>") == 50256 and t.get_vocab_size() == len(vocab)
    return t


def llama3(specials):
    vocab, merges = compact("llama3")
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert t.token_to_id(specials[0]) == 128000 and t.token_to_id(specials[-1]) == 128255
    bos = "<|begin_of_text|>"
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                      special_tokens=[(bos, 128000)]),
    ])
    return t


def llama2():
    vocab, merges = compact("llama2")
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                             byte_fallback=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([
        decoders.Replace("▁", " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0),
    ])
    t.add_special_tokens([AddedToken(s, special=True, normalized=False)
                          for s in ("<unk>", "<s>", "</s>")])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                     special_tokens=[("<s>", 1)])
    return t


def llama2_model(path):
    pieces = lines(os.path.join(FIX, "llama2", "vocab.txt"))
    m = sp_pb2.ModelProto()
    spec = m.trainer_spec
    spec.model_type = sp_pb2.TrainerSpec.BPE
    spec.vocab_size = len(pieces)
    spec.byte_fallback = True
    spec.split_digits = True
    spec.allow_whitespace_only_pieces = True
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = 0, 1, 2, -1
    norm = m.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = True
    norm.remove_extra_whitespaces = False
    norm.escape_whitespaces = True
    for i, piece in enumerate(pieces):
        p = m.pieces.add()
        p.piece = piece
        p.score = 0.0 if i < 259 else -float(i)
        if i == 0:
            p.type = sp_pb2.ModelProto.SentencePiece.UNKNOWN
        elif i < 3:
            p.type = sp_pb2.ModelProto.SentencePiece.CONTROL
        elif i < 259:
            assert piece == "<0x%02X>" % (i - 3), piece
            p.type = sp_pb2.ModelProto.SentencePiece.BYTE
        else:
            p.type = sp_pb2.ModelProto.SentencePiece.NORMAL
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def case_text(case):
    if "text" in case:
        return case["text"]
    # The bytes as text the way every reference reads them: invalid UTF-8 becomes U+FFFD.
    return bytes.fromhex(case["hex"]).decode("utf-8", errors="replace")


def record(case, ids):
    key = "text" if "text" in case else "hex"
    return {key: case[key], "ids": list(ids)}


def main():
    with open(os.path.join(FIX, "expected_node.json"), encoding="utf-8") as f:
        node = json.load(f)
    for d in ("gpt2", "llama3", "llama2"):
        os.makedirs(os.path.join(OUT, d), exist_ok=True)
    made = {"gpt2": gpt2(), "llama3": llama3(node["llama3_specials"]), "llama2": llama2()}
    expected = {"note": "ids from tokenizers and sentencepiece (tools/make_tokenizer_json.py)"}
    for name, t in made.items():
        path = os.path.join(OUT, name, "tokenizer.json")
        t.save(path, pretty=False)
        t = Tokenizer.from_file(path)  # what the file says, not the object that wrote it
        expected[name] = [record(c, t.encode(case_text(c), add_special_tokens=False).ids)
                          for c in node[name]]
    model = os.path.join(OUT, "llama2", "tokenizer.model")
    llama2_model(model)
    sp = SentencePieceProcessor(model_file=model)
    expected["llama2_spm"] = [record(c, sp.encode(case_text(c))) for c in node["llama2"]]
    for name in ("gpt2", "llama2", "llama3"):
        differ = sum(a["ids"] != b["ids"] for a, b in zip(expected[name], node[name]))
        print(f"{name}: {len(node[name])} cases, {differ} differ from the node encoder")
    differ = sum(a["ids"] != b["ids"] for a, b in zip(expected["llama2_spm"], expected["llama2"]))
    print(f"llama2 tokenizer.model: {differ} cases differ from llama2 tokenizer.json")
    with open(os.path.join(OUT, "expected_hf.json"), "w", encoding="utf-8") as f:
        rows = []
        for key, value in expected.items():
            if isinstance(value, list):
                body = ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in value)
                rows.append(f" {json.dumps(key)}: [\n{body}\n ]")
            else:
                rows.append(f" {json.dumps(key)}: {json.dumps(value)}")
        f.write("{\n" + ",\n".join(rows) + "\n}\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
