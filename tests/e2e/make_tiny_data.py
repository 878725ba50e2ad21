#!/usr/bin/env python3
"""Writes the tiny config's token shards: a learnable synthetic language.

A fixed random dictionary of "words" (2-5 token ids each, ids < vocab) is chained by a random
first-order Markov transition table with a few likely successors per word, so a small model can
learn both the spelling of words and which word comes next. Shards use the llm.c format: 256
int32 header (magic 20240520, version 1, token count), then uint16 tokens.

usage: make_tiny_data.py OUT_DIR [--train-tokens N] [--val-tokens N] [--vocab V] [--seed S]
"""
import argparse
import os
import random
import struct


def write_shard(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
    os.replace(tmp, path)


def language(vocab, seed, words=48, successors=3):
    rng = random.Random(seed)
    dictionary = [[rng.randrange(1, vocab) for _ in range(rng.randint(2, 5))] for _ in range(words)]
    table = [rng.sample(range(words), successors) for _ in range(words)]
    return rng, dictionary, table


def stream(rng, dictionary, table, n):
    out, w = [], 0
    while len(out) < n:
        out.extend(dictionary[w])
        w = rng.choice(table[w])
    return out[:n]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--train-tokens", type=int, default=40000)
    p.add_argument("--val-tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    rng, dictionary, table = language(a.vocab, a.seed)
    write_shard(os.path.join(a.out_dir, "tiny_train_000000.bin"),
                stream(rng, dictionary, table, a.train_tokens))
    write_shard(os.path.join(a.out_dir, "tiny_val_000000.bin"),
                stream(rng, dictionary, table, a.val_tokens))


if __name__ == "__main__":
    main()
