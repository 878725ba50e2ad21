#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/tokenizer_files_fuzz.cpp into fuzz/corpus/tokenizer_files/: a
valid small GPT-2 vocabulary (the 256 byte tokens, "th", "the", " t" and their merges) in the
target's input format (encoder.json, a line "@@vocab.bpe", vocab.bpe), and the hostile files the
loader must refuse: empty files, JSON that is no object or is cut short, a duplicate token, one
token spelled twice by escapes, ids that are no permutation or no integer, a code point that is
no byte symbol, a merge of symbols that are not tokens, a merge whose result is not one, a merge
line of three symbols or cut inside a UTF-8 sequence.

usage: make_tokenizer_files_seeds.py OUT_DIR
"""
import json
import os
import sys


def byte_symbols():
    """GPT-2's bytes_to_unicode: byte -> the character that stands for it."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    codes, n = {}, 0
    for b in range(256):
        if b in printable:
            codes[b] = b
        else:
            codes[b] = 256 + n
            n += 1
    return [chr(codes[b]) for b in range(256)]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    symbols = byte_symbols()
    space = symbols[ord(" ")]
    tokens = {s: i for i, s in enumerate(symbols)}
    tokens.update({"th": 256, "the": 257, space + "t": 258})
    merges = "#version: 0.2\nt h\nth e\n" + space + " t\n"

    def encoder(extra=""):
        text = json.dumps(tokens, ensure_ascii=False)
        return (text[:-1] + extra + "}") if extra else text

    def pack(encoder_json, vocab_bpe):
        return (encoder_json + "\n@@vocab.bpe\n" + vocab_bpe).encode("utf-8", "surrogateescape")

    seeds = {
        "valid": pack(encoder(), merges),
        "encoder_empty": pack("", merges),
        "merges_empty": pack(encoder(), ""),
        "encoder_not_object": pack("[1, 2]", merges),
        "encoder_cut_short": pack(encoder()[:200], merges),
        "duplicate_token": pack(encoder(', "th": 259'), merges),
        "token_twice_by_escapes": pack(encoder(', "\\u0074h": 259'), merges),
        "ids_not_permutation": pack(encoder(', "he": 99999'), merges),
        "id_not_integer": pack(encoder(', "he": 1e300'), merges),
        "id_negative": pack(encoder(', "he": -1'), merges),
        "no_byte_symbol": pack(encoder(', "\\u4e00": 259'), merges),
        "merge_unknown_symbols": pack(encoder(), merges + "x yz\n"),
        "merge_result_unknown": pack(encoder(), merges + "h e\n"),
        "merge_three_symbols": pack(encoder(), merges + "t h e\n"),
        "merge_cut_utf8": pack(encoder(), merges + "t \udcc4\n"),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name + ".vocab"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
