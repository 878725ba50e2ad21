// Long adversarial pre-tokens encoded by the reference (npm gpt-3-encoder 1.1.4):
//   node tests/golden/tokenizer/make_long_cases.js data/tokenizer > tests/golden/tokenizer/gpt2_bpe_long_cases.json
const { encode } = require(require("path").resolve(process.argv[2], "Encoder"));
let seed = 12345;
const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
const pick = (s, n) => { let o = ""; for (let i = 0; i < n; i++) o += s[Math.floor(rnd() * s.length)]; return o; };
const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
const randCps = (n) => { let o = ""; for (let i = 0; i < n; i++) { let c = Math.floor(rnd() * 0x3000); if (c >= 0xD800 && c < 0xE000) c = 0xFFFD; o += String.fromCodePoint(c); } return o; };
const cases = [
  ["random letters, no spaces", pick(letters, 3000)],
  ["lower-case letters, no spaces", pick("etaoinshrdlu", 3000)],
  ["one letter repeated", "a".repeat(2999)],
  ["two letters alternating", "ab".repeat(1500)],
  ["commas", ",".repeat(1001)],
  ["commas and dots", pick(",.,,;", 2000)],
  ["digits", pick("0123456789", 2000)],
  ["spaces", " ".repeat(1500) + "x"],
  ["random code points", randCps(1500)],
  ["U+FFFD run", "\uFFFD".repeat(700)],
  ["punctuation", pick("!?-=+*/<>[](){}'\"", 2500)],
];
const out = { source: "npm gpt-3-encoder 1.1.4 (GPT-2 byte-level BPE), tests/golden/tokenizer/make_long_cases.js",
  note: "long pre-tokens that make a quadratic merge loop slow; ids are the reference's", cases: [] };
for (const [name, text] of cases) out.cases.push({ name, text, ids: encode(text) });
process.stdout.write(JSON.stringify(out) + "\n");
